"""Saving an artifact: a re-save replaces the folder whole, an interrupted one leaves the old artifact loadable.

The attack (or accident): a save killed half-way through a re-save left new
programs beside the old manifest, and the artifact would not load; temporary
files of killed writers stayed forever.
"""

from __future__ import annotations

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.files import STALE_SECONDS, atomic_write, writing
from jaxaot._src.artifacts import manifest, signing
from jaxaot.errors import InvalidInputError, InvalidValueError


def _sin(x):
    return jnp.sum(jnp.sin(x))


def _cos(x):
    return jnp.sum(jnp.cos(x))


X = jnp.linspace(0.0, 1.0, 3)


def _loads_as(d, fn) -> None:
    f = jaxaot.export.load(d)
    np.testing.assert_allclose(f(X), fn(X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(X), jax.grad(fn)(X), rtol=1e-6)


@pytest.mark.parametrize("exchange", [True, False], ids=["swapped", "renamed-aside"])
def test_a_re_save_replaces_the_whole_folder(tmp_path, monkeypatch, exchange):
    if not exchange:  # systems without an atomic swap of two folders
        monkeypatch.setattr(writing, "_exchange", lambda a, b: False)
    d = jaxaot.export.export(_sin, X).save(tmp_path / "art", key=b"k" * 16)
    assert (d / signing.SIGNATURE).exists()
    jaxaot.export.export(_cos, X).save(d)
    _loads_as(d, _cos)
    assert not (d / signing.SIGNATURE).exists()  # nothing of the old version is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_an_interrupted_re_save_leaves_the_old_artifact_loadable(tmp_path, monkeypatch):
    d = jaxaot.export.export(_sin, X).save(tmp_path / "art")
    real, written = manifest.atomic_write, []

    def dies_after_two(path, data, **kw):  # a save killed while writing its files
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(path)
        real(path, data, **kw)

    monkeypatch.setattr(manifest, "atomic_write", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        jaxaot.export.export(_cos, X).save(d)
    monkeypatch.undo()
    assert written and all(p.parent != d for p in written)  # the new files went to a fresh folder
    _loads_as(d, _sin)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_a_killed_save_s_folder_is_swept_after_an_hour(tmp_path):
    d = jaxaot.export.export(_sin, X).save(tmp_path / "art")
    old = tmp_path / ".art.jaxaot-0123456789abcdef.tmp"  # what a save killed by SIGKILL leaves
    young = tmp_path / ".art.jaxaot-fedcba9876543210.tmp"
    mine = tmp_path / ".art.backup.tmp"  # not jaxaot's: never touched
    for p in (old, young, mine):
        p.mkdir()
        (p / "forward.jaxexport").write_bytes(b"partial")
    hour_ago = time.time() - STALE_SECONDS - 60
    for p in (old, mine):
        os.utime(p, (hour_ago, hour_ago))
    jaxaot.export.export(_cos, X).save(d)
    assert not old.exists() and young.exists() and mine.exists()
    _loads_as(d, _cos)


def test_saving_over_a_folder_of_other_files_is_refused_and_keeps_them(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(InvalidValueError, match=r"holds files that would be lost \(notes.txt\)"):
        jaxaot.export.export(_sin, X).save(d)
    assert [p.name for p in d.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("mine")
    with pytest.raises(InvalidValueError, match="not a folder"):
        jaxaot.export.export(_sin, X).save(tmp_path / "file")
    with pytest.raises(InvalidValueError, match=r"file is a file, not a folder"):
        jaxaot.export.export(_sin, X).save(tmp_path / "file" / "below")
    assert (tmp_path / "file").read_text() == "mine"


def test_saving_into_an_empty_folder_keeps_its_mode(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o755)
    jaxaot.export.export(_sin, X).save(d)
    assert d.stat().st_mode & 0o777 == 0o755
    _loads_as(d, _sin)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_an_artifact_s_files_get_the_mode_the_umask_gives_while_cache_entries_stay_private(umask, tmp_path):
    """An artifact is made to be shared: its folder and files are as ``mkdir`` and ``open`` make them under the
    umask. The persistent cache's entries, which no one else should read, stay 0600."""
    old = os.umask(umask)
    try:
        d = jaxaot.export.export(_sin, X).save(tmp_path / "model")
        atomic_write(tmp_path / "private", b"entry")
    finally:
        os.umask(old)
    assert d.stat().st_mode & 0o777 == 0o777 & ~umask
    assert {p.name: p.stat().st_mode & 0o777 for p in d.iterdir()} == {p.name: 0o666 & ~umask for p in d.iterdir()}
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o600
    _loads_as(d, _sin)


def test_saving_through_a_symlink_makes_the_folder_it_names_anew(tmp_path):
    real = jaxaot.export.export(_sin, X).save(tmp_path / "v1")
    (tmp_path / "current").symlink_to(real)
    jaxaot.export.export(_cos, X).save(tmp_path / "current")
    assert (tmp_path / "current").is_symlink()
    _loads_as(real, _cos)


def _meanwhile(monkeypatch, other_writer):
    """Run ``other_writer()`` once, while this save fills its fresh folder: between that folder's making and
    its swap into place, as a concurrent save of the same path can."""
    real, done = manifest.atomic_write, []

    def write(path, data, **kw):
        if not done:
            done.append(True)
            other_writer()
        real(path, data, **kw)

    monkeypatch.setattr(manifest, "atomic_write", write)


@pytest.mark.parametrize("exchange", [True, False], ids=["swapped", "renamed-aside"])
def test_two_saves_racing_for_a_new_path_both_succeed_and_the_last_wins(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(writing, "_exchange", lambda a, b: False)
    d = tmp_path / "art"
    _meanwhile(monkeypatch, lambda: jaxaot.export.export(_cos, X).save(d))  # the other save finishes first
    assert jaxaot.export.export(_sin, X).save(d) == d
    monkeypatch.undo()
    _loads_as(d, _sin)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no temporaries left behind


def test_a_folder_of_the_user_s_appearing_during_a_save_is_refused_and_kept(tmp_path, monkeypatch):
    d = tmp_path / "art"

    def user_makes_it():
        d.mkdir()
        (d / "notes.txt").write_text("mine")

    _meanwhile(monkeypatch, user_makes_it)
    with pytest.raises(InvalidValueError, match=r"holds files that would be lost \(notes.txt\)"):
        jaxaot.export.export(_sin, X).save(d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"] and [p.name for p in d.iterdir()] == ["notes.txt"]


def test_concurrent_saves_of_one_path_all_succeed(tmp_path):
    exported = [jaxaot.export.export(fn, X) for fn in (_sin, _cos)]
    for i in range(3):
        d, barrier, failures = tmp_path / f"a{i}", threading.Barrier(2), []

        def save(exp, d=d, barrier=barrier, failures=failures):
            barrier.wait()
            try:
                exp.save(d)
            except Exception as err:  # noqa: BLE001 - any failure is the finding
                failures.append(err)

        threads = [threading.Thread(target=save, args=(exp,)) for exp in exported]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not failures
        jaxaot.export.load(d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a0", "a1", "a2"]


def test_re_saving_over_a_read_only_folder_fills_a_writable_one_and_keeps_the_mode(tmp_path, monkeypatch):
    d = jaxaot.export.export(_sin, X).save(tmp_path / "art")
    d.chmod(0o555)
    real, modes = manifest.atomic_write, []

    def write(path, data, **kw):  # the mode of the folder being filled (root writes anywhere: look, do not try)
        modes.append(path.parent.stat().st_mode & 0o777)
        real(path, data, **kw)

    monkeypatch.setattr(manifest, "atomic_write", write)
    try:
        jaxaot.export.export(_cos, X).save(d)
    finally:
        mode = d.stat().st_mode & 0o777
        d.chmod(0o755)
    assert modes and all(m & 0o700 == 0o700 for m in modes), [oct(m) for m in modes]
    assert mode == 0o555
    _loads_as(d, _cos)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


@pytest.mark.parametrize("path, msg", [
    (None, r"save: path must be the folder to write \(a str or os.PathLike.*got NoneType"),
    (3, r"save: path must be the folder to write .*got int"),
    ("", r"save: path must name the folder to write .*got ''"),
    (".", r"save: path must name the folder to write .*got '\.'"),
    ("a/..", r"save: path must name the folder to write .*got 'a/\.\.'"),
])
def test_save_to_a_path_that_names_no_folder_says_what_to_pass(tmp_path, monkeypatch, path, msg):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match=msg):
        jaxaot.export.export(_sin, X).save(path)
    assert list(tmp_path.iterdir()) == []
