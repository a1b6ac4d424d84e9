"""The memory-budget knapsack: which expensive values to recompute, in which order.

Below ``memory_budget=1`` the min-cut may recompute values it normally bans. They
are ordered by seconds per byte saved (:mod:`jaxaot._src.partition.costs.op_costs`),
and the smallest prefix that reaches the budget is recomputed
(:func:`smallest_feasible_prefix`), its last step the cheapest that does
(:func:`cheapest_last_step`). Bytes are measured with a min-cut per probe, since
recomputing one value changes what its neighbours cost.

Example:
    >>> import numpy as np
    >>> from jaxaot._src.partition.mincut import knapsack
    >>> knapsack.recompute_order(np.array([100, 100, 10]), np.array([1e6, 1e2, 1e6])).tolist()
    [1, 0, 2]
"""

from __future__ import annotations

from typing import Callable, Sequence

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
        >>> from jaxaot._src.partition.mincut import knapsack
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


def cheapest_last_step(bytes_of: Callable[[Sequence[int]], float], seconds: np.ndarray, k: int,
                       target: float) -> list[int]:
    """The items to recompute: the first ``k - 1`` of the order, and the cheapest way to reach ``target`` from there.

    ``bytes_of(items)`` is what the cut saves when ``items`` (positions in the
    order) are recomputed; ``seconds[i]`` what recomputing item ``i`` costs;
    ``k`` the smallest feasible prefix (:func:`smallest_feasible_prefix`).

    The greedy order ranks items by seconds per byte, so its ``k``-th item may
    save far more than the target asks: just below budget 1, recomputing one
    80 MB matmul where one 256 KB ``cumsum`` would do. The last step is
    therefore chosen among a family of completions of the ``k - 1`` prefix: the
    ``k``-th item itself, each other remaining item alone, and the remaining
    items cheapest-first (1, 2, ... of them). Among those whose bytes lie in
    ``[bytes_of(first k), target]``, the one of fewest seconds wins (then fewest
    bytes). The family does not depend on the target, so as the target shrinks
    the winner either stays or gives way to one of fewer bytes, and no completion
    goes below the ``k``-prefix's bytes, which every smaller target's plan is at
    or below: saved bytes stay monotone in the budget. Cost: up to
    ``2 (n - k + 1)`` calls of ``bytes_of``.

    Example:
        >>> import numpy as np
        >>> from jaxaot._src.partition.mincut import knapsack
        >>> saving = np.array([80.0, 0.5, 16.0])  # bytes each item's recomputation saves
        >>> bytes_of = lambda items: 100.0 - saving[list(items)].sum()
        >>> seconds = np.array([179.0, 8.0, 61.0])  # the 80-byte item is the cheapest per byte
        >>> knapsack.cheapest_last_step(bytes_of, seconds, 1, 99.6)  # the small item reaches the target
        [1]
        >>> knapsack.cheapest_last_step(bytes_of, seconds, 1, 90.0)
        [2]
        >>> knapsack.cheapest_last_step(bytes_of, seconds, 1, 50.0)
        [0]
    """
    if k <= 0:
        return []
    n = len(seconds)
    base, rest = list(range(k - 1)), list(range(k - 1, n))
    low = bytes_of(list(range(k)))
    by_seconds = sorted(rest, key=lambda i: (seconds[i], i))
    family = [(k - 1,)] + [(j,) for j in rest[1:]] + [tuple(sorted(by_seconds[:m])) for m in range(2, len(rest) + 1)]
    best, best_key = (k - 1,), None
    for rank, extra in enumerate(dict.fromkeys(family)):
        b = bytes_of(base + list(extra))
        if low <= b <= target:
            key = (float(np.sum(seconds[list(extra)])), b, rank)
            if best_key is None or key < best_key:
                best, best_key = extra, key
    return base + list(best)
