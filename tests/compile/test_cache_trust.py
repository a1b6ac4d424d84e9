"""Attacks on the persistent cache's files, each defended, and the function still right afterwards.

Entries are bound to their keys (a moved, renamed or swapped entry is a miss and
is rebuilt), a loaded executable that does not fit its call is evicted, every
directory level is checked, and an entry that is not a private regular file (a
FIFO, a symlink, a directory, a group-writable file) is a miss that never hangs.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile import cache, compilers, executable_codec, store
from jaxaot.errors import CacheWarning
from reliability.hostile import deadline

CALLS = {"compile": 0}


def counting_xla(closed, avals, **kwargs):
    CALLS["compile"] += 1
    return compilers.xla(closed, avals, **kwargs)


@pytest.fixture
def secure_cache(tmp_path):
    with jaxaot.config.override(cache_dir=str(tmp_path / "cache"), cache_key_file=str(tmp_path / "keys" / "key")):
        _reset()
        yield tmp_path / "cache" / f"jaxaot-v{store.FORMAT_VERSION}"
    cache.reset_stats()


def _reset():
    cache.reset_stats()
    CALLS["compile"] = 0


def _entries(root: Path, kind: str = "executables") -> set[Path]:
    return set((root / kind).glob("*.bin"))


def _infer(fn, x):
    """``fn(x)`` through a fresh AOTFunction: the inference program only."""
    return jaxaot.aot_function(fn, fw_compiler=counting_xla)(x)


def loss(w, x):
    return jnp.sum(jnp.sin(x @ w) ** 2)


def _inputs():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((5, 3), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((4, 5), dtype=np.float32)))


def _train():
    """Value and gradients of a fresh AOTFunction (a partition, a forward and a backward), checked against JAX."""
    w, x = _inputs()
    got = jax.value_and_grad(jaxaot.aot_function(loss, fw_compiler=counting_xla), argnums=(0, 1))(w, x)
    want = jax.value_and_grad(loss, argnums=(0, 1))(w, x)
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    return got


def _cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def _sin(x):
    return jnp.sin(x)


def _cos(x):
    return jnp.cos(x)


# --------------------------------------------------------------------------- entries bound to their keys
def _one_entry_each(root: Path, x_sin, x_cos) -> tuple[Path, Path]:
    _infer(_sin, x_sin)
    (a,) = _entries(root)
    _infer(_cos, x_cos)
    (b,) = _entries(root) - {a}
    return a, b


def test_swapped_entries_are_misses_rebuilt_and_never_run(secure_cache):
    x = jnp.linspace(0.0, 1.0, 8)
    a, b = _one_entry_each(secure_cache, x, x)
    # The attack: swap sin's and cos's compiled programs (same shapes, both validly signed).
    tmp = a.with_suffix(".swap")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    _reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ys, yc = _infer(_sin, x), _infer(_cos, x)
    np.testing.assert_allclose(ys, np.sin(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(yc, np.cos(np.asarray(x)), rtol=1e-6)
    messages = _cache_warnings(caught)
    assert len(messages) == 2 and all("moved, renamed or swapped" in m for m in messages), messages
    assert cache.stats().executable_hits == 0 and cache.stats().corrupt == 2 and CALLS["compile"] == 2
    _reset()  # rebuilt in place: hits, still right
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        np.testing.assert_allclose(_infer(_sin, x), np.sin(np.asarray(x)), rtol=1e-6)
        np.testing.assert_allclose(_infer(_cos, x), np.cos(np.asarray(x)), rtol=1e-6)
    assert cache.stats().executable_hits == 2 and CALLS["compile"] == 0


def test_swapped_entries_of_other_shapes_are_rebuilt_not_raised_forever(secure_cache):
    big, small = jnp.linspace(0.0, 1.0, 1000), jnp.linspace(0.0, 1.0, 4)
    a, b = _one_entry_each(secure_cache, big, small)
    tmp = a.with_suffix(".swap")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    for _ in range(2):  # every later call (and process) works: the entries were rebuilt
        _reset()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            np.testing.assert_allclose(_infer(_sin, big), np.sin(np.asarray(big)), rtol=1e-6)
            np.testing.assert_allclose(_infer(_cos, small), np.cos(np.asarray(small)), rtol=1e-6)
    assert cache.stats().executable_hits == 2


def test_an_executable_that_does_not_fit_its_call_is_evicted_and_rebuilt(secure_cache):
    # Defence in depth: an entry signed for the right key that holds another program (what a
    # key collision, or a bug in the key, would store) is caught by its own types.
    big, small = jnp.linspace(0.0, 1.0, 1000), jnp.linspace(0.0, 1.0, 4)
    a, b = _one_entry_each(secure_cache, big, small)
    a.write_bytes(store.frame(store.unframe(b.read_bytes(), store.entry_name(b)), store.entry_name(a)))
    _reset()
    with pytest.warns(CacheWarning, match=r"does not fit its call: its input 0 is float32\[4\], the program's is "
                                          r"float32\[1000\]"):
        np.testing.assert_allclose(_infer(_sin, big), np.sin(np.asarray(big)), rtol=1e-6)
    assert cache.stats().corrupt == 1 and cache.stats().executable_misses == 1 and CALLS["compile"] == 1
    exe = executable_codec.decode(store.unframe(a.read_bytes(), store.entry_name(a)))
    assert [tuple(v.shape) for v in jax.tree_util.tree_leaves(exe.in_avals)] == [(1000,)]
    _reset()
    np.testing.assert_allclose(_infer(_sin, big), np.sin(np.asarray(big)), rtol=1e-6)
    assert cache.stats().executable_hits == 1 and CALLS["compile"] == 0


# --------------------------------------------------------------------------- every directory level
@pytest.mark.parametrize("kind", store.KINDS)
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_every_directory_level_is_checked(secure_cache, kind, mode):
    expected = _train()
    d = secure_cache / kind
    d.chmod(mode)  # now anyone could rename entries there
    _reset()
    try:
        with pytest.warns(CacheWarning, match=rf"refusing to use .*{kind}: it is writable by (group|others)"):
            got = _train()
    finally:
        d.chmod(0o700)
    np.testing.assert_array_equal(got[0], expected[0])
    hits = cache.stats().executable_hits if kind == "executables" else cache.stats().partition_hits
    assert hits == 0 and cache.stats().skipped >= 1
    _reset()
    _train()
    assert cache.stats() == cache.CacheStats(partition_hits=1, executable_hits=2) and CALLS["compile"] == 0


@pytest.mark.parametrize("kind", store.KINDS)
def test_a_symlinked_directory_below_the_cache_is_refused(secure_cache, kind, tmp_path):
    _train()
    elsewhere = tmp_path / "elsewhere"
    (secure_cache / kind).rename(elsewhere)
    (secure_cache / kind).symlink_to(elsewhere)
    _reset()
    with pytest.warns(CacheWarning, match=rf"{kind}: it is a symlink, not a directory"):
        _train()
    assert cache.stats().skipped >= 1 and cache.stats().corrupt == 0


# --------------------------------------------------------------------------- entries that are not regular files
def _plant(p: Path, how: str, tmp_path: Path) -> None:
    if how == "fifo":
        p.unlink()
        os.mkfifo(p)
    elif how == "symlink":  # to a copy of its own valid entry: verifies, but only through a symlink
        copy = tmp_path / f"copy-{p.name}"
        copy.write_bytes(p.read_bytes())
        p.unlink()
        p.symlink_to(copy)
    elif how == "directory":
        p.unlink()
        p.mkdir()
    elif how == "full_directory":
        p.unlink()
        p.mkdir()
        (p / "kept").write_bytes(b"not ours")
    elif how == "group_writable":
        p.chmod(0o660)


@pytest.mark.parametrize("how", ["fifo", "symlink", "directory", "full_directory", "group_writable"])
def test_entries_that_are_not_private_regular_files_are_misses_that_never_hang(secure_cache, how, tmp_path):
    expected = _train()
    entries = sorted(_entries(secure_cache))
    assert len(entries) == 2
    for p in entries:
        _plant(p, how, tmp_path)
    _reset()
    with deadline(60), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _train()
    np.testing.assert_array_equal(got[0], expected[0])
    messages = _cache_warnings(caught)
    assert cache.stats().corrupt == 2 and cache.stats().executable_hits == 0 and CALLS["compile"] == 2
    assert sum("not a regular file" in m or "writable by group" in m for m in messages) == 2, messages
    if how == "full_directory":  # a folder with something in it is not removed: the call still runs, uncached
        assert any("cannot write" in m for m in messages) and all((p / "kept").exists() for p in entries)
        return
    for p in entries:  # replaced by a private regular file, signed for its key
        assert p.is_file() and not p.is_symlink() and store.unframe(p.read_bytes(), store.entry_name(p))
    _reset()
    _train()
    assert cache.stats().executable_hits == 2 and CALLS["compile"] == 0
