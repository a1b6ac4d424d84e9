"""The memory-budget knapsack: which expensive values to recompute, in which order.

Below ``memory_budget=1`` the min-cut partitioner may recompute values it
normally bans (matmuls, large reductions; loops only at 0). Each such value is an item
with a weight (the bytes that recomputing it can save) and a value (the FLOPs
recomputing it costs). A knapsack keeps the most FLOPs-per-byte banned and
recomputes the rest.

We solve it greedily, by FLOPs per byte, and take a *prefix* of that order
rather than a DP's optimal subset: prefixes are nested, so a lower budget
recomputes a superset of what a higher one does, which makes budget sweeps
monotone by construction. The byte cost of a prefix is measured exactly (a
min-cut per probe, see :func:`smallest_feasible_prefix`), not summed per item,
because recomputing one value changes what its neighbours cost.

Example:
    >>> import numpy as np
    >>> from jaxaot.partition import knapsack
    >>> knapsack.recompute_order(np.array([100, 100, 10]), np.array([1e6, 1e2, 1e6])).tolist()
    [1, 0, 2]
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def recompute_order(nbytes: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """Indices of the items, cheapest to recompute per byte saved first.

    Zero-byte items, which save nothing, go last. Ties go smaller items first:
    matmuls that contract the same dimension tie exactly (``2k`` FLOPs per output
    element), so a transformer has large tie groups, and taking their small
    members first gives the prefixes the finest byte steps (budgets between two
    steps save closer to their target).
    """
    nbytes = np.asarray(nbytes, dtype=np.float64)
    density = np.asarray(flops, dtype=np.float64) / np.maximum(nbytes, 1.0)
    density = np.where(nbytes > 0, density, np.inf)
    # lexsort sorts by the last key first: density ascending, then bytes ascending.
    return np.lexsort((nbytes, density))


def smallest_feasible_prefix(cost_of_prefix: Callable[[int], float], n: int, target: float) -> int:
    """The smallest ``k`` in ``[0, n]`` with ``cost_of_prefix(k) <= target``.

    ``cost_of_prefix`` must be non-increasing in ``k`` (recomputing more never
    saves more bytes) and ``cost_of_prefix(n) <= target``; it is probed
    ``O(log n)`` times.

    Example:
        >>> from jaxaot.partition import knapsack
        >>> knapsack.smallest_feasible_prefix(lambda k: 10 - k, 10, 6.5)
        4
    """
    lo, hi = 0, n  # invariant: cost(hi) <= target; every k < lo is infeasible
    while lo < hi:
        mid = (lo + hi) // 2
        if cost_of_prefix(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return hi
