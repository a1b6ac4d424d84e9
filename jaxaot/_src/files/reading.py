"""Reading a file jaxaot did not just write: one safe reader for cache entries, artifacts, the key and op-cost tables.

:func:`read_regular` opens with ``O_NOFOLLOW | O_NONBLOCK`` and checks the open
descriptor (``fstat``), not the path, before reading a byte: only a regular file
is read (a symlink, FIFO, device or directory is refused without blocking), a
caller's ``check`` may refuse it, and its size must match the declared size or
stay under the cap. The bytes go into one buffer, hashed as they arrive; a file
that changes size meanwhile is refused. Each refusal is an :class:`UnsafeFileError`.

Example:
    >>> import os, pathlib, tempfile
    >>> from jaxaot._src.files import UnsafeFileError, atomic_write, read_regular
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sub" / "file"
    >>> atomic_write(path, b"whole")
    >>> bytes(read_regular(path, max_bytes=100))
    b'whole'
    >>> read_regular(path, max_bytes=100, size=4)
    Traceback (most recent call last):
    ...
    jaxaot._src.files.reading.FileMismatchError: .../file has 5 bytes, not the 4 declared
    >>> os.mkfifo(path.parent / "fifo")
    >>> read_regular(path.parent / "fifo", max_bytes=100)
    Traceback (most recent call last):
    ...
    jaxaot._src.files.reading.UnsafeFileError: .../fifo is a FIFO, not a regular file
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Callable

#: ``os.open`` flags of :func:`read_regular` (each where the platform has it).
READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
              | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
_CHUNK = 1 << 24


class UnsafeFileError(OSError):
    """A path :func:`read_regular` refuses: a symlink, FIFO, device, socket or directory, a file its
    ``check`` refuses, or a folder :func:`~jaxaot._src.files.folders.check_folder` refuses."""


class FileTooLargeError(UnsafeFileError):
    """A regular file larger than :func:`read_regular`'s ``max_bytes``."""


class FileMismatchError(UnsafeFileError):
    """A regular file whose size or sha256 differs from the declared one, or that changed while being read.

    Attributes:
      path: the file.
      why: what differs, as the rest of a sentence (``"has 5 bytes, not the 4 declared"``).
    """

    def __init__(self, path: Path | str, why: str):
        super().__init__(f"{path} {why}")
        self.path, self.why = path, why


def describe_mode(mode: int) -> str:
    """What kind of file a ``st_mode`` is: ``"a FIFO"``, ``"a directory"``, ``"a regular file"``, ..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"a file of mode {mode:o}"


def read_regular(path: Path | str, max_bytes: int, *, size: int | None = None, sha256: str | None = None,
                 check: Callable[[os.stat_result], str | None] | None = None,
                 header: tuple[int, Callable[[memoryview], int | None]] | None = None) -> bytearray:
    """The bytes of the regular file ``path``, refusing anything else (see the module docstring).

    Args:
      path: the file.
      max_bytes: the largest file to read.
      size: the size the file must have (declared by a manifest, say), compared before reading.
      sha256: the hex digest the bytes must have, computed while reading.
      check: ``check(stat)`` returns why the open file must not be trusted, or None.
      header: ``(n, size_of)`` for files that declare their own size: the first
        ``n`` bytes are read, and ``size_of(them)`` (None: not such a file) must
        be the file's size before the rest is read.

    Raises:
      FileNotFoundError: nothing at ``path``.
      UnsafeFileError: a symlink, a FIFO, a device, a socket, a directory, or a
        file refused by ``check``; :class:`FileTooLargeError` for a file larger
        than ``max_bytes``, :class:`FileMismatchError` for one whose size or
        digest is not the declared one.
      OSError: any other I/O error.
    """
    fd = _open(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{path} is {describe_mode(st.st_mode)}, not a regular file")
        why = check(st) if check is not None else None
        if why:
            raise UnsafeFileError(f"{path}: {why}")
        if st.st_size > max_bytes:
            raise FileTooLargeError(f"{path} is {st.st_size} bytes, more than the limit of {max_bytes}")
        if size is not None and st.st_size != size:
            raise FileMismatchError(path, f"has {st.st_size} bytes, not the {size} declared")
        return _read_exactly(fd, path, st.st_size, sha256, header)
    finally:
        os.close(fd)


def _open(path: Path | str) -> int:
    try:
        return os.open(path, READ_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.EMLINK and os.path.islink(path)):
            raise UnsafeFileError(f"{path} is a symlink, not a regular file") from None
        if err.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise UnsafeFileError(f"{path} is not a regular file") from None
        raise


def _read_exactly(fd: int, path: Path | str, n: int, sha256: str | None,
                  header: tuple[int, Callable[[memoryview], int | None]] | None) -> bytearray:
    """``n`` bytes of ``fd`` into one buffer, hashed on the way when ``sha256`` is given.

    A ``header`` is read (and checked) before the buffer for the rest is allocated.
    """
    head = bytearray(min(header[0], n)) if header is not None else bytearray()
    digest = hashlib.sha256() if sha256 is not None else None
    with memoryview(head) as view:
        _fill(fd, path, view, digest)
        if header is not None:
            declared = header[1](view)
            if declared != n:
                what = "is not of its format" if declared is None else f"declares {declared} bytes"
                raise FileMismatchError(path, f"has {n} bytes, but its header {what}")
    if len(head) == n:
        buf = head
    else:
        buf = bytearray(n)
        buf[:len(head)] = head
        with memoryview(buf) as view:
            _fill(fd, path, view[len(head):], digest)
    if os.read(fd, 1):
        raise FileMismatchError(path, "grew while being read")
    if digest is not None and digest.hexdigest() != sha256:
        raise FileMismatchError(path, "has a sha256 other than the one declared")
    return buf


def _fill(fd: int, path: Path | str, view: memoryview, digest: Any) -> None:
    """Read exactly ``len(view)`` bytes into ``view``, feeding each chunk to ``digest`` as it arrives."""
    done = 0
    while done < len(view):
        got = _read_into(fd, view[done:done + _CHUNK])
        if not got:
            raise FileMismatchError(path, "shrank while being read")
        if digest is not None:
            digest.update(view[done:done + got])
        done += got


def _read_into(fd: int, view: memoryview) -> int:
    if hasattr(os, "readv"):
        return os.readv(fd, [view])
    chunk = os.read(fd, len(view))  # pragma: no cover - platforms without readv
    view[:len(chunk)] = chunk
    return len(chunk)
