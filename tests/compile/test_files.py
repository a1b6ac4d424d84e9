"""The one reader and writer of jaxaot's files, as the cache and the key use them.

Attacks: a 2 GiB entry (or program file) was read whole before being refused;
temporaries of killed writers were never removed; the key's folder was not
checked (a 0777 folder let anyone swap the key for one they know).
"""

from __future__ import annotations

import os
import resource
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.files import STALE_SECONDS, FileMismatchError, FileTooLargeError, read_regular
from jaxaot._src.compile import cache, compilers, store
from jaxaot.errors import CacheWarning
from reliability.hostile import deadline

CALLS = {"compile": 0}
TWO_GIB = 2 << 30


def counting_xla(closed, avals, **kwargs):
    CALLS["compile"] += 1
    return compilers.xla(closed, avals, **kwargs)


def _run():
    CALLS["compile"] = 0
    x = jnp.linspace(0.0, 1.0, 7)
    got = jax.grad(jaxaot.aot_function(lambda v: jnp.sum(jnp.sin(v) ** 2), fw_compiler=counting_xla))(x)
    np.testing.assert_allclose(got, jax.grad(lambda v: jnp.sum(jnp.sin(v) ** 2))(x), rtol=1e-6)


@pytest.fixture
def secure_cache(tmp_path):
    with jaxaot.config.override(cache_dir=str(tmp_path / "cache"), cache_key_file=str(tmp_path / "keys" / "key")):
        cache.reset_stats()
        yield tmp_path / "cache" / f"jaxaot-v{store.FORMAT_VERSION}"
    cache.reset_stats()
    store._keys.clear()


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


# --------------------------------------------------------------------------- sizes before reading
def test_a_file_of_another_size_than_declared_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big"
    _sparse(path, TWO_GIB)
    before, start = _rss_kib(), time.perf_counter()
    with pytest.raises(FileMismatchError, match=f"has {TWO_GIB} bytes, not the 1780 declared"):
        read_regular(path, 4 << 30, size=1780)
    with pytest.raises(FileTooLargeError):
        read_regular(path, 1 << 20)
    assert time.perf_counter() - start < 2 and _rss_kib() - before < 100_000


def test_the_sha256_is_computed_while_reading_into_one_buffer(tmp_path):
    import hashlib

    data = os.urandom(3 << 20)
    (tmp_path / "f").write_bytes(data)
    got = read_regular(tmp_path / "f", 4 << 20, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    assert isinstance(got, bytearray) and got == data
    with pytest.raises(FileMismatchError, match="has a sha256 other than the one declared"):
        read_regular(tmp_path / "f", 4 << 20, sha256=hashlib.sha256(b"other").hexdigest())


def test_a_huge_cache_entry_is_refused_after_its_header(secure_cache):
    _run()
    entries = sorted((secure_cache / "executables").glob("*.bin"))
    assert len(entries) == 2
    for p in entries:
        p.unlink()
        _sparse(p, TWO_GIB)  # zeros: no frame
        os.chmod(p, 0o600)
    before, start = _rss_kib(), time.perf_counter()
    cache.reset_stats()
    with warnings.catch_warnings(record=True) as caught, deadline(60):
        warnings.simplefilter("always")
        _run()
    assert time.perf_counter() - start < 30 and _rss_kib() - before < 500_000
    assert cache.stats().corrupt == 2 and CALLS["compile"] == 2
    assert sum("truncated, or not a cache entry" in str(w.message) for w in caught) == 2


# --------------------------------------------------------------------------- temporaries of killed writers
def test_stale_temporaries_in_the_cache_are_removed_on_the_next_write(secure_cache):
    _run()
    folder = secure_cache / "executables"
    stale = folder / ".abc.bin.jaxaot-k1ll3d.tmp"
    young = folder / ".def.bin.jaxaot-w0rk1n.tmp"
    other = folder / ".notes.tmp"
    for p in (stale, young, other):
        p.write_bytes(b"partial")
    hour_ago = time.time() - STALE_SECONDS - 60
    for p in (stale, other):
        os.utime(p, (hour_ago, hour_ago))
    for p in folder.glob("*.bin"):
        p.unlink()  # so that the next run writes
    _run()
    assert not stale.exists() and young.exists() and other.exists()


# --------------------------------------------------------------------------- the key's folder
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o707])
def test_a_key_in_a_folder_others_can_write_is_refused(secure_cache, tmp_path, mode):
    _run()
    folder = tmp_path / "keys"
    store._keys.clear()
    folder.chmod(mode)
    cache.reset_stats()
    try:
        with pytest.warns(CacheWarning, match=r"cannot use the key file .*keys: it is writable by (group|others)"):
            _run()
        assert cache.stats() == cache.CacheStats() and CALLS["compile"] == 2  # nothing read, nothing written
    finally:
        folder.chmod(0o700)
    store._keys.clear()
    cache.reset_stats()
    _run()
    assert cache.stats().executable_hits == 2 and CALLS["compile"] == 0
