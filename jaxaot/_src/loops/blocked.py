"""``checkpoints=k`` loops in blocks of steps per predicate check (GPUs): the forward and the revolve backward.

On a GPU each run-time predicate of a while loop is a wait on the host, so the
``checkpoints=k`` loops check theirs once per block of steps (:func:`blocks`), each
step masked once the loop is done. There every unfused op of a step is a kernel
launch, so a step's integer bookkeeping is one small int32 vector (:func:`tally`),
computed first in one fused op and carried whole: the step's masked state update
and its snapshot write read the flag and slot they need from it, and no old value
outlives the new one (which would cost a copy per carried scalar and step).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.config import config
from jaxaot._src.loops.common import read_row, strong, write_row
from jaxaot._src.loops.wrappers import while_loop

#: The entries of :func:`tally`'s vector before the snapshot positions: the step being reversed
#: (the VJPs left), the step the recomputed state is at, the top level, the step's flag (it ran /
#: its VJP is live) and the snapshot slot it writes or reads.
FINE, CUR, TOP, FLAG, SLOT = range(5)
_POS = 5
#: The entries of the forward's vector before the step number and the placement's levels: whether
#: the step runs, the snapshot slot it writes.
_RUNS, _WRITES = range(2)


def blocks(cond: Any, step: Any, state: Any, block: int, k: int) -> Any:
    """``while cond(state): state = step(state, start)``, checking ``cond`` once per ``block``
    steps. ``step`` must leave the state unchanged once ``cond`` fails (masked), and
    gets the state its block started from (which ``cond`` held for). Either way the
    loop is a ``checkpoints=k`` loop, so reverse over reverse stays bounded."""
    if block == 1:
        return while_loop(cond, lambda s: step(s, s), state, checkpoints=k)
    unroll = block if config.unroll_blocks else 1  # no loop counter or carry copy per step; a longer compile
    return while_loop(cond, lambda s: C.lax_fori_loop(0, block, lambda _, t: step(t, s), s, unroll=unroll), state,
                      checkpoints=k)


def where(pred: Any, new: Sequence[Any], old: Sequence[Any]) -> list:
    return [jnp.where(pred, a, b) for a, b in zip(new, old)]


def tally(fine: Any, cur: Any, top: Any, flag: Any, slot: Any, pos: Any) -> Any:
    """The backward's int32 bookkeeping as one vector: the :data:`FINE` ... :data:`SLOT` entries, then
    the k levels' steps (-1 past the top level)."""
    head = jnp.stack([jnp.asarray(a).astype(jnp.int32) for a in (fine, cur, top, flag, slot)])
    return jnp.concatenate([head, pos.astype(jnp.int32)])


def levels_of(v: Any) -> Any:
    """The levels' steps of a :func:`tally` vector."""
    return v[_POS:]


def forward(running: Callable, decide: Callable, advance: Callable, state: tuple, block: int, k: int) -> tuple:
    """The forward loop ``state = (x, i, levels, snaps)`` in blocks: while ``running((x, i))``, store
    the state before step ``i`` in snapshot slot ``decide(i, levels)[0]`` (k: the scratch slot) and
    step it with ``advance``.

    The integers (``i``, the placement's ``levels``, the step's flag and slot) are one int32 vector.
    A step past the loop's end changes nothing, and runs the body on the block's first state (one
    it ran on) rather than on the final state, where it may be invalid. The snapshot written is the
    body's input, so nothing but the masked selects reads the old state (no copy of it).
    """
    x, i, levels, snaps = state
    leaves, tree = jax.tree.flatten((i, levels))

    def pack(go, slot, ints):  # the _RUNS and _WRITES entries, then the integers' leaves
        flat = [jnp.ravel(a).astype(jnp.int32) for a in jax.tree.leaves(ints)]
        return jnp.concatenate([jnp.stack([go.astype(jnp.int32), slot.astype(jnp.int32)]), *flat])

    def unpack(v):
        parts, at = [], _WRITES + 1
        for a in leaves:
            parts.append(v[at:at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        return jax.tree.unflatten(tree, parts)

    def step(state, start):
        x, v, snaps = state
        i, levels = unpack(v)
        go = running((x, i))
        slot, new = decide(i, levels)
        v = lax.optimization_barrier(pack(go, jnp.where(go, slot, k), (i + go.astype(i.dtype), jax.tree.map(
            lambda a, b: jnp.where(go, a, b), new, levels))))
        run = v[_RUNS] > 0
        x_in = where(run, x, start[0])  # what the slot gets: past the end, the scratch slot
        snaps = [write_row(b, v[_WRITES], a) for b, a in zip(snaps, x_in)]
        return where(run, advance(x_in), x), v, snaps

    state = (list(x), pack(jnp.bool_(False), jnp.int32(k), (i, levels)), list(snaps))
    x, v, snaps = blocks(lambda s: running((s[0], unpack(s[1])[0])), step, state, block, k)
    i, levels = unpack(v)
    return x, i, levels, snaps


def reverse(advance: Callable, vjp: Callable, n: Any, pos: Any, slot_of: Any, top: Any, buf: Sequence[Any],
            ct: Sequence[Any], acc: Sequence[Any], k: int, block: int, split: Callable) -> tuple[list, list]:
    """Reverse ``n`` steps from the snapshots ``buf`` (``k + 1`` rows, the last a scratch slot; level
    ``a <= top`` at step ``pos[a]`` in slot ``slot_of[a]``), checking each loop's predicate once per
    ``block`` steps: a loop whose iteration advances from the top snapshot in one blocked loop, then
    takes the VJPs of the run of steps stored there in another.

    ``advance(x)`` is the body's step, ``vjp(x, ct) -> (linear consts' cotangents, carry's)`` its
    VJP; ``split(length, slots)`` revolve's split point. Returns the carry's cotangent and the
    linear consts' (``acc`` plus theirs), as :func:`jaxaot._src.loops.sweep.reverse`.
    """
    slot_of = jnp.asarray(slot_of, jnp.int32)
    level = jnp.arange(k, dtype=jnp.int32)

    def sweep_tally(v):  # one recomputation step's bookkeeping towards fine - 1 (none once there)
        fine, cur, top, pos = v[FINE], v[CUR], v[TOP], levels_of(v)
        go = cur < fine - 1
        p_top = read_row(pos, top)
        slots = k - top
        target = jnp.where(slots > 1, p_top + split(jnp.maximum(fine - p_top, 2), jnp.clip(slots, 2, k)), -1)
        cur = cur + go.astype(jnp.int32)
        push = go & (cur == target)
        slot = jnp.where(push, read_row(slot_of, jnp.minimum(top + 1, k - 1)), k)
        pos = jnp.where(push & (level == top + 1), cur, pos)
        return tally(fine, cur, top + push.astype(jnp.int32), go, slot, pos)

    def sweep_step(state, _):
        v, x, buf = state
        v = lax.optimization_barrier(sweep_tally(v))
        x = where(v[FLAG] > 0, [strong(a) for a in advance(x)], x)
        return v, x, [write_row(b, v[SLOT], a) for b, a in zip(buf, x)]

    def run_live(v):  # the top snapshot is the state of step fine - 1: its VJP needs no recomputation
        fine, top = v[FINE], v[TOP]
        return (fine > 0) & (top >= 0) & (read_row(levels_of(v), jnp.maximum(top, 0)) == fine - 1)

    def pop_tally(v, live):  # the VJP of step fine - 1, at the top snapshot (slot) or the recomputed state
        fine, cur, top, pos = v[FINE], v[CUR], v[TOP], levels_of(v)
        t = jnp.maximum(top, 0)
        fine = fine - live.astype(jnp.int32)
        pop = live & (read_row(pos, t) == fine)
        pos = jnp.where(pop & (level == top), -1, pos)
        return tally(fine, cur, top - pop.astype(jnp.int32), live, read_row(slot_of, t), pos)

    def take_vjp(v, x, ct, acc, masked):
        ct_lc, new_ct = vjp(x, ct)
        if masked:
            live = v[FLAG] > 0
            ct_lc, new_ct = where(live, ct_lc, [jnp.zeros_like(g) for g in ct_lc]), where(live, new_ct, ct)
        return [strong(g) for g in new_ct], [strong(a + g) for a, g in zip(acc, ct_lc)]

    def run_step(state, _, buf):
        v, ct, acc = state
        v = lax.optimization_barrier(pop_tally(v, run_live(v)))
        x = [read_row(b, v[SLOT]) for b in buf]
        return (v, *take_vjp(v, x, ct, acc, True))

    def outer(state):
        v, buf, ct, acc = state
        top, pos = v[TOP], levels_of(v)
        x = [strong(read_row(b, read_row(slot_of, top))) for b in buf]
        v = tally(v[FINE], read_row(pos, top), top, 0, k, pos)
        v, x, buf = blocks(lambda s: s[0][CUR] < s[0][FINE] - 1, sweep_step, (v, x, buf), block, k)
        v = pop_tally(v, jnp.bool_(True))
        ct, acc = take_vjp(v, x, ct, acc, False)
        # then the run of steps whose state is the top snapshot: no recomputation between them
        v, ct, acc = blocks(lambda s: run_live(s[0]), lambda s, start: run_step(s, start, buf), (v, ct, acc),
                            block, k)
        return v, buf, ct, acc

    v = tally(jnp.asarray(n, jnp.int32), 0, top, 0, k, pos)
    state = (v, list(buf), [strong(c) for c in ct], [strong(a) for a in acc])
    _, _, ct, acc = while_loop(lambda s: s[0][FINE] > 0, outer, state, checkpoints=k)
    return list(ct), list(acc)
