"""The persistent cache's files: location, framing, atomic writes."""

from __future__ import annotations

import jaxaot
from jaxaot._src.config import Config
from jaxaot._src.compile import store


def test_cache_dir_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("JAXAOT_CACHE_DIR", "/some/where")
    assert Config().cache_dir == "/some/where"
    monkeypatch.delenv("JAXAOT_CACHE_DIR")
    assert Config().cache_dir is None


def test_cache_root_follows_config(tmp_path):
    with jaxaot.config.override(cache_dir=None):
        assert store.cache_root() is None
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        assert store.cache_root() == tmp_path / f"jaxaot-v{store.FORMAT_VERSION}"


class _Flipping:
    """A config whose ``cache_dir`` another thread turns off right after each read: code that reads it twice
    sees a folder, then None."""

    def __init__(self, folder):
        self.folder, self.reads = folder, 0

    def __getattr__(self, name):
        return getattr(jaxaot.config, name)

    @property
    def cache_dir(self):
        self.reads += 1
        return self.folder if self.reads % 2 else None


def test_the_cache_folder_is_read_once_per_use(tmp_path, monkeypatch):
    """A thread that turns the cache off (``override(cache_dir=None)``) while another finds an entry's path
    gives that one either path, never an error."""
    from jaxaot._src.partition.costs import measured_costs

    monkeypatch.setattr(store, "config", _Flipping(str(tmp_path)))
    monkeypatch.setattr(measured_costs, "config", _Flipping(str(tmp_path)))
    path = store.entry_path("plans", "k")
    assert path == tmp_path / f"jaxaot-v{store.FORMAT_VERSION}" / "plans" / "k.bin"
    table = measured_costs.MeasuredCosts(path="auto")
    assert table._path.parent == tmp_path / "jaxaot-v2" / "op-costs"
    monkeypatch.setattr(measured_costs, "config", _Flipping(str(tmp_path)))
    monkeypatch.setattr(measured_costs, "_SHARED", {})
    shared = measured_costs.MeasuredCosts.for_device()  # filed under the folder its file lies in
    assert shared._path.parent == tmp_path / "jaxaot-v2" / "op-costs"
    assert list(measured_costs._SHARED)[0][-1] == str(tmp_path)


def test_frames_reject_truncation_and_bit_flips():
    framed = store.frame(b"some payload", "executables/k")
    assert store.unframe(framed, "executables/k") == b"some payload"
    assert store.unframe(framed, "executables/j") is None  # signed for another name
    assert store.unframe(framed[:-1], "executables/k") is None
    assert store.unframe(framed[:10], "executables/k") is None
    flipped = bytearray(framed)
    flipped[-3] ^= 1
    assert store.unframe(bytes(flipped), "executables/k") is None


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path):
    path = tmp_path / "deep" / "entry.bin"
    store.atomic_write(path, b"one")
    store.atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["entry.bin"]


def test_read_and_write_round_trip(tmp_path):
    path = tmp_path / "entry.bin"
    assert store.read(path) is None
    store.write(path, b"payload")
    assert store.read(path) == b"payload"


def test_the_documented_stats_spelling_works_in_a_fresh_process():
    import subprocess
    import sys

    from zoo import child_env

    code = "import jaxaot._src.compile; s = jaxaot._src.compile.stats(); print(type(s).__name__, s.executable_hits)"
    run = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["CacheStats", "0"]
