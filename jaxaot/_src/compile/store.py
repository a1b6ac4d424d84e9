"""The persistent cache's files: where they live, how they are framed, signed, read and written.

Each entry, ``<cache_dir>/jaxaot-v2/<kind>/<key>.bin``, is framed with an
HMAC-SHA256 under a per-user key over its name and payload, so an entry moved,
renamed, swapped, truncated or planted fails verification and reads as absent
(with a :class:`~jaxaot.errors.CacheWarning`) before any byte reaches a
deserialiser (executables are pickles). Folders must be this user's and writable
by no one else; files are written atomically and read with
:func:`~jaxaot._src.files.read_regular`. I/O errors never fail a call
(``docs/security.md``).

Example:
    >>> from jaxaot._src.compile import store
    >>> bytes(store.unframe(store.frame(b"payload", "executables/abc", key=b"k"), "executables/abc", key=b"k"))
    b'payload'
    >>> store.unframe(store.frame(b"payload", "executables/abc", key=b"k"), "executables/abd", key=b"k") is None
    True
    >>> store.unframe(store.frame(b"payload", "executables/abc", key=b"k"), "executables/abc", key=b"o") is None
    True
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import threading
from pathlib import Path
from typing import Any

from jaxaot._src.config import config
from jaxaot._src.files import (
    FileMismatchError, UnsafeFileError, UnsafeFolderError, atomic_write, check_folder, check_folders,
    create_exclusive, folder_advice, private, read_regular, untrusted,
)
from jaxaot._src.compile.cache_stats import count, warn_once

#: The version of the directory layout: the directory name, the environment key and saved partitions carry it.
FORMAT_VERSION = 2
#: The version of an entry's frame (it goes into every key, so entries of older frames are never looked up).
#: 3: the tag covers the entry's name (kind and key) as well as its payload.
FRAME_VERSION = 3
_MAGIC = b"JXAOTC03"
_HEADER = struct.Struct("<8s32sQQ")
#: Kinds of entries, one directory each.
KINDS = ("executables", "partitions")
#: The largest entry :func:`read` reads.
MAX_ENTRY_BYTES = 16 << 30
_KEY_BYTES = 32
_keys: dict[str, bytes] = {}
_key_lock = threading.Lock()


# --------------------------------------------------------------------------- directories
def cache_root() -> Path | None:
    """``<jaxaot.config.cache_dir>/jaxaot-v2``, created 0700; None when the cache is off or not trusted.

    Both directories are checked (:func:`~jaxaot._src.files.check_folder`); a
    refused one warns once (:class:`~jaxaot.errors.CacheWarning`): anyone who
    can write there could plant, rename or swap entries.
    """
    return _root(config.cache_dir)


def _root(base: Any) -> Path | None:
    """:func:`cache_root` under ``base``, the setting read once (another thread may change it meanwhile)."""
    if not base:
        return None
    root = trusted_folder(Path(base), f"jaxaot-v{FORMAT_VERSION}")
    return root if root is not None and cache_key() is not None else None


def entry_path(kind: str, key: str) -> Path | None:
    """Where the entry ``key`` of ``kind`` lives, its directory created and checked; None when not trusted."""
    base = config.cache_dir
    if _root(base) is None:
        return None
    d = trusted_folder(Path(base), f"jaxaot-v{FORMAT_VERSION}", kind)
    return None if d is None else d / f"{key}.bin"


def trusted_folder(base: Path, *names: str) -> Path | None:
    """``base / names...``, each level made (0700) if absent and checked; None (warned once) when refused.

    ``base`` (the configured ``cache_dir``) may be a symlink; the folders jaxaot
    makes below it may not.
    """
    try:
        return check_folders(base, *names, create=True)
    except UnsafeFolderError as err:
        d = err.path
        if "not a directory" in err.why:
            warn_once(d, f"jaxaot cache: cannot write to {d}: {err.why}; not caching.")
        else:
            warn_once(d, f"jaxaot cache: refusing to use {d}: {err.why}. Not caching; {folder_advice(d)}")
    except OSError as err:
        d = Path(err.filename) if err.filename else base
        warn_once(d, f"jaxaot cache: cannot write to {d} ({err}); not caching.")
    return None


# --------------------------------------------------------------------------- the key
def key_path() -> Path:
    """The per-user key file: ``jaxaot.config.cache_key_file``, else ``$XDG_CONFIG_HOME/jaxaot/cache-key``."""
    if config.cache_key_file is not None:
        return Path(config.cache_key_file)
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
                            "Delete it (a new one is created) or set jaxaot.config.cache_key_file.")
            return None
        _keys[str(path)] = key
        return key


def _read_or_create_key(path: Path) -> bytes | None:
    """The key at ``path``, created if absent; None when it is not a private file of this user.

    Its folder is checked as the cache's are (:func:`~jaxaot._src.files.check_folder`):
    whoever can write there could replace the key with one they know.
    """
    check_folder(path.parent, follow=True, create=True)
    if not os.path.lexists(path):
        create_exclusive(path, secrets.token_bytes(_KEY_BYTES))  # never replaces a key another process made
    try:
        key = read_regular(path, _KEY_BYTES, size=_KEY_BYTES, check=private)
    except UnsafeFileError:
        return None
    return bytes(key)


# --------------------------------------------------------------------------- frames
def _tag(key: bytes, name: bytes | memoryview, payload: bytes | memoryview) -> bytes:
    mac = hmac.new(key, struct.pack("<Q", len(name)), hashlib.sha256)
    mac.update(name)
    mac.update(payload)
    return mac.digest()


def frame(payload: bytes, name: str, key: bytes | None = None) -> bytes:
    """``payload`` behind the magic, its HMAC-SHA256 (with ``name``) under ``key`` (default: this user's)."""
    key = cache_key() if key is None else key
    if key is None:
        raise OSError("no usable cache key")
    n = name.encode()
    return _HEADER.pack(_MAGIC, _tag(key, n, payload), len(n), len(payload)) + n + payload


def framed_size(header: bytes | memoryview) -> int | None:
    """The size of the framed file that starts with ``header`` (its first bytes), or None if it is no frame."""
    if len(header) < _HEADER.size:
        return None
    magic, _, n_name, n_payload = _HEADER.unpack_from(header)
    return _HEADER.size + n_name + n_payload if magic == _MAGIC else None


def read_frame(data: bytes | bytearray | memoryview, key: bytes | None = None) -> tuple[str, memoryview] | None:
    """``(name, payload)`` of a framed file whose tag verifies under ``key``; None when truncated or foreign.

    The payload is a view into ``data``, not a copy.
    """
    key = cache_key() if key is None else key
    if key is None or framed_size(data) != len(data):
        return None
    _, tag, n_name, _ = _HEADER.unpack_from(data)
    view = memoryview(data)
    name = view[_HEADER.size:_HEADER.size + n_name]
    payload = view[_HEADER.size + n_name:]
    if not hmac.compare_digest(_tag(key, name, payload), tag):
        return None
    try:
        return bytes(name).decode(), payload
    except UnicodeDecodeError:
        return None


def unframe(data: bytes | bytearray | memoryview, name: str, key: bytes | None = None) -> memoryview | None:
    """The payload of a framed file signed under ``key`` for ``name``; None otherwise."""
    got = read_frame(data, key)
    return got[1] if got is not None and got[0] == name else None


# --------------------------------------------------------------------------- entries
def entry_name(path: Path) -> str:
    """The name an entry at ``path`` is signed for: ``<kind>/<key>``."""
    return f"{path.parent.name}/{path.stem}"


def read(path: Path) -> memoryview | None:
    """The entry's payload (a view of the one buffer read); None when absent.

    A corrupt, foreign or unsafe entry warns once and reads as absent. Its
    header is checked against its size before the rest is read.
    """
    try:
        data = read_regular(path, MAX_ENTRY_BYTES, check=untrusted, header=(_HEADER.size, framed_size))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except FileMismatchError:
        corrupt(path, "it is truncated, or not a cache entry")
        return None
    except UnsafeFileError as err:
        corrupt(path, f"{err}; refusing to read it")
        return None
    except OSError as err:
        warn_once(path, f"jaxaot cache: cannot read {path} ({err}); compiling instead.")
        return None
    got = read_frame(data)
    if got is None:
        corrupt(path, "it is truncated, or its signature fails: not written with this user's cache key")
        return None
    name, payload = got
    if name != entry_name(path):
        corrupt(path, f"it is the entry of {name}, not of {entry_name(path)}: moved, renamed or swapped")
        return None
    return payload


def corrupt(path: Path, why: str) -> None:
    """Count the entry at ``path`` as corrupt and warn once; the caller rebuilds it."""
    count("corrupt")
    warn_once(path, f"jaxaot cache: ignoring corrupt entry {path} ({why}); rebuilding it.")


def evict(path: Path, why: str) -> None:
    """Remove the entry at ``path`` (it verified but does not fit its use) and report it as :func:`corrupt`."""
    try:
        os.unlink(path)
    except OSError:
        pass
    corrupt(path, why)


def write(path: Path, payload: bytes) -> None:
    """Store ``payload`` framed (for the name of ``path``) at ``path``; an unwritable cache warns once. An empty
    folder in the entry's place (read as corrupt) is removed first, so the entry is rebuilt as the warning says."""
    try:
        if path.is_dir() and not path.is_symlink():
            os.rmdir(path)  # only an empty one: a folder with anything in it stays, and the write below warns
        atomic_write(path, frame(payload, entry_name(path)))
    except OSError as err:
        where = cache_root() or path.parent
        warn_once(where, f"jaxaot cache: cannot write to {where} ({err}); not caching.")
