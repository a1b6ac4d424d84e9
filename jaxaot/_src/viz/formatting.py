"""Short texts the pictures show: source locations.

Avals print with :func:`jaxaot._src.pytrees.format_aval` (``f32[8,16]``), which
``jaxaot._src.viz`` also exports under its older name ``aval_str``; byte sizes with
:func:`jaxaot._src.units.format_bytes`.

Example:
    >>> short_source("/src/model.py:12:3 (loss)")
    ('model.py:12', 'loss')
"""

from __future__ import annotations

import re
from pathlib import Path

from jaxaot._src.pytrees import format_aval

#: The name ``jaxaot._src.viz`` has always exported for :func:`jaxaot._src.pytrees.format_aval`.
aval_str = format_aval

_SOURCE_RE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)? \((?P<fn>.*)\)$")


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
