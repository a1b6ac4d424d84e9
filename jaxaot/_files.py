"""Writing files whole: what every on-disk cache of jaxaot's needs (compile cache, artifacts, op-cost tables).

Example:
    >>> import pathlib, tempfile
    >>> from jaxaot._files import atomic_write
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sub" / "file"
    >>> atomic_write(path, b"whole")
    >>> path.read_bytes()
    b'whole'
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the new one, never a partial one; concurrent
    writers are safe (the last one wins). Raises ``OSError``.
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
