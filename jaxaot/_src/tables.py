"""Plain-text tables, as the ``jaxaot`` command and :func:`jaxaot.compare` print them.

Example:
    >>> print(table([("name", "bytes"), ("w", 12), ("bias", 4)]))
    name  bytes
    ----  -----
    w        12
    bias      4
    >>> median_spread([3.0, 1.0, 2.0], "{:.1f}")
    '2.0 (1.0-3.0)'
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence


def table(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` as aligned columns, the first row a header underlined with dashes.

    The first column is left-aligned, the others right-aligned (numbers).
    """
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def median_spread(values: Sequence[float], fmt: str) -> str:
    """``median (min-max)`` of ``values``, each formatted with ``fmt``: a measurement and its spread in one cell."""
    v = sorted(values)
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}-{fmt.format(v[-1])})"
