"""The persistent cache's files: where they live, how they are framed, read and written.

Entries live under ``<jaxaot.config.cache_dir>/jaxaot-v1/`` (:func:`cache_root`).
Every file is ``magic | sha256(payload) | len(payload) | payload``, written to
a temporary file and ``os.replace``-d into place (:func:`atomic_write`), so
readers see whole files only and concurrent writers of one key are safe (the
last one wins; both wrote the same thing). A file that fails its checksum is
reported once (:class:`~jaxaot.errors.CacheWarning`) and reads as absent; I/O
errors never fail a call.

Example:
    >>> from jaxaot.compile import store
    >>> store.unframe(store.frame(b"payload"))
    b'payload'
    >>> store.unframe(store.frame(b"payload")[:-1]) is None
    True
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

from jaxaot._config import config
from jaxaot.compile.cache_stats import count, warn_once

#: The version of the on-disk format: the directory name, the environment key and saved partitions carry it.
FORMAT_VERSION = 1
_MAGIC = b"JXAOTC01"
_HEADER = struct.Struct("<8s32sQ")


def cache_root() -> Path | None:
    """``<jaxaot.config.cache_dir>/jaxaot-v1``, or None when the cache is off."""
    if not config.cache_dir:
        return None
    return Path(config.cache_dir) / f"jaxaot-v{FORMAT_VERSION}"


def frame(payload: bytes) -> bytes:
    """``payload`` behind the magic, its sha256 and its length."""
    return _HEADER.pack(_MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def unframe(data: bytes) -> bytes | None:
    """The payload of a framed file; None when it is truncated, foreign or fails its checksum."""
    if len(data) < _HEADER.size:
        return None
    magic, digest, n = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != _MAGIC or n != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def read(path: Path) -> bytes | None:
    """The entry's payload; None when absent. A corrupt entry warns once and reads as absent."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        warn_once(path, f"jaxaot cache: cannot read {path} ({err}); compiling instead.")
        return None
    payload = unframe(data)
    if payload is None:
        corrupt(path, "it is truncated or fails its checksum")
    return payload


def corrupt(path: Path, why: str) -> None:
    """Count the entry at ``path`` as corrupt and warn once; the caller rebuilds it."""
    count("corrupt")
    warn_once(path, f"jaxaot cache: ignoring corrupt entry {path} ({why}); rebuilding it.")


def write(path: Path, payload: bytes) -> None:
    """Store ``payload`` framed at ``path``; an unwritable cache warns once and is skipped."""
    try:
        atomic_write(path, frame(payload))
    except OSError as err:
        root = cache_root() or path.parent
        warn_once(root, f"jaxaot cache: cannot write to {root} ({err}); not caching.")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the new one, never a partial one; concurrent
    writers are safe (the last one wins). Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
