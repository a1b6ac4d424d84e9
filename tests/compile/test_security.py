"""The persistent cache cannot be used to run code: signed entries, private directories, a private key."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import struct
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile import cache, compilers, executable_codec, store
from jaxaot.errors import CacheWarning

CALLS = {"compile": 0}


def counting_xla(closed, avals, **kwargs):
    CALLS["compile"] += 1
    return compilers.xla(closed, avals, **kwargs)


def loss(w, x):
    return jnp.sum(jnp.sin(x @ w) ** 2)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((5, 3), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((4, 5), dtype=np.float32)))


def _run():
    """value and grads of a fresh AOTFunction, next to JAX's own."""
    CALLS["compile"] = 0
    w, x = _inputs()
    got = jax.value_and_grad(jaxaot.aot_function(loss, fw_compiler=counting_xla), argnums=(0, 1))(w, x)
    want = jax.value_and_grad(loss, argnums=(0, 1))(w, x)
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    return got


@pytest.fixture
def secure_cache(tmp_path):
    with jaxaot.config.override(cache_dir=str(tmp_path / "cache"), cache_key_file=str(tmp_path / "keys" / "key-a")):
        cache.reset_stats()
        yield tmp_path / "cache"
    cache.reset_stats()


def _entries(root: Path, kind: str) -> list[Path]:
    return sorted((root / f"jaxaot-v{store.FORMAT_VERSION}" / kind).glob("*.bin"))


class _Plant:
    """Unpickling this creates ``path``: the proof that a payload was deserialised."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _malicious_executable_payload(marker: Path) -> bytes:
    header = json.dumps({"n_in": 2, "n_out": 2}).encode()
    return struct.pack("<I", len(header)) + header + pickle.dumps(_Plant(str(marker)))


def test_key_file_and_cache_directory_are_private(secure_cache, tmp_path):
    _run()
    key = tmp_path / "keys" / "key-a"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    root = secure_cache / f"jaxaot-v{store.FORMAT_VERSION}"
    for d in (secure_cache, root, root / "executables", root / "partitions"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for p in root.rglob("*.bin"):
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p


def test_planted_pickle_payload_is_never_executed(secure_cache, tmp_path):
    expected = _run()
    entries = _entries(secure_cache, "executables")
    assert len(entries) == 2  # forward and backward
    marker = tmp_path / "pwned"
    payload = _malicious_executable_payload(marker)
    # The control: this payload does run code when it reaches the deserialiser.
    assert executable_codec.decode(payload) is None and marker.exists()
    marker.unlink()
    # Planted as an old-format entry (bare sha256), as an entry signed with another key,
    # and as a payload with a forged tag: none is unpickled, each is rebuilt.
    v1 = struct.pack("<8s32sQ", b"JXAOTC01", hashlib.sha256(payload).digest(), len(payload)) + payload
    plants = [lambda p: v1, lambda p: store.frame(payload, store.entry_name(p), key=os.urandom(32)),
              lambda p: store.frame(payload, store.entry_name(p), key=b"\0" * 32)]
    for plant in plants:
        for p in entries:
            p.write_bytes(plant(p))
        cache.reset_stats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _run()
        assert not marker.exists(), "a planted pickle was executed"
        assert cache.stats().corrupt == 2 and CALLS["compile"] == 2
        assert sum(issubclass(w.category, CacheWarning) for w in caught) == 2
        np.testing.assert_array_equal(got[0], expected[0])
        for p in entries:  # rebuilt and signed with our key
            assert store.unframe(p.read_bytes(), store.entry_name(p)) is not None


def test_entries_signed_with_another_users_key_are_refused_and_rebuilt(secure_cache, tmp_path):
    _run()
    before = {p: p.read_bytes() for p in (secure_cache).rglob("*.bin")}
    assert len(before) == 3  # a partition, a forward and a backward
    jaxaot.config.cache_key_file = str(tmp_path / "keys" / "key-b")  # another user's key (until secure_cache ends)
    cache.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run()
    assert cache.stats().corrupt == 3 and CALLS["compile"] == 2
    assert all("signature fails" in str(w.message) for w in caught if issubclass(w.category, CacheWarning))
    for p, old in before.items():
        assert p.read_bytes() != old and store.unframe(p.read_bytes(), store.entry_name(p)) is not None
    cache.reset_stats()
    _run()  # warm under key b
    assert cache.stats() == cache.CacheStats(partition_hits=1, executable_hits=2) and CALLS["compile"] == 0


@pytest.mark.parametrize("where", ["cache_dir", "versioned_root"])
@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_group_or_world_writable_cache_directory_is_refused(secure_cache, where, mode):
    _run()
    d = secure_cache if where == "cache_dir" else secure_cache / f"jaxaot-v{store.FORMAT_VERSION}"
    d.chmod(mode)
    cache.reset_stats()
    with pytest.warns(CacheWarning, match=r"refusing to use .*writable by (group|others)"):
        _run()
    assert cache.stats() == cache.CacheStats() and CALLS["compile"] == 2  # nothing read, nothing written
    d.chmod(0o700)
    cache.reset_stats()
    _run()
    assert cache.stats().executable_hits == 2


def test_directory_owned_by_another_user_is_refused(secure_cache, monkeypatch):
    _run()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(secure_cache).st_uid + 1)
    cache.reset_stats()
    with pytest.warns(CacheWarning, match="owned by uid"):
        _run()
    assert cache.stats() == cache.CacheStats() and CALLS["compile"] == 2


def test_a_readable_key_file_is_refused(secure_cache, tmp_path):
    _run()
    key = tmp_path / "keys" / "key-a"
    store._keys.clear()
    key.chmod(0o644)
    cache.reset_stats()
    with pytest.warns(CacheWarning, match="key file"):
        _run()
    assert cache.stats() == cache.CacheStats() and CALLS["compile"] == 2


def test_concurrent_first_use_agrees_on_one_key(tmp_path):
    import threading

    results = []

    def make():
        results.append(store._read_or_create_key(tmp_path / "k" / "key"))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results[0]) == 32
    assert [p.name for p in (tmp_path / "k").iterdir()] == ["key"]


def _refusal(cache_dir) -> str:
    """The cache's one warning for ``cache_dir`` (nothing is written there)."""
    with jaxaot.config.override(cache_dir=str(cache_dir)):
        cache.reset_stats()
        with pytest.warns(CacheWarning, match="refusing to use") as caught:
            assert store.cache_root() is None
    cache.reset_stats()
    (message,) = [str(w.message) for w in caught if "refusing to use" in str(w.message)]
    return message


def test_a_refused_folder_of_this_user_is_fixed_with_chmod(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    mine.chmod(0o770)
    message = _refusal(mine)
    assert message.endswith(f"Not caching; fix it with chmod 700 {mine}, or choose another jaxaot.config.cache_dir.")


@pytest.mark.parametrize("shared", ["/tmp", "sticky"])
def test_a_refused_shared_folder_is_never_advised_chmod(tmp_path, shared):
    if shared == "sticky":  # a folder like /tmp: everyone writes there, the sticky bit keeps their files apart
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
    elif not os.path.isdir(shared) or not os.stat(shared).st_mode & stat.S_ISVTX:
        pytest.skip("no shared /tmp here")
    message = _refusal(shared)
    assert "chmod" not in message and "leave its permissions alone" in message
    assert message.endswith(f"{shared} is a shared temporary folder: leave its permissions alone and set "
                            "jaxaot.config.cache_dir (JAXAOT_CACHE_DIR) to a private folder of yours, such as "
                            "~/.cache/jaxaot.")
    if isinstance(shared, Path):
        assert list(shared.iterdir()) == []  # refused before anything is made there


def test_a_refused_folder_of_another_user_is_never_advised_chmod(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(theirs).st_uid + 1)
    message = _refusal(theirs)
    assert "owned by uid" in message and "chmod" not in message
    assert message.endswith(f"{theirs} is not a folder of yours: leave its permissions alone and set "
                            "jaxaot.config.cache_dir (JAXAOT_CACHE_DIR) to a private folder of yours, such as "
                            "~/.cache/jaxaot.")
