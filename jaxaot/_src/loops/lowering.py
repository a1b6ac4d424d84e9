"""Running the loop primitives: one ``lax.while_loop``, or blocks of them on GPUs.

:func:`run_loop` is the impl and lowering of all three primitives. On a GPU, a
while loop whose trip count XLA cannot infer copies its predicate to the host and
synchronises every iteration, so there (``blocked=True``) a counted loop runs as
blocks of constant trip count, and a stacking loop runs a few iterations per
check speculatively (a step past the end changes nothing). CPUs and TPUs keep the
plain loop; ``jaxaot.config.blocked_loops`` selects the blocked form everywhere.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.config import config
from jaxaot._src.loops.common import INT, Loop, loop_of, read_row, strong, while_loop_p, write_row

#: Platforms whose lowering runs the blocked loops.
BLOCKED_PLATFORMS = ("cuda", "rocm")
_MIN_BLOCKED_LENGTH = 16
_SPECULATE_BLOCK = 8
_UNBOUNDED_LOOPS = ("while", "while_loop", "while_loop_stack_output")


def run_loop(loop: Loop, args: Sequence[Any], blocked: bool = False) -> list:
    """Evaluate a loop on ``args`` (its operands) with ``lax.while_loop``.

    ``blocked`` (the GPU lowering) runs the loop in blocks of a constant trip count.
    """
    n, consts, carry, xs = loop.split(args)
    carry = [strong(c) for c in carry]

    def cond_value(c):
        return C.eval_closed(loop.cond, *consts, *c)[0]

    if loop.prim is while_loop_p:
        def plain_body(c):
            return [strong(x) for x in C.eval_closed(loop.body, *consts, *c)]
        return list(C.lax_while_loop(cond_value, plain_body, carry))

    ys0 = [C.vary_like(jnp.zeros((loop.length, *a.shape), a.dtype), a) for a in loop.y_row_avals]

    def cond(state):
        i, c, _ = state
        if loop.counted:
            return i < n
        return jnp.logical_and(i < loop.length, cond_value(c))

    def body(state):
        i, c, ys = state
        j = n - 1 - i if loop.reverse else i
        rows = [read_row(x, j) for x in xs]
        new_c, y_rows = C.split_list(C.eval_closed(loop.body, *consts, *c, *rows), [loop.num_carry])
        ys = [write_row(y, j, r) for y, r in zip(ys, y_rows)]
        return i + 1, [strong(x) for x in new_c], ys

    state0 = (jnp.zeros((), INT), carry, ys0)
    if loop.counted and blocked:
        i, c, ys = _blocked_counted(body, n, loop.length, state0)
    elif loop.stacks and blocked and _speculate(loop):
        i, c, ys = _speculative_stack(loop, consts, state0, cond_value, cond, body)
    else:
        i, c, ys = C.lax_while_loop(cond, body, state0)
    outs = [*c, *ys]
    if loop.stacks:
        overflowed = jnp.logical_and(i >= loop.length, cond_value(c))
        outs += [i, overflowed]
    return outs


def lowering_rule(prim: Any, blocked: bool | None) -> Callable:
    """The MLIR lowering of ``prim``: blocked or not, or (None) as ``jaxaot.config.blocked_loops`` says
    when the loop is lowered."""
    return C.lower_fun(partial(_run_prim, prim, blocked=blocked), multiple_results=True)


def _run_prim(prim: Any, *args: Any, blocked: bool | None, **params: Any) -> list:
    return run_loop(loop_of(prim, params), args, config.blocked_loops if blocked is None else blocked)


def _block_size(length: int) -> int:
    return max(1, int(np.sqrt(length))) if length >= _MIN_BLOCKED_LENGTH else 1


def _blocked_counted(body: Callable, n: Any, length: int, state0: Any) -> Any:
    def plain(state):
        return C.lax_while_loop(lambda s: s[0] < n, body, state)

    b = _block_size(length)
    if b <= 1:
        return plain(state0)
    full = (n // b) * b

    def block(state):
        return C.lax_fori_loop(0, b, lambda _, s: body(s), state)

    return plain(C.lax_while_loop(lambda s: s[0] < full, block, state0))


def _has_unbounded_loop(closed: Any) -> bool:
    """Whether a jaxpr runs a cond-driven loop (one that, speculatively run on a state
    past the outer loop's end, might never stop)."""
    return any(str(eqn.primitive) in _UNBOUNDED_LOOPS for eqn in C.iter_eqns(closed))


def _speculate(loop: Loop) -> bool:
    return (loop.num_xs == 0 and loop.length >= _MIN_BLOCKED_LENGTH and not loop.effects()
            and not _has_unbounded_loop(loop.body))


def _speculative_stack(loop: Loop, consts: Sequence[Any], state0: Any, cond_value: Callable,
                       cond: Callable, body: Callable) -> Any:
    """The stacking loop, ``_SPECULATE_BLOCK`` iterations per outer step while that many
    rows are free, then the plain loop for the rest (at most one check if it stopped).

    Inside a block the row index stays below the capacity, so each iteration writes
    its row unconditionally; the carry and the counter are selected. The iterations after
    the stop write row ``num_steps`` (the counter stays there), which is set back to zero
    once the blocks end, as the plain loop leaves it: one row's write, not a select per step."""
    b = _SPECULATE_BLOCK

    def step(_, state):
        i, c, ys, running = state
        pred = jnp.logical_and(running, cond_value(c))
        new_c, y_rows = C.split_list(C.eval_closed(loop.body, *consts, *c), [loop.num_carry])
        new_c = [lax.select(pred, strong(a), a0) for a, a0 in zip(new_c, c)]
        ys = [write_row(y, i, r) for y, r in zip(ys, y_rows)]
        return i + pred.astype(INT), new_c, ys, pred

    def block(state):
        return C.lax_fori_loop(0, b, step, state)

    def block_cond(state):
        return jnp.logical_and(state[3], state[0] <= loop.length - b)

    i, c, ys, running = C.lax_while_loop(block_cond, block, (*state0, jnp.asarray(True)))
    last = jnp.minimum(i, loop.length - 1)  # below the capacity wherever a block stopped
    ys = [write_row(y, last, jnp.where(running, read_row(y, last), jnp.zeros((), y.dtype))) for y in ys]
    return C.lax_while_loop(cond, body, (i, c, ys))
