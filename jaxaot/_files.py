"""Files read and written whole, safely: what every on-disk store of jaxaot's needs (compile cache, artifacts, op-cost tables).

Writing (:func:`atomic_write`) goes through a private temporary file and
``os.replace``, so readers see the old file or the new one, never a partial one.

Reading (:func:`read_regular`) opens with ``O_NOFOLLOW | O_NONBLOCK``, checks the
open descriptor with ``fstat`` and only then reads, at most ``max_bytes``. So a
symlink is refused without being followed, a FIFO or device cannot block the
reader (opening a FIFO without a writer would wait forever; reading one waits
for data), a directory or socket is refused, and a huge file is refused before
a byte of it is read. Checking the descriptor, not the path, leaves no window
between the check and the read. Each refusal is an :class:`UnsafeFileError`.

Example:
    >>> import os, pathlib, tempfile
    >>> from jaxaot._files import UnsafeFileError, atomic_write, read_regular
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sub" / "file"
    >>> atomic_write(path, b"whole")
    >>> read_regular(path, max_bytes=100)
    b'whole'
    >>> os.mkfifo(path.parent / "fifo")
    >>> read_regular(path.parent / "fifo", max_bytes=100)
    Traceback (most recent call last):
    ...
    jaxaot._files.UnsafeFileError: .../fifo is a FIFO, not a regular file
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

#: ``os.open`` flags of :func:`read_regular` (each where the platform has it).
READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
              | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class UnsafeFileError(OSError):
    """A path :func:`read_regular` refuses: a symlink, FIFO, device, socket or directory, or too large."""


class FileTooLargeError(UnsafeFileError):
    """A regular file larger than :func:`read_regular`'s ``max_bytes``."""


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the new one, never a partial one; concurrent
    writers are safe (the last one wins). The temporary file is created
    ``O_EXCL`` with mode 0600, and ``os.replace`` swaps the directory entry, so
    whatever was at ``path`` before (a symlink, a FIFO) is replaced, never
    written through. Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def describe_mode(mode: int) -> str:
    """What kind of file a ``st_mode`` is: ``"a FIFO"``, ``"a directory"``, ``"a regular file"``, ..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"a file of mode {mode:o}"


def read_regular(path: Path | str, max_bytes: int, check: Callable[[os.stat_result], str | None] | None = None
                 ) -> bytes:
    """The bytes of the regular file ``path``, refusing anything else.

    Opens with :data:`READ_FLAGS` (a symlink as the last component is not
    followed), ``fstat``-s the descriptor, and reads only a regular file of at
    most ``max_bytes``. ``check(stat)`` may refuse it too by returning a reason
    (the cache refuses files of another user this way).

    Raises:
      FileNotFoundError: nothing at ``path``.
      UnsafeFileError: a symlink, a FIFO, a device, a socket, a directory, or
        a file refused by ``check``; :class:`FileTooLargeError` (a subclass)
        for a file larger than ``max_bytes``.
      OSError: any other I/O error.
    """
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.EMLINK and os.path.islink(path)):
            raise UnsafeFileError(f"{path} is a symlink, not a regular file") from None
        if err.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise UnsafeFileError(f"{path} is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{path} is {describe_mode(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise FileTooLargeError(f"{path} is {st.st_size} bytes, more than the limit of {max_bytes}")
        why = check(st) if check is not None else None
        if why:
            raise UnsafeFileError(f"{path}: {why}")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while being read
        raise FileTooLargeError(f"{path} is more than the limit of {max_bytes} bytes")
    return data
