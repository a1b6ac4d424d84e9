"""Binomial (revolve) checkpointing: the schedule, in Python and in JAX.

Reversing n steps with k stored states costs at least Griewank and Walther's
``t(n, k)`` forward steps. The forward does not know n, so :func:`place` places
snapshots online, greedily by the exact cost of the backward that would follow;
the backward knows n and reverses each segment optimally (:func:`split_point`). The
binomial table is computed on the device (:func:`beta_table_jax`), so the program
does not grow with k. :func:`revolve_counts` runs the schedule in NumPy for tests
and benchmarks.

Example:
    >>> c = revolve_counts(1000, 10)
    >>> c.optimum, c.forward, c.vjps
    (3636, 3744, 1000)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from math import comb
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src.loops.common import read_row

_INT32_MAX = np.iinfo(np.int32).max
MAX_REPS = 1024  # repetition numbers tabulated for split_point(); beyond, splits are still valid


# --------------------------------------------------------------------------- the schedule, in Python
def beta(s: int, r: int) -> int:
    """``C(s + r, s)``: the most steps s snapshots reverse with r repetitions."""
    return comb(s + r, s) if s >= 0 and r >= 0 else 0


def repetitions(n: int, k: int) -> int:
    """The smallest r with ``beta(k, r) >= n``."""
    r = 0
    while beta(k, r) < n:
        r += 1
    return r


def revolve_optimum(n: int, k: int) -> int:
    """Fewest forward steps (VJPs not counted) to reverse n steps with k snapshots."""
    if n <= 1:
        return 0
    r = repetitions(n, k)
    return r * n - beta(k + 1, r - 1)


def split_point(length: int, slots: int) -> int:
    """Where the optimal schedule stores its next snapshot when reversing ``length``
    steps from a stored state with ``slots`` snapshot slots (that one included)."""
    r = repetitions(length, slots)
    return min(max(beta(slots, r - 2), length - beta(slots - 1, r), 1), length - 1)


@functools.lru_cache(maxsize=None)
def beta_table(k: int) -> np.ndarray:
    """``beta(s, r)`` for ``s <= k``, ``r <= MAX_REPS``, clipped to int32."""
    return np.asarray([[min(beta(s, r), _INT32_MAX) for r in range(MAX_REPS + 1)] for s in range(k + 1)],
                      np.int64).astype(np.int32)


def _saturating_add(a, b):
    """``min(a + b, int32 max)`` for non-negative int32 (associative, so a scan may use it)."""
    return jnp.where(a > _INT32_MAX - b, _INT32_MAX, a + b)


def beta_table_jax(k: int):
    """:func:`beta_table` computed on the device: ``(k + 1, MAX_REPS + 1)`` int32.

    Row 0 is ones and row ``s`` is the saturating running sum of row ``s - 1``
    (``C(s + r, s) = sum_{j <= r} C(s - 1 + j, s - 1)``), so the entries equal
    NumPy's exactly, and the program holds a loop of ``k`` running sums (about
    ten vector ops each) instead of a constant of ``4 (k + 1) (MAX_REPS + 1)``
    bytes: its size no longer grows with k. Computed once per loop, outside the
    per-step path.
    """
    def next_row(row, _):
        return lax.associative_scan(_saturating_add, row), row

    _, rows = lax.scan(next_row, jnp.ones((MAX_REPS + 1,), jnp.int32), None, length=k + 1)
    return rows


# The online placement below runs twice: in JAX inside the forward loop, and in NumPy
# for revolve_counts() and the tests. Both run the same code on an array module
# ``xp`` with integer arithmetic, so they take the same decision at every step.
def cost_cap(k: int) -> int:
    """Costs saturate here, so a sum of k+1 of them still fits in int32."""
    return _INT32_MAX // (k + 2)


def segment_cost(xp, length, slots: np.ndarray, k: int, table=None):
    """``revolve_optimum(length, slots)`` per lane, saturated at :func:`cost_cap`.

    ``table`` is ``beta_table(k + 1)``; with ``xp=jnp`` pass
    :func:`beta_table_jax` ``(k + 1)`` computed once outside the loop (by default
    it is computed here).

    ``slots`` gives one value per lane. ``r`` (the repetition number) is a
    binary search of the lane's row of :func:`beta_table`, then ``t = r*L -
    beta(s+1, r-1)``: about a dozen gathers of one element per lane. Lengths beyond
    ``beta(s, MAX_REPS)``, and products that would overflow int32, saturate (an
    overflowing product means ``t`` is above the cap anyway).
    """
    if table is None:
        table = beta_table(k + 1) if xp is np else beta_table_jax(k + 1)
    width = table.shape[1]
    flat = table.reshape(-1)
    row = xp.clip(slots, 1, k) * width
    r = xp.zeros_like(length)  # how many entries of the row are below length
    step = 1 << (width - 1).bit_length()
    while step:
        cand = r + step
        below = xp.take(flat, row + xp.minimum(cand, width) - 1) < length
        r = xp.where((cand <= width) & below, cand, r)
        step >>= 1
    t = r * length - xp.take(flat, row + width + xp.clip(r - 1, 0, width - 1))
    fits = (r < width) & (length <= _INT32_MAX // xp.maximum(r, 1))
    cap = cost_cap(k)
    return xp.where(r == 0, 0, xp.where(fits, xp.minimum(t, cap), cap))


def place(xp, i, pos, slot_of, m, k: int, table=None):
    """One online decision, at the state before step ``i`` (so the loop runs >= i+1 steps).

    The snapshots are levels ``0..m-1`` at positions ``pos`` (ascending, level 0 the
    initial state); level ``a`` reverses its segment with ``k - a`` slots, so the
    backward costs ``n + sum_a t(len_a, k - a)`` forward steps. The choices are:
    keep the state (append it as level m, if a slot is free), drop level ``j`` and
    append the state (later levels move down one and gain a slot), or skip it. Take
    the one that is cheapest if the loop stopped right after this step. This greedy,
    myopic rule stays within 10% of the offline optimum for every n >= 100 we
    checked (``tests/loops/test_revolve.py``), and within 2.5% for large n.

    ``slot_of[a]`` is the buffer slot holding level ``a`` (slots ``m..k-1`` free),
    so a decision writes one slot and never moves snapshots. Returns ``(slot,
    pos, slot_of, m)``, slot ``k`` meaning the scratch slot (not stored). ``table``
    is as in :func:`segment_cost`.
    """
    a = xp.arange(k, dtype=pos.dtype)  # an iota, not a constant of k entries
    nxt = xp.where(a + 1 < m, xp.roll(pos, -1), i)
    prev = xp.roll(pos, 1)
    valid = a < m
    # Four costs per level, in one batch of 4k lanes: its segment with the state
    # appended; the same after a level below is dropped (one more slot); the last
    # segment when the state is skipped (one step longer); level a dropped, its
    # segment joined to the one below.
    lengths = xp.concatenate([nxt - pos, nxt - pos, nxt - pos + 1, nxt - prev])
    slots = xp.concatenate([k - a, k - a + 1, k - a, k - a + 1])
    costs = xp.where(xp.concatenate([valid] * 4), segment_cost(xp, lengths, slots, k, table), 0)
    own, shifted, longer, merged = (costs[q * k:(q + 1) * k] for q in range(4))
    before = xp.cumsum(own, dtype=own.dtype) - own  # sums keep the dtype (int32 sums are int64 under x64)
    after = xp.sum(shifted, dtype=own.dtype) - xp.cumsum(shifted, dtype=own.dtype)
    big = _INT32_MAX
    skip = before[m - 1] + longer[m - 1]
    append = xp.where(m < k, xp.sum(own, dtype=own.dtype), big)
    drop = xp.where((a >= 1) & valid, xp.roll(before, 1) + merged + after, big)[1:]
    choice = xp.argmin(xp.concatenate([xp.stack([skip, append]), drop])).astype(pos.dtype)  # int64 under x64
    j = choice - 1  # the dropped level, when choice >= 2
    freed = slot_of[xp.clip(j, 0, k - 1)]
    new_pos = xp.where(a < j, pos, xp.where(a < m - 1, xp.roll(pos, -1), xp.where(a == m - 1, i, -1)))
    new_slot = xp.where((a < j) | (a >= m), slot_of, xp.where(a < m - 1, xp.roll(slot_of, -1), freed))
    is_drop, is_append = choice >= 2, choice == 1
    slot = xp.where(is_drop, freed, xp.where(is_append, slot_of[xp.minimum(m, k - 1)], k))
    pos = xp.where(is_drop, new_pos, xp.where(is_append & (a == m), i, pos))
    slot_of = xp.where(is_drop, new_slot, slot_of)
    return slot, pos, slot_of, m + is_append.astype(pos.dtype)


def online_placement(k: int):
    """Yield ``(n, positions)`` for n = 1, 2, ...: the snapshots the forward holds
    when the loop stops after n steps (ascending, level 0 first).

    Example:
        >>> from itertools import islice
        >>> [p for _, p in islice(online_placement(3), 5)]
        [[0], [0, 1], [0, 1, 2], [0, 1, 2], [0, 2, 4]]
    """
    pos, slot_of, m, i = np.full(k, -1, np.int64), np.arange(k), 1, 0
    pos[0] = 0
    while True:
        if i:
            _, pos, slot_of, m = place(np, i, pos, slot_of, m, k)
        i += 1
        yield i, [int(p) for p in pos[:m]]


def worst_ratio(k: int, *, first: int = 100, last: int = 3000) -> tuple[float, int]:
    """``(forward steps / optimum, n)`` at the worst trip count n in ``first..last``.

    Example:
        >>> ratio, n = worst_ratio(10, last=400)
        >>> ratio <= 1.10
        True
    """
    return max((placement_cost(n, k, held) / revolve_optimum(n, k), n)
               for n, held in itertools.islice(online_placement(k), last) if n >= first)


def snapshots_after_forward(n: int, k: int) -> list[int]:
    """Positions held per level once the online forward has run n steps (-1: empty)."""
    for steps, held in online_placement(k):
        if steps >= n:
            return held + [-1] * (k - len(held))
    raise AssertionError("unreachable")


def placement_cost(n: int, k: int, pos: Sequence[int]) -> int:
    """Forward steps to reverse n steps from the snapshots ``pos``: the n of the
    forward pass plus ``sum_a t(len_a, k - a)`` (:func:`backward_advances` runs it)."""
    held = [p for p in pos if p >= 0] + [n]
    return n + sum(revolve_optimum(held[a + 1] - held[a], k - a) for a in range(len(held) - 1))


def backward_advances(n: int, k: int, pos: Sequence[int]) -> int:
    """Forward steps the backward recomputes, from the snapshots ``pos``."""
    return backward_blocks(n, k, pos, 1)[0]


def _blocks(steps: int, block: int) -> int:
    return -(-steps // block)


def backward_blocks(n: int, k: int, pos: Sequence[int], block: int) -> tuple[int, int, int]:
    """``(advances, vjps, checks)`` of the backward from the snapshots ``pos``, run in blocks
    of ``block`` steps per predicate check as :mod:`jaxaot._src.loops.checkpointed` runs it:
    body evaluations (masked steps past a run's end included) and loop predicate checks.

    With ``block=1`` every VJP step is one iteration of the outer loop around one
    recomputation sweep (a loop of its own). With blocks, an outer iteration is a
    sweep, its VJP, then the run of VJP steps whose state is the top snapshot (no
    recomputation between them), each sweep and run in blocks.
    """
    pos = list(pos)
    top = max(j for j in range(k) if pos[j] >= 0)
    fine, advances, vjps, checks = n, 0, 0, 1

    def vjp_step():
        nonlocal fine, top, vjps
        fine -= 1
        vjps += 1
        if pos[top] == fine:
            pos[top] = -1
            top -= 1

    while fine > 0:
        cur, swept = pos[top], 0
        while cur < fine - 1:
            slots = k - top
            target = pos[top] + split_point(fine - pos[top], slots) if slots > 1 else -1
            cur += 1
            swept += 1
            if cur == target:
                top += 1
                pos[top] = cur
        advances += _blocks(swept, block) * block
        checks += _blocks(swept, block) + 2  # the sweep's checks and the outer loop's
        vjp_step()
        if block > 1:
            run = 0
            while fine > 0 and top >= 0 and pos[top] == fine - 1:
                vjp_step()
                run += 1
            vjps += _blocks(run, block) * block - run
            checks += _blocks(run, block) + 1
    return advances, vjps, checks


@dataclasses.dataclass(frozen=True)
class RevolveCounts:
    """Body evaluations for reversing ``n`` steps with ``k`` snapshots.

    ``forward`` counts forward steps: the n of the forward pass plus the backward's
    recomputation; ``vjps`` the n body VJPs (each also runs the body once more);
    ``optimum`` the revolve optimum ``t(n, k)`` (which counts its first sweep as n-1).
    Run in blocks of ``block`` steps, both include the masked steps past a run's end;
    ``checks`` counts loop predicate checks.
    """

    n: int
    k: int
    forward: int
    vjps: int
    optimum: int
    block: int = 1
    checks: int = 0

    @property
    def ratio(self) -> float:
        return self.forward / max(self.optimum, 1)


def revolve_counts(n: int, k: int, block: int = 1) -> RevolveCounts:
    """Count the forward steps of ``checkpoints=k`` on a loop of ``n`` iterations, run in
    blocks of ``block`` steps per predicate check (masked steps counted), and its loop
    predicate checks (``checks``: on a GPU, each is a wait for the host).

    Example:
        >>> [(c.forward, c.vjps, c.checks) for c in (revolve_counts(2000, 40), revolve_counts(2000, 40, block=4))]
        [(5101, 2000, 9103), (5592, 2416, 2763)]
    """
    forward = _blocks(n, block) * block
    advances, vjps, checks = backward_blocks(n, k, snapshots_after_forward(n, k), block) if n else (0, 0, 1)
    return RevolveCounts(n=n, k=k, forward=forward + advances, vjps=vjps, optimum=revolve_optimum(n, k),
                         block=block, checks=checks + _blocks(n, block) + 1)


# --------------------------------------------------------------------------- the schedule, in JAX
def _searchsorted(table, value):
    """``jnp.searchsorted(table, value)`` (side left) as one compare-and-count.

    jnp.searchsorted's default method is a ``lax.scan`` of log2(len) bisection
    steps: a nested while loop in every loop step (a dozen tiny kernels and a loop
    on a GPU, and a select-driven loop XLA tries to analyse); the tables here have
    at most ``MAX_REPS + 1`` entries, so counting the entries below ``value`` is
    one fused reduction.
    """
    return jnp.sum(table < value, dtype=jnp.int32)


def split_point_jax(length, slots, k: int, table=None):
    """:func:`split_point` on traced ``length`` and ``slots``, for at most ``k`` slots.

    ``table`` is :func:`beta_table_jax` of ``k`` or more rows, computed once
    outside the loop (by default here).
    """
    table = beta_table_jax(k) if table is None else table
    row = read_row(table, jnp.clip(slots, 0, k))
    r = jnp.minimum(_searchsorted(row, length), MAX_REPS)
    b_s = jnp.where(r >= 2, read_row(row, jnp.maximum(r - 2, 0)), 0)
    b_s1 = read_row(read_row(table, jnp.clip(slots - 1, 0, k)), r)
    return jnp.clip(jnp.maximum(b_s, length - b_s1), 1, length - 1)
