"""``max_steps=N`` on CPUs: a stack whose cost follows the steps run, not N.

A CPU pays for zeroing each page of a fresh N-row stack, which for a short loop
with a generous bound is most of the gradient's time. So on CPUs a loop whose stack
would exceed :data:`MIN_STACK_BYTES` stacks its first :data:`MIN_SEGMENT` steps, then
runs on in segments of about ``sqrt(N)`` steps, recomputed in the backward: memory
and time follow the steps run. GPUs and TPUs keep one stack; ``jaxaot.config.stack_segments``
forces either.

Example:
    >>> segment_steps(100), segment_steps(4096), segment_steps(16384), segment_steps(10**6)
    (None, 64, 128, 1000)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot._src.config import config
from jaxaot._src.loops.common import INT, Loop, pick, stack_loop, trace_flat, while_loop_p
from jaxaot._src.loops.overflow import guard_tangents, overflow_scale, poison

#: The fewest steps per segment: shorter segments cost more loop iterations than the zeroing they save.
MIN_SEGMENT = 64
#: A stack of at most this many bytes stays one stack: cheap to zero, and its program holds the body once.
MIN_STACK_BYTES = 1 << 20
_PLATFORMS = ("cpu",)


def segments_here() -> bool:
    """``jaxaot.config.stack_segments`` if set, else whether the default backend is a CPU."""
    if config.stack_segments is not None:
        return config.stack_segments
    return jax.default_backend() in _PLATFORMS


def segment_steps(max_steps: int) -> int | None:
    """Steps per segment for a ``max_steps`` stack, or None when one stack of ``max_steps`` rows is
    as cheap (``max_steps`` at most twice a segment)."""
    steps = max(MIN_SEGMENT, math.isqrt(max_steps - 1) + 1)
    return steps if max_steps > 2 * steps else None


def applies(loop: Loop, residual_avals: Sequence[Any]) -> int | None:
    """The segment length for reverse-differentiating ``loop``, whose steps keep ``residual_avals``, here;
    None for one stack: on GPUs and TPUs, for a body with effects, and for a stack of at most
    :data:`MIN_STACK_BYTES` (cheap to zero, and one stack compiles faster: its program holds the body
    once, the segments' three times), or of a size known only when called (a symbolic dimension of an
    exported program)."""
    if loop.prim is not while_loop_p or loop.max_steps is None or loop.checkpoints is not None:
        return None
    if loop.effects() or not segments_here():
        return None
    if not all(isinstance(d, int) for a in residual_avals for d in a.shape):
        return None
    row = sum(math.prod(a.shape) * a.dtype.itemsize for a in residual_avals)
    return segment_steps(loop.max_steps) if loop.max_steps * row > MIN_STACK_BYTES else None


def _with_counter(loop: Loop, stop: Any) -> tuple[Any, Any]:
    """``(body, cond)`` over ``(consts, counter, carry)``: the loop's own, the counter incremented per step,
    and the condition also requiring ``stop(counter)``."""
    k = loop.num_consts

    def body(*a):
        return [a[k] + 1, *C.eval_closed(loop.body, *a[:k], *a[k + 1:])]

    def cond(*a):
        return [C.eval_closed(loop.cond, *a[:k], *a[k + 1:])[0] & stop(a[k])]

    avals = [*loop.const_avals, C.ShapedArray((), INT), *loop.carry_avals]
    return trace_flat(body, avals), trace_flat(cond, avals)


def run(loop: Loop, steps: int, consts: Sequence[Any], carry: Sequence[Any], carry_uk: Sequence[bool], trace: Any,
        still_running: Callable[[list], Any], run_past: Callable[[list, Any], list]) -> list:
    """The loop's outputs, its forward run as a first segment of ``steps`` steps and an outer loop of
    segments of ``steps`` (see the module docstring), bound on the partial-eval ``trace`` so that each
    loop's own reverse mode splits it. The segments are stacking loops (``while_loop_stack_output``
    with no stacked output), bounded by their length: none checks an overflow of its own.
    ``still_running(known)`` is the loop's condition on the known outputs (``carry_uk`` says which are
    unknown): true past ``max_steps`` is an overflow, where ``run_past(known, overflowed)`` runs the known
    carries on without a stack (the outputs never depend on ``max_steps``) and the unknown ones, the
    tangents, are NaN and checked where they are used, as one stack's are."""
    k, n_max, m = loop.num_consts, loop.max_steps, loop.num_carry
    body, cond = _with_counter(loop, lambda i: i < n_max)
    first = stack_loop(cond, body, k, 1 + m, MIN_SEGMENT)  # a short loop's whole stack: no longer than needed
    segment = stack_loop(cond, body, k, 1 + m, steps)

    def outer_body(*a):
        i, *carry = segment.split_out(segment.bind(list(a)))[0]
        return [i, *carry]

    avals = [*loop.const_avals, C.ShapedArray((), INT), *loop.carry_avals]
    outer = stack_loop(cond, trace_flat(outer_body, avals), k, 1 + m, -(-(n_max - MIN_SEGMENT) // steps))
    with C.tracing_into(trace):
        i, *carry = first.split_out(first.bind([*consts, jnp.zeros((), INT), *carry]))[0]
        i, *carry = outer.split_out(outer.bind([*consts, i, *carry]))[0]
    known = [C.known_value(c) for c, uk in zip(carry, carry_uk) if not uk]
    overflowed = (C.known_value(i) >= n_max) & still_running(known)
    known = run_past(known, overflowed)
    with C.tracing_into(trace):
        unknown = guard_tangents(overflowed, n_max, poison(overflow_scale(overflowed), pick(carry_uk, carry)))
    return C.merge_lists(carry_uk, known, unknown)
