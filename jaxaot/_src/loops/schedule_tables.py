"""The online placement of :mod:`jaxaot._src.loops.revolve`, precomputed for a bounded loop.

The forward of ``checkpoints=k`` decides at every step whether to store the state,
from the step number alone, so with ``max_steps=N`` the decisions can be made once
at trace time: :func:`stored_steps` (the same greedy rule as
:func:`~jaxaot._src.loops.revolve.place`, in incremental Python) and :func:`recorder`
replace the device's binary searches with one table read per step, and
:func:`split_points` gives the backward's split points. Their decisions equal
``place``'s at every step (``tests/loops/test_placement.py``).

Example:
    >>> steps, slots, held = stored_steps(12, 3)
    >>> steps.tolist(), slots.tolist()  # the initial state first; the sentinel -1 (slot k) last
    ([0, 1, 2, 4, 6, 9, -1], [0, 1, 2, 1, 2, 1, 3])
"""

from __future__ import annotations

import bisect
import functools
from math import comb
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src.loops.common import read_row, write_row
from jaxaot._src.loops.revolve import MAX_REPS, beta, cost_cap, repetitions

_INT32_MAX = int(np.iinfo(np.int32).max)
_WIDTH = MAX_REPS + 1  # the columns of revolve.beta_table: r beyond them saturates the cost


class _Costs:
    """``revolve.segment_cost`` for one lane, exactly (saturation included), memoized."""

    def __init__(self, k: int, longest: int):
        self.k, self.cap = k, cost_cap(k)
        self.rows = {}  # s -> beta(s, r) for r = 0, 1, ... up to the first value >= longest
        self.longest = longest
        self.memo: dict = {}
        self.combs: dict = {}  # s -> min(comb(s + r, s + 1), int32 max) for r < _WIDTH
        self.row_arrays: dict = {}  # s -> _row(s) as an int64 array

    def _row(self, s: int) -> list:
        row = self.rows.get(s)
        if row is None:
            row, r = [1], 0
            while row[-1] < self.longest and r < _WIDTH:
                r += 1
                row.append(row[-1] * (s + r) // r)
            self.rows[s] = row
        return row

    def __call__(self, length: int, slots: int) -> int:
        key = (length, slots)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._cost(length, max(1, min(slots, self.k)))
        return got

    def many(self, lengths: np.ndarray, slots: int) -> np.ndarray:
        """``self(length, slots)`` for each of ``lengths`` (int64), at once."""
        s = max(1, min(slots, self.k))
        if s == 1:
            r = lengths - 1
        else:
            row = self.row_arrays.get(s)
            if row is None:
                row = self.row_arrays[s] = np.asarray(self._row(s), np.int64)
            r = np.searchsorted(row, lengths, side="left")
        combs = self.combs.get(s)
        if combs is None:
            combs = self.combs[s] = np.asarray([min(comb(s + q, s + 1), _INT32_MAX) for q in range(_WIDTH)],
                                               np.int64)
        small = (r < _WIDTH) & (lengths <= _INT32_MAX // np.maximum(r, 1))
        rr = np.where(small, r, 0)
        got = np.where(small, np.minimum(rr * lengths - combs[rr], self.cap), self.cap)
        return np.where(lengths <= 1, 0, got)

    def _cost(self, length: int, s: int) -> int:
        if length <= 1:
            return 0
        r = length - 1 if s == 1 else bisect.bisect_left(self._row(s), length)
        if r >= _WIDTH or length > _INT32_MAX // r:
            return self.cap
        return min(r * length - min(comb(s + r, s + 1), _INT32_MAX), self.cap)


@functools.lru_cache(maxsize=64)
def stored_steps(max_steps: int, checkpoints: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, slots, held)``: the steps ``i < max_steps`` whose state (before step i) the online
    forward stores, ascending, the slot each goes to, and how many snapshots are held after it;
    the first entry is the initial state (step 0, slot 0, 1 held), and ``steps`` and ``slots``
    end with a sentinel (step -1, slot ``checkpoints``, the scratch slot) so a loop may read
    one entry past the last."""
    k = checkpoints
    cost = _Costs(k, max_steps + 2)
    big = _INT32_MAX
    pos, slot_of, m = [0], list(range(k)), 1
    steps, slots, held = [0], [0], [1]
    segs = _Segments(cost, k)
    static = None
    i = 0
    while True:
        if static is None:
            static = segs.summary(m)
        i = _next_candidate(cost, k, static, pos, m, i + 1, max_steps)
        if i >= max_steps:
            break
        own_before, d_best, j_best, before_last2 = static
        last = m - 1
        p_last = pos[last]
        skip = own_before + cost(i - p_last + 1, k - last)
        append = own_before + cost(i - p_last, k - last) if m < k else big
        shifted_last = cost(i - p_last, k - last + 1)
        drop_mid = d_best + shifted_last if j_best else big
        drop_last = before_last2 + cost(i - pos[m - 2], k - last + 1) if m >= 2 else big
        best = min(skip, append, drop_mid, drop_last)
        if best == skip:
            continue
        if best == append:
            slot = slot_of[m]
            pos.append(i)
            m += 1
            segs.update(pos, m - 2)
        else:
            j = j_best if best == drop_mid else last
            slot = slot_of[j]
            pos = pos[:j] + pos[j + 1:] + [i]
            slot_of = slot_of[:j] + slot_of[j + 1:m] + [slot] + slot_of[m:]
            segs.update(pos, j - 1)
        steps.append(i)
        slots.append(slot)
        held.append(m)
        static = None
    return np.asarray(steps + [-1], np.int32), np.asarray(slots + [k], np.int32), np.asarray(held + [m], np.int32)


def _next_candidate(cost: _Costs, k: int, static: tuple, pos: list, m: int, start: int, stop: int) -> int:
    """The first step ``i >= start`` (or ``stop``) at which the greedy rule of :func:`stored_steps` may store:
    some option costs less than skipping. Between stored steps the held levels stay, so each option's cost
    is a function of ``i`` alone, evaluated over blocks of steps at once (doubling blocks: a long run of
    skipped steps costs a few vectorised passes, not one Python iteration per step)."""
    own_before, d_best, j_best, before_last2 = static
    last, block = m - 1, 64
    p_last = pos[last]
    while start < stop:
        i = np.arange(start, min(start + block, stop), dtype=np.int64)
        skip = own_before + cost.many(i - p_last + 1, k - last)
        better = np.zeros(i.shape, bool)
        if m < k:
            better |= own_before + cost.many(i - p_last, k - last) < skip
        if j_best:
            better |= d_best + cost.many(i - p_last, k - last + 1) < skip
        if m >= 2:
            better |= before_last2 + cost.many(i - pos[m - 2], k - last + 1) < skip
        hit = np.flatnonzero(better)
        if hit.size:
            return int(i[hit[0]])
        start, block = int(i[-1]) + 1, min(block * 2, 1 << 20)
    return stop


class _Segments:
    """The costs of the segments between held levels, kept up to date as levels change: level
    ``a``'s own segment with its slots and with one more, and the segment a drop of level ``j``
    would join (levels below a change keep theirs)."""

    def __init__(self, cost: _Costs, k: int):
        self.cost, self.k = cost, k
        self.own, self.shifted, self.merged = [], [], [0]

    def update(self, pos: list, first: int) -> None:
        """Recompute the segments from level ``first`` up (``pos``: the levels now held)."""
        cost, k, first = self.cost, self.k, max(first, 0)
        del self.own[first:], self.shifted[first:], self.merged[max(first, 1):]
        for a in range(first, len(pos) - 1):
            length = pos[a + 1] - pos[a]
            self.own.append(cost(length, k - a))
            self.shifted.append(cost(length, k - a + 1))
        for j in range(max(first, 1), len(pos) - 1):
            self.merged.append(cost(pos[j + 1] - pos[j - 1], k - j + 1))

    def summary(self, m: int) -> tuple:
        """The parts of the placement's costs that stay fixed until the next stored step: ``(sum
        of own costs before the last level, least static part of dropping a middle level, that
        level (0: none), own costs before the last two levels)``."""
        prefix = [0]
        for c in self.own:
            prefix.append(prefix[-1] + c)
        d_best, j_best = None, 0
        after = 0  # sum of shifted[a] for j < a < m - 1, built from the top
        candidates = []
        for j in range(m - 2, 0, -1):
            candidates.append((prefix[j - 1] + self.merged[j] + after, j))
            after += self.shifted[j]
        for value, j in reversed(candidates):  # ascending j: the first of equal minima wins, as argmin's
            if d_best is None or value < d_best:
                d_best, j_best = value, j
        return prefix[m - 1], d_best or 0, j_best, prefix[m - 2] if m >= 2 else 0


@functools.lru_cache(maxsize=64)
def split_table(max_steps: int, checkpoints: int) -> np.ndarray:
    """``beta(s, r)`` for ``s <= checkpoints`` and the repetition numbers a segment of at most
    ``max_steps`` steps needs (``r <= repetitions(max_steps, 2) + 1``), saturated at int32's
    maximum: the columns :func:`~jaxaot._src.loops.revolve.split_point_jax` reads for any length up
    to ``max_steps`` with two or more slots. A few thousand entries, where
    :func:`~jaxaot._src.loops.revolve.beta_table_jax` computes ``MAX_REPS + 1`` columns on the device.

    Example:
        >>> split_table(10, 2).tolist()
        [[1, 1, 1, 1, 1], [1, 2, 3, 4, 5], [1, 3, 6, 10, 15]]
    """
    width = min(repetitions(max(max_steps, 1), 2) + 2, _WIDTH)
    return np.asarray([[min(beta(s, r), _INT32_MAX) for r in range(width)] for s in range(checkpoints + 1)],
                      np.int64).astype(np.int32)


#: Most entries of a :func:`split_points` table (1 MiB of int16), a constant XLA compiles quickly;
#: longer loops with more checkpoints search :func:`split_table` instead.
MAX_SPLIT_POINTS = 1 << 19


@functools.lru_cache(maxsize=64)
def split_points(max_steps: int, checkpoints: int) -> np.ndarray | None:
    """``split_point(length, slots)`` for every ``length <= max_steps`` and ``slots <= checkpoints``,
    flattened by rows of ``max_steps + 1`` lengths (entries of fewer than 2 slots or steps are 0),
    int16 where the lengths fit; None when that is more than :data:`MAX_SPLIT_POINTS` entries.
    The backward then reads a split point in one lookup instead of a binary search.

    Example:
        >>> from jaxaot._src.loops.revolve import split_point
        >>> t = split_points(30, 3).reshape(4, 31)
        >>> int(t[3, 25]) == split_point(25, 3), int(t[2, 7]) == split_point(7, 2)
        (True, True)
    """
    longest, k = max(max_steps, 2), checkpoints
    if (k + 1) * (longest + 1) > MAX_SPLIT_POINTS:
        return None
    lengths = np.arange(longest + 1, dtype=np.int64)
    out = np.zeros((k + 1, longest + 1), np.int64)
    width = min(repetitions(longest, 2) + 2, _WIDTH) if k >= 2 else 1
    rows = split_table(longest, k).astype(np.int64) if k >= 2 else None
    for s in range(2, k + 1):
        r = np.minimum(np.searchsorted(rows[s], lengths, side="left"), width - 1)  # revolve.repetitions
        b_s = np.where(r >= 2, rows[s][np.maximum(r - 2, 0)], 0)
        b_s1 = rows[s - 1][r]
        out[s] = np.clip(np.maximum(b_s, lengths - b_s1), 1, np.maximum(lengths - 1, 1))
    out[:, :2] = 0
    return out.reshape(-1).astype(np.int16 if longest < np.iinfo(np.int16).max else np.int32)


def recorder(max_steps: int, checkpoints: int) -> tuple[Any, Callable, Callable]:
    """``(levels0, decide, finish)``: the forward's placement read from :func:`stored_steps`.

    ``decide(i, levels) -> (slot, levels)`` gives the slot the state before step ``i`` goes
    to (``checkpoints``, the scratch slot, when it is not stored; slot 0 at step 0) and the
    levels after it: the next table entry and each slot's step. ``finish(levels) -> (pos,
    slot_of, top)`` orders the held snapshots as the backward reads them: ascending steps,
    -1 past the top level ``top``, and each level's slot (free slots last).
    """
    k = checkpoints
    steps, slots, held = (jnp.asarray(t) for t in stored_steps(max_steps, k))

    def decide(i, levels):
        entry, positions = levels
        hit = i == read_row(steps, entry)
        slot = jnp.where(hit, read_row(slots, entry), k)
        return slot, (entry + hit.astype(entry.dtype), write_row(positions, slot, i))

    def finish(levels):
        entry, positions = levels
        key, slot_of = lax.sort((jnp.where(positions[:k] < 0, _INT32_MAX, positions[:k]),
                                 jnp.asarray(np.arange(k, dtype=np.int32))), num_keys=1)  # stable: free slots in order
        return jnp.where(key == _INT32_MAX, -1, key), slot_of, read_row(held, jnp.maximum(entry - 1, 0)) - 1

    return (jnp.zeros((), jnp.int32), jnp.asarray(np.full(k + 1, -1, np.int32))), decide, finish
