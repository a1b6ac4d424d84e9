"""``while_loop(..., max_steps=N, checkpoints=k)``: an offline checkpointing schedule.

With the bound N known at trace time, reverse mode needs no run-time decisions:
the loop runs as nested scans of static lengths (at most k snapshots in all), each
level but the innermost under ``jax.checkpoint``, every step masked past the loop's
end, so on a GPU no iteration waits for a predicate on the host.
``checkpoint_memory="host"`` keeps the snapshots in host memory. On CPUs and TPUs,
where compile time is the cost that counts, a bounded loop runs the binomial
schedule of :mod:`jaxaot._src.loops.checkpointed` instead (:func:`schedule`), as it
does where no nested plan fits.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from jaxaot._src import compat as C
from jaxaot._src.config import config
from jaxaot.errors import InvalidLoopOptionError
from jaxaot._src.loops.common import Loop, zero_tangent
from jaxaot._src.loops.overflow import check_overflow, overflow_scale, poison


#: The innermost level's steps are unrolled up to this many: a GPU runs each iteration of even
#: a static-length loop as separate launches, so one unrolled level cuts the step's cost
#: (``docs/concepts/loops.md``). The program holds that many bodies.
MAX_UNROLL = 16
#: ... and to at most about this many eqns of body and condition in all (sub-jaxprs counted):
#: a large body (a physics step's solver) is not unrolled, so the program, and its compile
#: time, stay near the ``max_steps`` mode's (:func:`unroll_for`).
UNROLL_EQNS = 256


def _host_policy(name: str) -> Callable:
    """Offload the values named ``name`` to host memory; save nothing else."""
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(), names_which_can_be_offloaded=(name,),
        offload_src="device", offload_dst="pinned_host")


def plan(max_steps: int, checkpoints: int) -> tuple[int, ...] | None:
    """Level sizes, outermost first, for a loop of at most ``max_steps`` steps and ``checkpoints``
    stored carries; None when no nested plan fits (``checkpoints < ~2 log2(max_steps)``).

    The fewest levels that fit (each level is one more body evaluation per step); among
    those, the fewest masked steps past ``max_steps``, then the smallest innermost level
    (its steps keep full residuals). Inner levels share one size, the outer one takes the rest.

    Example:
        >>> plan(2000, 40), plan(2000, 100), plan(30, 40), plan(2000, 10)
        ((20, 10, 10), (50, 40), (30,), None)
    """
    if max_steps <= checkpoints:
        return (max_steps,)
    for depth in range(2, max_steps.bit_length() + 1):
        best = None
        for inner in range(2, checkpoints):
            outer = math.ceil(max_steps / inner ** (depth - 1))
            sizes = (outer, *[inner] * (depth - 1))
            if outer < 1 or sum(sizes) > checkpoints:
                continue
            key = (math.prod(sizes), inner)
            if best is None or key < best[0]:
                best = (key, sizes)
        if best is not None:
            return best[1]
    return None


def plan_host(max_steps: int, checkpoints: int) -> tuple[int, ...] | None:
    """Level sizes for ``checkpoint_memory="host"``: an innermost level of at most
    :data:`MAX_UNROLL` steps (residuals on the device), and :func:`plan`'s levels for
    the rest with ``checkpoints`` host snapshots; None when those do not fit.

    Example:
        >>> plan_host(100_000, 1000), plan_host(2000, 200), plan_host(12, 5)
        ((625, 10, 16), (125, 16), (12,))
    """
    inner = min(max_steps, MAX_UNROLL)
    if inner == max_steps:
        return (max_steps,)
    outer = plan(math.ceil(max_steps / inner), checkpoints)
    return None if outer is None else (*outer, inner)


def plan_for(max_steps: int, checkpoints: int, checkpoint_memory: str) -> tuple[int, ...] | None:
    """The level sizes of an offline schedule: :func:`plan_host` for host snapshots, else :func:`plan`."""
    return (plan_host if checkpoint_memory == "host" else plan)(max_steps, checkpoints)


#: Platforms whose bounded loops run nested scans (their while loops wait on the host per iteration).
NESTED_PLATFORMS = ("gpu", "cuda", "rocm")


def schedule() -> str:
    """``"nested"`` (nested scans, when a plan fits) or ``"binomial"`` for a bounded loop traced now:
    ``jaxaot.config.offline_schedule`` if set, else nested scans on GPUs, where each iteration of a
    run-time trip count waits for its predicate on the host, and the binomial schedule elsewhere,
    whose program compiles in about the time of ``max_steps`` alone."""
    if config.offline_schedule is not None:
        return config.offline_schedule
    return "nested" if jax.default_backend() in NESTED_PLATFORMS else "binomial"


def nested(loop: Loop) -> bool:
    """Whether ``loop`` (``max_steps`` and ``checkpoints``) differentiates as nested scans: a plan
    fits, and the snapshots go to host memory or :func:`schedule` says so. Otherwise its reverse
    mode is the binomial schedule of :mod:`jaxaot._src.loops.checkpointed`, bounded by ``max_steps``."""
    if plan_for(loop.max_steps, loop.checkpoints, loop.checkpoint_memory) is None:
        return False
    return loop.checkpoint_memory == "host" or schedule() == "nested"


def check_body(loop_name: str, max_steps: int, checkpoints: int, checkpoint_memory: str, effects: Any) -> None:
    """Refuse a body with effects wherever a nested plan fits: the nested scans (on GPUs) would
    repeat them in masked steps, and the options must mean the same program on every platform.
    Where none fits, the binomial schedule refuses only the effects its recomputation must not
    run again, when the gradient is traced (:func:`jaxaot._src.loops.checkpointed.check_replay`)."""
    if plan_for(max_steps, checkpoints, checkpoint_memory) is None:
        return  # the binomial schedule runs no masked step
    if effects:
        raise InvalidLoopOptionError(
            f"{loop_name}: max_steps with checkpoints runs the body in masked steps past the loop's end (nested "
            f"scans, on GPUs), so its effects ({', '.join(sorted(map(str, effects)))}) would repeat. Use max_steps "
            f"alone for a body with effects (it recomputes no step), or checkpoints alone for one whose only effects "
            f"are unordered jax.debug callbacks (its backward runs them again where it recomputes a step)."
        )


def unroll_for(loop: Loop, length: int) -> int:
    """How many steps of the innermost level (``length`` steps) run unrolled: up to
    :data:`MAX_UNROLL`, and to :data:`UNROLL_EQNS` eqns of the body and condition in all.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> from jaxaot._src.loops.common import loop_of
        >>> def loop(body):
        ...     eqn = jax.make_jaxpr(lambda x: jaxaot.loops.while_loop(lambda c: c < 1.0, body, x))(0.0).jaxpr.eqns[0]
        ...     return loop_of(eqn.primitive, eqn.params)
        >>> big = lambda c: c + sum(jnp.sin(c * i) for i in range(100))  # about 300 eqns
        >>> unroll_for(loop(lambda c: c + 1.0), 10), unroll_for(loop(big), 10)
        (10, 1)
    """
    eqns = sum(1 for _ in C.iter_eqns(loop.body)) + sum(1 for _ in C.iter_eqns(loop.cond))
    return max(1, min(length, MAX_UNROLL, UNROLL_EQNS // max(eqns, 1)))


def _select(pred: Any, new: Sequence[Any], old: Sequence[Any]) -> list:
    return [jnp.where(pred, a, b) for a, b in zip(new, old)]


def _offload_to_host(fn: Callable, depth: int) -> Callable:
    """``fn(state)`` under ``jax.checkpoint``, its carry saved in host memory: the policy
    offloads the named carry, so nothing of ``fn`` stays on the device between passes.
    Each level has its own name: a policy also sees the names of the levels inside it,
    and would save their snapshots instead of recomputing them."""
    name = f"jaxaot_loop_snapshot_{depth}"

    def named(state):
        x, *rest = state
        return fn((checkpoint_name(x, name), *rest))

    return jax.checkpoint(named, prevent_cse=False, policy=_host_policy(name))


def run(loop: Loop, consts: Sequence[Any], carry: Sequence[Any]) -> list:
    """The loop as nested masked scans (:func:`plan_for`); raises on overflow at run time."""
    sizes = plan_for(loop.max_steps, loop.checkpoints, loop.checkpoint_memory)
    host = loop.checkpoint_memory == "host"
    safe = [lax.stop_gradient(x) for x in carry]  # the state masked steps evaluate the body on

    def cond(x):
        return C.eval_closed(loop.cond, *consts, *x)[0]

    def step(state, _):
        x, running, count = state
        live = running & cond(x)
        go = live & (count < loop.max_steps)  # past max_steps the carry freezes and the end check fails
        y = C.eval_closed(loop.body, *consts, *_select(go, x, safe))
        return (_select(go, y, x), live, count + go.astype(count.dtype)), None

    def skip_past_end(fn: Callable) -> Callable:  # one predicate read per chunk
        return lambda s: lax.cond(s[1] & cond(s[0]), fn, lambda t: t, s)

    def level(depth: int, state):
        if depth == len(sizes) - 1:
            return lax.scan(step, state, None, length=sizes[depth], unroll=unroll_for(loop, sizes[depth]))[0]
        inner = functools.partial(level, depth + 1)
        if host:  # XLA's GPU compiler rejects a conditional that yields values laid out in host
            # memory (jax 0.11.2; docs/benchmarks.md, Findings): skip chunks of the innermost
            # level only, inside the checkpoint whose carry goes to the host, so no branch yields one
            inner = skip_past_end(inner) if depth == len(sizes) - 2 else inner
            inner = _offload_to_host(inner, depth)
        else:
            inner = jax.checkpoint(inner, prevent_cse=False)
            inner = skip_past_end(inner) if depth == 0 else inner
        return lax.scan(lambda s, _: (inner(s), None), state, None, length=sizes[depth])[0]

    x, running, _ = level(0, (list(carry), jnp.bool_(True), jnp.int32(0)))
    overflowed = running & cond(x)
    check_overflow(overflowed, loop.max_steps)
    return poison(overflow_scale(overflowed), x)  # NaN values and derivatives past max_steps


def jvp(loop: Loop, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """The JVP rule of a ``while_loop`` with ``max_steps`` and ``checkpoints``: the JVP of :func:`run`,
    so reverse mode is JAX's own, of scans and ``jax.checkpoint``."""
    _, consts, carry, _ = loop.split(primals)
    _, dconsts, dcarry, _ = loop.split(tangents)

    def instantiate(x, t):
        if type(t) is not C.Zero:
            return t
        return C.zeros_float0(jnp.shape(x)) if not C.is_inexact(jnp.result_type(x)) else jnp.zeros_like(x)

    dconsts = [instantiate(x, t) for x, t in zip(consts, dconsts)]
    dcarry = [instantiate(x, t) for x, t in zip(carry, dcarry)]
    out, dout = jax.jvp(lambda c, x: run(loop, c, x), (list(consts), list(carry)), (dconsts, dcarry))
    dout = [zero_tangent(a) if not C.is_inexact(a.dtype) else t for a, t in zip(loop.carry_avals, dout)]
    return list(out), dout
