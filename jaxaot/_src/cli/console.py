"""What the ``jaxaot`` command prints around its results: plain-text tables.

Progress lines go through :mod:`jaxaot._src.progress`, which the command shows on
stderr (:func:`jaxaot._src.progress.to_stderr`).

Example:
    >>> print(table([("name", "bytes"), ("w", 12), ("bias", 4)]))
    name  bytes
    ----  -----
    w        12
    bias      4
"""

from __future__ import annotations

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
