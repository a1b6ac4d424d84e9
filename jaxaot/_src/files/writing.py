"""Writing files and folders whole: readers see the old version or the new one, never a mix.

:func:`atomic_write` writes a temporary file (private unless asked) and ``os.replace``-s it into
place (never writing through a symlink; the last writer wins);
:func:`create_exclusive` never replaces an existing file (the first writer wins);
:func:`replace_folder` fills a fresh sibling folder and swaps it in. Temporaries
left by killed writers are swept once older than :data:`STALE_SECONDS`.

Example:
    >>> import pathlib, tempfile
    >>> from jaxaot._src.files import atomic_write
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> atomic_write(path, b"one"); atomic_write(path, b"two")
    >>> path.read_bytes(), [p.name for p in path.parent.iterdir()]
    (b'two', ['f'])
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Callable

from jaxaot.errors import InvalidInputError

#: Temporary files and folders older than this (seconds) are a killed writer's, and are removed.
STALE_SECONDS = 3600
_MARK = "jaxaot-"
_TEMP = re.compile(r"\..+\.jaxaot-[A-Za-z0-9_]+\.tmp")


def atomic_write(path: Path | str, data: bytes | bytearray | memoryview, *, private: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    The file is private (mode 0600), or with ``private`` False (a file to share, such as an artifact's) of the
    mode the umask gives a new file. The folder is created (0700) if absent, and swept of stale temporaries.
    Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_stale(path.parent)
    tmp = _write_temporary(path, data, 0o600 if private else 0o666)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def create_exclusive(path: Path | str, data: bytes) -> bool:
    """Create ``path`` (mode 0600) holding ``data`` unless something is there already; whether this call made it.

    The file appears whole (written to a temporary file, then hard-linked into
    place), and a file another process made first is never replaced.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_stale(path.parent)
    tmp = _write_temporary(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        _unlink(tmp)


def replace_folder(target: Path | str, fill: Callable[[Path], None], replaceable: Callable[[str], bool]) -> Path:
    """Make the folder ``target`` anew: ``fill(fresh)`` writes a fresh sibling folder, which then takes its place.

    An existing ``target`` (or the folder a symlink there names) is replaced
    only if it is a directory whose entries all satisfy ``replaceable(name)``
    (an empty one, or an earlier version);
    anything else is refused with ``FileExistsError``, so no file of the user's
    is ever removed. Where the system can (Linux ``renameat2``), the two folders
    are exchanged in one step; elsewhere the old one is renamed aside first,
    which leaves a moment without either. A failure in ``fill`` leaves
    ``target`` as it was. The fresh folder gets the old one's mode once it is
    filled (a new one, the umask's). Of two writers racing for one path, the
    last one's folder stays.
    """
    target = _followed(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(parent)
    old_mode = _replaceable_mode(target, replaceable)
    fresh = _fresh_folder(parent, target.name, old_mode)
    try:
        fill(fresh)
        _fsync_folder(fresh)
        _swap_in(fresh, target, old_mode, replaceable)
        _fsync_folder(parent)
    except BaseException:
        _remove_folder(fresh)
        raise
    return target


def check_replaceable(target: Path | str, replaceable: Callable[[str], bool]) -> None:
    """Refuse, as :func:`replace_folder` would, to replace ``target``: ``FileExistsError`` when something is
    there that is not a folder of ``replaceable`` entries; lets a command check before it writes anything."""
    _replaceable_mode(_followed(target), replaceable)


def _followed(target: Path | str) -> Path:
    """``target``, or the folder it names where it is a symlink to a folder (made anew in its place)."""
    target = Path(target)
    if os.path.islink(target) and os.path.isdir(target):
        return Path(os.path.realpath(target))
    return target


def _swap_in(fresh: Path, target: Path, old_mode: int | None, replaceable: Callable[[str], bool]) -> None:
    """Put the filled folder ``fresh`` in place of ``target``, giving it the mode of the folder it replaces.

    The mode comes last, so that a read-only folder can be replaced by another.
    Another writer may make or replace ``target`` meanwhile: a folder that
    appeared is checked and replaced as an existing one (the last writer wins).
    """
    parent = target.parent
    while True:
        if old_mode is None:
            try:
                os.rename(fresh, target)
                return
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
            old_mode = _replaceable_mode(target, replaceable)  # made by another writer meanwhile
            continue
        os.chmod(fresh, old_mode)
        if _exchange(fresh, target):
            _remove_folder(fresh)  # the exchange left the old version here
            return
        aside = _fresh_name(parent, target.name)
        try:
            os.rename(target, aside)
        except FileNotFoundError:  # another writer moved it aside meanwhile
            old_mode = None
            continue
        try:
            os.rename(fresh, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(aside, target)  # the old version back in its place
            raise
        _remove_folder(aside)
        return


def folder_to_write(what: str, path: Any) -> Path:
    """``path`` as the name of a folder :func:`replace_folder` can make; ``InvalidInputError`` saying what to
    pass for anything else: not a str or ``os.PathLike``, or empty, ``.``, ``..`` or a root (a folder that
    cannot be swapped for another, such as the working directory)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInputError(f"{what}: path must be the folder to write (a str or os.PathLike, such as "
                                f"'model' or '/tmp/model'), got {type(path).__name__}.")
    fspath = os.fspath(path)
    if not isinstance(fspath, str):
        raise InvalidInputError(f"{what}: path must be the folder to write as a str or os.PathLike of str, "
                                f"got {fspath!r}.")
    if Path(fspath).name in ("", ".", ".."):
        raise InvalidInputError(f"{what}: path must name the folder to write (such as 'model' or "
                                f"'/tmp/model'), got {fspath!r}: the working directory, its parent or a root cannot be "
                                "swapped for a new folder.")
    return Path(fspath)


def discard_output(stream: Any) -> None:
    """Point ``stream``'s file descriptor at ``os.devnull``, so that what is still buffered for a reader that
    is gone (a closed pipe) is dropped quietly rather than reported when the interpreter exits."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # pragma: no cover - no os.devnull to open
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):  # a stream without a file descriptor (one a test captures)
        pass
    finally:
        os.close(devnull)


def sweep_stale(folder: Path | str, max_age: float = STALE_SECONDS) -> int:
    """Remove this user's temporaries (``.<name>.jaxaot-<random>.tmp`` files and folders) older than ``max_age`` seconds
    from ``folder``; how many. Errors are ignored: sweeping never fails a write."""
    removed, now = 0, time.time()
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if not _TEMP.fullmatch(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if (uid is not None and st.st_uid != uid) or now - st.st_mtime < max_age:
                continue
            if stat.S_ISDIR(st.st_mode):
                _remove_folder(Path(entry.path), ignore_errors=False)
            elif stat.S_ISREG(st.st_mode):
                os.unlink(entry.path)
            else:
                continue
            removed += 1
        except OSError:
            continue
    return removed


# --------------------------------------------------------------------------- helpers
def _write_temporary(path: Path, data: bytes | bytearray | memoryview, mode: int = 0o600) -> str:
    """A new temporary file beside ``path`` holding ``data``, created with ``mode`` (less the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    while True:
        tmp = str(path.parent / f".{path.name}.{_MARK}{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:  # another writer's name: draw again
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _replaceable_mode(target: Path, replaceable: Callable[[str], bool]) -> int | None:
    """The mode of the folder at ``target`` if it may be replaced; None if nothing is there."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        raise FileExistsError(errno.EEXIST, "it is not a folder: refusing to replace it", str(target))
    others = sorted(name for name in os.listdir(target) if not replaceable(name))
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise FileExistsError(errno.EEXIST, f"it holds files that would be lost ({shown}): refusing to replace "
                              "it; choose an empty or new folder", str(target))
    return stat.S_IMODE(st.st_mode)


def _fresh_name(parent: Path, name: str) -> Path:
    return parent / f".{name}.{_MARK}{secrets.token_hex(8)}.tmp"


def _fresh_folder(parent: Path, name: str, mode: int | None) -> Path:
    while True:
        fresh = _fresh_name(parent, name)
        try:
            os.mkdir(fresh, 0o777 if mode is None else 0o700)  # 0o777: the umask decides, as for mkdir
        except FileExistsError:
            continue
        return fresh


def _remove_folder(folder: Path, ignore_errors: bool = True) -> None:
    """Remove a folder of jaxaot's making, even one made read-only (an old version of a 0555 folder)."""
    try:
        if not os.access(folder, os.W_OK | os.X_OK):
            os.chmod(folder, 0o700)
    except OSError:
        pass
    shutil.rmtree(folder, ignore_errors=ignore_errors)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms that cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


_LIBC: list = []


def _libc():
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:  # pragma: no cover - no C library to load
            _LIBC.append(None)
    return _LIBC[0]
