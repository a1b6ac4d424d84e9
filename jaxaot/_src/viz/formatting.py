"""Short texts the pictures show: byte sizes and source locations.

Avals print with :func:`jaxaot._src.pytrees.format_aval` (``f32[8,16]``), which
``jaxaot._src.viz`` also exports under its older name ``aval_str``.

Example:
    >>> format_bytes(3 * 2**20), short_source("/src/model.py:12:3 (loss)")
    ('3.0 MiB', ('model.py:12', 'loss'))
"""

from __future__ import annotations

import re
from pathlib import Path

from jaxaot._src.pytrees import format_aval

#: The name ``jaxaot._src.viz`` has always exported for :func:`jaxaot._src.pytrees.format_aval`.
aval_str = format_aval

_SOURCE_RE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)? \((?P<fn>.*)\)$")


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1.

    Example:
        >>> format_bytes(512), format_bytes(65536), format_bytes(3 * 2**20)
        ('512 B', '64.0 KiB', '3.0 MiB')
    """
    size, unit = byte_scale(abs(n))
    return f"{int(n)} B" if unit == "B" else f"{n / size:.1f} {unit}"


def byte_scale(n: float) -> tuple[int, str]:
    """The largest binary unit not above ``n``: ``(bytes per unit, name)``.

    Example:
        >>> byte_scale(5000)
        (1024, 'KiB')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return size, unit
    return 1, "B"


def short_source(source: str) -> tuple[str, str]:
    """``("examples.py:74", "block_apply")`` from ``eqn_source``'s ``/path/examples.py:74:15 (block_apply)``.

    Example:
        >>> short_source("/work/jaxaot/examples.py:74:15 (block_apply)")
        ('examples.py:74', 'block_apply')
        >>> short_source("<unknown>")
        ('<unknown>', '<unknown>')
    """
    m = _SOURCE_RE.match(source or "")
    if not m:
        return source or "<unknown>", source or "<unknown>"
    return f"{Path(m['file']).name}:{m['line']}", m["fn"]
