"""The persistent cache's files: where they live, how they are framed, signed, read and written.

Entries live under ``<jaxaot.config.cache_dir>/jaxaot-v2/`` (:func:`cache_root`).
Every file is ``magic | HMAC-SHA256(key, payload) | len(payload) | payload``,
written to a temporary file and ``os.replace``-d into place (:func:`atomic_write`),
so readers see whole files only and concurrent writers of one key are safe (the
last one wins; both wrote the same thing).

What the cache trusts: the per-user key file (:func:`key_path`; 32 random
bytes, mode 0600, created on first use) and nothing else. An entry whose tag
does not verify with that key (truncated, corrupt, planted, or written with
another user's key) is reported once (:class:`~jaxaot.errors.CacheWarning`)
and reads as absent, *before* any of its bytes reach a deserialiser (executables
are pickles). The cache directory is created with mode 0700; like ssh with its
keys, a directory (or key file) owned by another user or writable by group or
others is refused with a warning, and the call compiles instead. I/O errors
never fail a call.

Example:
    >>> from jaxaot.compile import store
    >>> store.unframe(store.frame(b"payload", key=b"k"), key=b"k")
    b'payload'
    >>> store.unframe(store.frame(b"payload", key=b"k"), key=b"other") is None
    True
    >>> store.unframe(store.frame(b"payload", key=b"k")[:-1], key=b"k") is None
    True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
import tempfile
import threading
from pathlib import Path

from jaxaot._config import config
from jaxaot._files import atomic_write
from jaxaot.compile.cache_stats import count, warn_once

#: The version of the on-disk format: the directory name, the environment key and saved partitions carry it.
#: 2: entries are signed with the per-user key (HMAC-SHA256) instead of a bare sha256.
FORMAT_VERSION = 2
_MAGIC = b"JXAOTC02"
_HEADER = struct.Struct("<8s32sQ")
#: The environment variable naming the key file (default ``$XDG_CONFIG_HOME/jaxaot/cache-key``).
KEY_FILE_ENV = "JAXAOT_CACHE_KEY_FILE"
_KEY_BYTES = 32
_keys: dict[str, bytes] = {}
_key_lock = threading.Lock()


def cache_root() -> Path | None:
    """``<jaxaot.config.cache_dir>/jaxaot-v2``, created 0700; None when the cache is off or not trusted.

    A directory owned by another user or writable by group or others is refused
    (a :class:`~jaxaot.errors.CacheWarning`, once): anyone who can write there
    could plant entries.
    """
    if not config.cache_dir:
        return None
    base = Path(config.cache_dir)
    root = base / f"jaxaot-v{FORMAT_VERSION}"
    try:
        for d in (base, root):
            _make_private_dir(d)
            why = untrusted(d)
            if why:
                warn_once(d, f"jaxaot cache: refusing to use {d}: {why}. Not caching; "
                             f"fix it with chmod 700 {d} (and make it yours), or choose another cache_dir.")
                return None
    except OSError as err:
        warn_once(base, f"jaxaot cache: cannot write to {base} ({err}); not caching.")
        return None
    return root if cache_key() is not None else None


def _make_private_dir(d: Path) -> None:
    if not d.exists():
        d.mkdir(mode=0o700, parents=True, exist_ok=True)


def untrusted(path: Path) -> str | None:
    """Why ``path`` must not be trusted (owned by another user, writable by group/others), or None."""
    st = os.stat(path)
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def key_path() -> Path:
    """The per-user key file: ``$JAXAOT_CACHE_KEY_FILE``, else ``$XDG_CONFIG_HOME/jaxaot/cache-key``."""
    explicit = os.environ.get(KEY_FILE_ENV)
    if explicit:
        return Path(explicit)
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(home) / "jaxaot" / "cache-key"


def cache_key() -> bytes | None:
    """This user's signing key, created (mode 0600) on first use; None (warned once) when unusable."""
    path = key_path()
    with _key_lock:
        key = _keys.get(str(path))
        if key is not None:
            return key
        try:
            key = _read_or_create_key(path)
        except OSError as err:
            key, why = None, str(err)
        else:
            why = None if key is not None else "it is not a private file of this user holding a key"
        if key is None:
            warn_once(path, f"jaxaot cache: cannot use the key file {path} ({why}); not caching. "
                            f"Delete it (a new one is created) or set {KEY_FILE_ENV}.")
            return None
        _keys[str(path)] = key
        return key


def _read_or_create_key(path: Path) -> bytes | None:
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(_KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic, and never replaces a key another process made first
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    st = os.stat(path)
    if untrusted(path) or st.st_mode & 0o077:
        return None
    key = path.read_bytes()
    return key if len(key) == _KEY_BYTES else None


def frame(payload: bytes, key: bytes | None = None) -> bytes:
    """``payload`` behind the magic, its HMAC-SHA256 under ``key`` (default: this user's) and its length."""
    key = cache_key() if key is None else key
    if key is None:
        raise OSError("no usable cache key")
    return _HEADER.pack(_MAGIC, hmac.new(key, payload, hashlib.sha256).digest(), len(payload)) + payload


def unframe(data: bytes, key: bytes | None = None) -> bytes | None:
    """The payload of a framed file; None when it is truncated, foreign or its tag fails under ``key``."""
    key = cache_key() if key is None else key
    if key is None or len(data) < _HEADER.size:
        return None
    magic, tag, n = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != _MAGIC or n != len(payload):
        return None
    if not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).digest(), tag):
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
        corrupt(path, "it is truncated, or its signature fails: not written with this user's cache key")
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
