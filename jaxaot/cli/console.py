"""What the ``jaxaot`` command prints around its results: progress lines and plain-text tables.

Example:
    >>> print(table([("name", "bytes"), ("w", 12), ("bias", 4)]))
    name  bytes
    ----  -----
    w        12
    bias      4
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence, TextIO


class Progress:
    """Prints ``label ... done (0.3 s)`` around a long step (on stderr by default), ``failed`` if it raises."""

    def __init__(self, label: str, stream: TextIO | None = None):
        self.label, self.stream = label, stream or sys.stderr

    def __enter__(self) -> Progress:
        self.t = time.perf_counter()
        print(f"  {self.label} ...", end="", flush=True, file=self.stream)
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.t
        word = "done" if exc_type is None else "failed"
        print(f" {word} ({self.seconds:.2f} s)", file=self.stream, flush=True)


def table(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` as aligned columns, the first row a header underlined with dashes.

    The first column is left-aligned, the others right-aligned (numbers).
    """
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
