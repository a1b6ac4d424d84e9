"""The revolve backward as one loop: one body evaluation per iteration, the VJP under a ``cond``.

The transpose of a ``checkpoints=k`` loop advances from the nearest snapshot to
each step, last first, and takes its VJP. :func:`reverse` runs both as one loop
whose iteration either advances one step or takes the VJP, the branches of one
``lax.cond`` (:func:`stepper`), so the backward holds the body's forward and VJP
once each, however many levels revolve uses. Its bookkeeping is a few scalar ops
(:func:`lookup_split`, :func:`search_split`), since XLA:CPU compiles every fusion on
its own.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src.loops.wrappers import while_loop
from jaxaot._src.loops.common import read_row, strong, write_row

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
    """``step(reversing, x, buf, slot, ct, acc) -> (y, ct, acc)``: an iteration's body evaluation.

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
    t0 = jnp.maximum(top, 0)
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
        at = jnp.clip(jnp.where(push, new_top, top), 0, k - 1)  # one level changes: a push or a pop
        pos = write_row(pos, at, jnp.where(push, cur + 1, jnp.where(pop, -1, read_row(pos, at))))
        cur = jnp.where(reversing, read_row(pos, jnp.maximum(new_top, 0)), cur + 1)
        return (fine, cur, new_top), pos, [strong(a) for a in y], buf, list(ct), list(acc)

    head = (jnp.asarray(n, jnp.int32), read_row(pos, t0).astype(jnp.int32), jnp.asarray(top, jnp.int32))
    state = (head, pos.astype(jnp.int32), x0, list(buf), [strong(c) for c in ct], [strong(a) for a in acc])
    *_, ct, acc = while_loop(lambda s: s[0][0] > 0, body, state, checkpoints=k)
    return list(ct), list(acc)
