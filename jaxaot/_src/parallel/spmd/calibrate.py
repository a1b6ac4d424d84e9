"""Per-pass times of the compiled pipeline's own stage programs, for the lockstep simulator.

Inside the compiled step the passes are inlined, so the simulator needs their
times there, not those of separate launches. :func:`pass_times` runs each pass
``n`` times in a ``lax.fori_loop`` behind an optimization barrier, and takes
``(T(2n) - T(n)) / n``, which cancels the launch; ``n`` grows until the loop runs
:data:`MIN_LOOP_SECONDS`, well above the timer's jitter. Medians over ``repeats``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src.parallel.simulator import OpTimes
from jaxaot._src.parallel.spmd.passes import StagePasses


def _looped(fn: Callable[..., list], n: int) -> Callable:
    """``fn`` run ``n`` times in one program.

    The arguments pass through ``lax.optimization_barrier`` together with the loop's carry in every
    iteration, so XLA can neither hoist the pass out of the loop nor merge iterations (a barrier costs no
    copy); the carry takes a zero-weighted sum of the outputs, so nothing is dead.
    """

    def run(*args):
        def body(_, carry):
            args_now, _ = jax.lax.optimization_barrier((args, carry))
            outs = fn(*args_now)
            total = sum(jnp.sum(o).astype(jnp.float32) for o in jax.tree.leaves(outs) if o is not None)
            return carry + total * 0.0
        return jax.lax.fori_loop(0, n, body, jnp.float32(0))

    return jax.jit(run)


#: How long the short loop of a pass must run: its difference with the long loop is then ``n`` passes of at
#: least this, far above the timer's jitter on a loaded host.
MIN_LOOP_SECONDS = 2e-3
#: The most passes one loop runs (a pass of a nanosecond still ends within milliseconds).
MAX_LOOP_PASSES = 1 << 16


def _seconds(fn: Callable, args: Sequence[Any], repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _autoranged(fn: Callable[..., list], args: Sequence[Any], n: int) -> tuple[int, Callable]:
    """``(n, fn looped n times)`` with ``n`` grown from the given one until the loop runs
    :data:`MIN_LOOP_SECONDS` (or :data:`MAX_LOOP_PASSES`); compiled and warm."""
    while True:
        looped = _looped(fn, n)
        jax.block_until_ready(looped(*args))  # compile
        t = _seconds(looped, args)
        if t >= MIN_LOOP_SECONDS or n >= MAX_LOOP_PASSES:
            return n, looped
        n = min(MAX_LOOP_PASSES, n * max(2, int(MIN_LOOP_SECONDS / max(t, 1e-7) * 1.5)))


def _time(fns: dict, args: dict, repeats: int) -> dict:
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(*args[k[0]]))
            samples[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}


def pass_times(passes: Sequence[StagePasses], params: Sequence[Sequence[Any]], inputs: Sequence[Any],
               targets: Sequence[Any], scale: float, *, n: int = 8, repeats: int = 5) -> OpTimes:
    """F, B, W and BW per stage, from compiled loops of each pass (see the module docstring); ``n`` is the
    shortest loop length tried.

    Args:
      passes: the stages' passes (one device's microbatch shapes).
      params: per stage, its parameter leaves; inputs / targets: one device's microbatch, as leaves.
      scale: the loss cotangent (``1 / num_microbatches``).
    """
    last = len(passes) - 1
    device = jax.devices()[0]
    acts, jobs, args = list(inputs), {}, {}
    for s, ps in enumerate(passes):
        p = jax.device_put(list(params[s]), device)
        ts = list(targets) if s == last else []
        outs, stored = jax.jit(ps.forward)(p, acts, ts)
        ct = [jnp.asarray(scale, ps.output_avals[0].dtype)] if s == last else [
            jnp.ones(ps.output_avals[i].shape, ps.output_avals[i].dtype) for i in ps.cotangent_outputs]
        args[f"F{s}"] = (acts, p, ts)
        jobs[(f"F{s}", "F", s)] = lambda a, p, t, ps=ps: ps.forward(p, a, t)
        args[f"BW{s}"] = (stored, p, ct)
        jobs[(f"BW{s}", "BW", s)] = lambda st, p, c, ps=ps: ps.backward(p, st, c)
        if ps.split is not None:
            args[f"B{s}"] = (stored, p, ct)
            jobs[(f"B{s}", "B", s)] = lambda st, p, c, ps=ps: ps.backward_input(p, st, c)
            _, wstored = jax.jit(ps.backward_input)(p, stored, ct)
            args[f"W{s}"] = (wstored, p)
            jobs[(f"W{s}", "W", s)] = lambda w, p, ps=ps: ps.backward_weight(p, w)
        acts = outs
    lengths, short, long = {}, {}, {}
    for k, fn in jobs.items():
        lengths[k[0]], short[k] = _autoranged(fn, args[k[0]], n)
        long[(k[0] + "+", *k[1:])] = _looped(fn, 2 * lengths[k[0]])
        jax.block_until_ready(long[(k[0] + "+", *k[1:])](*args[k[0]]))  # compile
    args.update({k + "+": v for k, v in list(args.items())})
    med = _time({**short, **long}, args, repeats)
    per: dict[str, list[float]] = {op: [0.0] * len(passes) for op in ("F", "B", "W", "BW")}
    for (name, op, s), t_short in ((k, v) for k, v in med.items() if not k[0].endswith("+")):
        per[op][s] = max(0.0, (med[(name + "+", op, s)] - t_short) / lengths[name])
    for s, ps in enumerate(passes):
        if ps.split is None:  # not split by the schedule: B + W stand for BW
            per["B"][s], per["W"][s] = per["BW"][s] / 2, per["BW"][s] / 2
    return OpTimes(tuple(per["F"]), tuple(per["B"]), tuple(per["W"]), tuple(per["BW"]), 0.0)
