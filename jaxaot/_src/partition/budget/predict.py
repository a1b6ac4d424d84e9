"""A plan's compiled peak predicted from the plans measured, by device saved bytes.

The budget search (:mod:`~jaxaot._src.partition.budget.search`) compiles few plans; the others' peaks are read off
the measured ones here, to choose which to compile next. Only compiled peaks are ever returned as a plan's.
"""

from __future__ import annotations

import math
from typing import Sequence


def predict_peak(saved: int, anchors: Sequence[tuple[int, int]]) -> float:
    """A plan's compiled peak predicted from its device saved bytes and ``anchors``, the
    ``(saved bytes, compiled peak)`` of plans measured: linear between the nearest anchors, and beyond
    them along the nearest segment (its slope at least 0), or with slope 1 from a single anchor.
    Where two anchors save equal bytes the higher peak counts. ``inf`` without anchors.

    Example:
        >>> from jaxaot._src.partition.budget.predict import predict_peak
        >>> predict_peak(600, [(1000, 5000)]), predict_peak(600, [(1000, 5000), (200, 3000)])
        (4600, 4000.0)
    """
    points: dict[int, int] = {}
    for s, p in anchors:
        points[s] = max(p, points.get(s, p))
    xs = sorted(points)
    if not xs:
        return math.inf
    if len(xs) == 1:
        return points[xs[0]] - (xs[0] - saved)
    if saved in points:
        return float(points[saved])
    if saved < xs[0] or saved > xs[-1]:  # beyond: along the nearest segment, from its nearest end
        a, b = (xs[0], xs[1]) if saved < xs[0] else (xs[-1], xs[-2])
        return points[a] + max((points[b] - points[a]) / (b - a), 0.0) * (saved - a)
    b = next(x for x in xs if x > saved)
    a = max(x for x in xs if x < saved)
    return points[a] + (points[b] - points[a]) / (b - a) * (saved - a)


def interpolate(known: Sequence[tuple[float, int]], f: float) -> float:
    """Saved bytes at fraction ``f``, linear between the nearest planned fractions."""
    lo = max((p for p in known if p[0] <= f), default=known[0])
    hi = min((p for p in known if p[0] >= f), default=known[-1])
    if hi[0] == lo[0]:
        return float(lo[1])
    return lo[1] + (hi[1] - lo[1]) * (f - lo[0]) / (hi[0] - lo[0])
