"""The revolve backward as one loop: one body evaluation per iteration, the VJP under a ``cond``.

The transpose of a ``checkpoints=k`` loop (:mod:`jaxaot.loops.checkpointed`) reverses
``n`` steps from the snapshots its forward stored: for each step, last first, it
advances from the nearest snapshot to the step, storing new snapshots at revolve's
split points while slots are free, and takes that step's VJP. Written as a sweep
loop inside a loop of VJPs, each loop has its own copy of the body and its own
bookkeeping.

:func:`reverse` runs it as a single loop. An iteration starts from the state
after step ``cur`` (read back from the top snapshot after a VJP) and either
advances it, one body evaluation, storing the result where revolve's split
point says, or, when ``cur`` is the step to reverse next (``fine - 1``), takes
that step's VJP (the body with its residuals, then the linear body's
transpose). The two sit in the branches of one ``lax.cond``, so each iteration
evaluates the body once, as the two loops did (the advances plus one per VJP),
and the program holds the body's forward once (the advance, the same program
as the forward loop's body) and its VJP once, whatever the number of levels.

XLA:CPU compiles every fusion of a program as an LLVM module of its own, so
the bookkeeping is kept to a few scalar ops: the split point is one lookup in a
table of ``split_point(length, slots)`` for a bounded loop
(:func:`~jaxaot.loops.placement.split_points`), else a binary search of the
binomial table by dynamic slices (a compare-and-sum over a row is a reduction,
two more kernels). The integer state travels as one int32 vector.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot.loops.api import while_loop
from jaxaot.loops.common import read_row, strong, write_row

#: Entries of the carried int32 vector before the snapshot positions.
_FINE, _CUR, _TOP, _RESTORE, _HEAD = range(5)


def search_split(table: Any) -> Callable:
    """``split(length, slots)``: ``revolve.split_point`` from a binomial table (rows ``beta(s, .)``,
    ``s`` up to the slots), the repetition number found by a binary search of dynamic slices."""
    width = int(table.shape[1])
    flat = jnp.asarray(table).reshape(-1)

    def split(length, slots):
        base = slots * width
        r = jnp.zeros((), jnp.int32)  # how many entries of row `slots` are below length
        step = 1 << (width - 1).bit_length()
        while step:
            cand = r + step
            below = read_row(flat, base + jnp.minimum(cand, width) - 1) < length
            r = jnp.where((cand <= width) & below, cand, r)
            step >>= 1
        r = jnp.minimum(r, width - 1)  # as revolve.split_point_jax: beyond the table, its last column
        b_s = jnp.where(r >= 2, read_row(flat, base + jnp.maximum(r - 2, 0)), 0)
        b_s1 = read_row(flat, base - width + r)
        return jnp.clip(jnp.maximum(b_s, length - b_s1), 1, length - 1)

    return split


def lookup_split(points: np.ndarray, longest: int) -> Callable:
    """``split(length, slots)`` read from ``points``, the flattened ``split_point(length, slots)`` for
    ``length <= longest`` (rows of ``longest + 1``, one per slot count)."""
    flat = jnp.asarray(points)

    def split(length, slots):
        return read_row(flat, slots * (longest + 1) + jnp.minimum(length, longest)).astype(jnp.int32)

    return split


def stepper(advance: Callable, vjp: Callable) -> Callable:
    """``step(reversing, x, buf, slot, ct, acc) -> (y, ct, acc)``: the one step program of both loops.

    Not ``reversing``: ``y = advance(x)``. ``reversing``: ``(ct, acc) = vjp(x, ct, acc)`` and ``y``
    is snapshot ``slot`` of ``buf``, the state the backward goes on from (read in the branch,
    so an advance pays no select between the two).
    """
    def backward(x, buf, slot, ct, acc):
        ct, acc = vjp(x, ct, acc)
        return [strong(read_row(b, slot)) for b in buf], ct, acc

    def forward(x, buf, slot, ct, acc):
        return advance(x), ct, acc

    def step(reversing, x, buf, slot, ct, acc):
        return lax.cond(reversing, backward, forward, list(x), list(buf), slot, list(ct), list(acc))

    return step


def reverse(step: Callable, n: Any, pos: Any, slot_of: Any, top: Any, buf: Sequence[Any],
            ct: Sequence[Any], acc: Sequence[Any], k: int, split: Callable) -> tuple[list, list]:
    """Reverse ``n`` steps from the snapshots ``buf`` (``k + 1`` rows, the last a scratch slot;
    level ``a <= top`` at step ``pos[a]`` in slot ``slot_of[a]``, ``pos`` -1 past the top level).

    ``step`` is :func:`stepper`'s; ``split(length, slots)`` revolve's split point
    (:func:`lookup_split`, :func:`search_split`), asked for ``length`` of at least 2 and
    ``slots`` from 2 to ``k``. Returns the carry's cotangent and the linear consts'
    (``acc`` plus theirs). The loop is a ``checkpoints=k`` loop itself, so reverse mode
    over this reverse mode stays bounded.
    """
    levels = jnp.asarray(np.arange(k, dtype=np.int32))
    t0 = jnp.maximum(top, 0)
    head = jnp.stack([jnp.asarray(n, jnp.int32), read_row(pos, t0), jnp.asarray(top, jnp.int32)])
    x0 = [strong(read_row(b, read_row(slot_of, t0))) for b in buf]

    def body(state):
        (fine, cur, top), pos, x, buf, ct, acc = state
        reversing = cur == fine - 1
        p_top = read_row(pos, jnp.maximum(top, 0))
        slots = k - top
        push = ~reversing & (slots > 1) & (cur + 1 == p_top + split(jnp.maximum(fine - p_top, 2),
                                                                      jnp.clip(slots, 2, k)))
        fine = fine - reversing.astype(jnp.int32)
        pop = reversing & (p_top == fine)
        new_top = top + push.astype(jnp.int32) - pop.astype(jnp.int32)
        y, ct, acc = step(reversing, x, buf, read_row(slot_of, jnp.maximum(new_top, 0)), ct, acc)
        slot = jnp.where(push, read_row(slot_of, jnp.clip(top + 1, 0, k - 1)), k)
        buf = [write_row(b, slot, a) for b, a in zip(buf, y)]
        pos = jnp.where(pop & (levels == top), -1, jnp.where(push & (levels == new_top), cur + 1, pos))
        cur = jnp.where(reversing, read_row(pos, jnp.maximum(new_top, 0)), cur + 1)
        return (fine, cur, new_top), pos, [strong(a) for a in y], buf, list(ct), list(acc)

    state = ((head[0], head[1], head[2]), pos.astype(jnp.int32), x0, list(buf), [strong(c) for c in ct],
             [strong(a) for a in acc])
    *_, ct, acc = while_loop(lambda s: s[0][0] > 0, body, state, checkpoints=k)
    return list(ct), list(acc)
