"""Timing one eqn on one device: what :class:`~jaxaot._src.partition.costs.measured_costs.MeasuredCosts` stores.

On an accelerator a single call's dispatch can outweigh a small kernel, so
:func:`profile_seconds` compiles the eqn alone and a chain of copies of it (each on
its own inputs, ordered by optimization barriers) and takes the difference per
copy. Inputs are constants, since the eqns measured take the same time whatever
their values; loops, conds, effects, symbolic shapes and opaque dtypes are not
measured (:func:`measurable`). :func:`signature` says when two eqns are the same.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.costs import op_profile
    >>> eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((64, 64)), jnp.ones((64, 64))).jaxpr.eqns[0]
    >>> op_profile.measurable(eqn)
    True
    >>> op_profile.profile_seconds(eqn, jax.devices()[0]) > 0
    True
    >>> op_profile.signature(eqn)[:11]
    'dot_general'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src import workers
from jaxaot._src.allowance import current_limit, holding
from jaxaot._src.partition.costs import cost_model, op_scaling
from jaxaot._src.partition.costs.autotune_bytes import compile_untuned, untuned_bytes
from jaxaot._src.partition.costs.device_model import best_seconds

#: Runs of the eqn in the chained program.
COPIES = 8

#: Fewer copies when their inputs and outputs, all alive in the chained program, would exceed this.
MAX_CHAIN_BYTES = 2 * 2**30

# Loops whose trip count depends on values, and branches: their time is not the eqn's.
_VALUE_DEPENDENT = ("while", "cond", "switch")


def _is_array(aval: Any) -> bool:
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None or not isinstance(dtype, np.dtype):
        return False  # extended dtypes (PRNG keys), tokens, refs
    return all(isinstance(d, (int, np.integer)) for d in shape)


def measurable(eqn: Any) -> bool:
    """Whether :func:`profile_seconds` can time ``eqn`` (see the module docstring)."""
    name = eqn.primitive.name
    if C.is_effectful(eqn) or any(frag in name for frag in _VALUE_DEPENDENT) or cost_model.is_loop(name):
        return False
    if any(not (C.is_literal(v) or _is_array(v.aval)) for v in eqn.invars):
        return False
    return all(_is_array(v.aval) for v in eqn.outvars)


def signature(eqn: Any) -> str:
    """What identifies ``eqn`` for timing: primitive, params, input avals and literal values.

    Two eqns with equal signatures run the same kernel. A signature holding an
    object address (a callable in the params) is valid only in this process
    (:func:`is_portable`).
    """
    ins = ",".join(repr(v.val) if C.is_literal(v) else f"{v.aval.dtype}{list(v.aval.shape)}" for v in eqn.invars)
    params = ",".join(f"{k}={v}" for k, v in sorted(eqn.params.items()))
    return f"{eqn.primitive.name}({ins}){{{params}}}"


def is_portable(key: str) -> bool:
    """Whether a :func:`signature` means the same eqn in another process (no object address in it)."""
    return " at 0x" not in key


#: Inputs up to this many bytes are filled on the host and copied over (no compile per shape); larger ones
#: are filled on the device.
HOST_FILL_BYTES = 64 << 20


def _filled(aval: Any, device: Any) -> Any:
    dtype = aval.dtype
    fill = 0.5 if jnp.issubdtype(dtype, np.inexact) else 0
    if aval.size * dtype.itemsize <= HOST_FILL_BYTES:
        return jax.device_put(np.full(aval.shape, fill, dtype), device)
    return jax.device_put(jnp.full(aval.shape, fill, dtype), device)


def _inputs(eqn: Any, device: Any) -> list:
    return [_filled(v.aval, device) for v in eqn.invars if not C.is_literal(v)]


def _chain(eqn: Any, copies: int):
    """``copies`` runs of ``eqn``, each on its own inputs, each after the previous one; all outputs returned."""
    literals = {i: v.val for i, v in enumerate(eqn.invars) if C.is_literal(v)}

    def run(*inputs):
        results = []
        for xs in inputs:
            if results:
                xs, _ = jax.lax.optimization_barrier((xs, results[-1]))
            it = iter(xs)
            results.append(tuple(C.bind_eqn(eqn, [literals[i] if i in literals else next(it)
                                                  for i in range(len(eqn.invars))])))
        return results

    return jax.jit(run)


@dataclasses.dataclass
class Timing:
    """How one eqn is timed (:func:`plan_timing`): the eqn run (``eqn`` itself, or at smaller shapes with
    ``factor`` the ratio to scale its time by), in chains of ``copies``, holding at most ``limit`` device
    bytes (None: no limit); ``one`` and ``many``, the compiled chains of one and of ``copies`` runs, once
    compiled."""

    eqn: Any
    factor: float
    copies: int
    one: Any = None
    many: Any = None
    limit: int | None = None


def plan_timing(eqn: Any, *, copies: int = COPIES) -> Timing | None:
    """How :func:`profile_seconds` times ``eqn`` under the current byte limit
    (:func:`~jaxaot._src.allowance.byte_limit`); None where it cannot."""
    if not measurable(eqn):
        return None
    limit = current_limit()
    limit = MAX_CHAIN_BYTES if limit is None else min(limit, MAX_CHAIN_BYTES)
    nbytes = _run_bytes(eqn)
    factor = 1.0
    if 2 * nbytes > limit:
        small, factor = op_scaling.shrunk(eqn, limit // 4)  # a run holds at most twice its footprint
        if small is None or not measurable(small):
            return None
        eqn, nbytes = small, _run_bytes(small)
    return Timing(eqn, factor, max(2, min(copies, limit // max(nbytes, 1))), limit=limit)


def _run_bytes(eqn: Any) -> int:
    """What one run of ``eqn`` holds in a timing: its inputs, and its outputs twice (:func:`held_bytes`)."""
    outs = sum(v.aval.size * v.aval.dtype.itemsize for v in eqn.outvars)
    return op_scaling.footprint(eqn) + int(outs)


def _lowered(timing: Timing, device: Any) -> tuple[Any, Any]:
    sharding = jax.sharding.SingleDeviceSharding(device)
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=sharding)
             for v in timing.eqn.invars if not C.is_literal(v)]
    with jax.ensure_compile_time_eval():  # the partitioner may run while a caller traces
        return _chain(timing.eqn, 1).lower(avals), _chain(timing.eqn, timing.copies).lower(*[avals] * timing.copies)


def memory_analysis(exe: Any) -> Any | None:
    """XLA's buffer assignment of a compiled executable (``memory_analysis()``), or None where the backend
    reports none."""
    try:
        return exe.memory_analysis()
    except Exception:  # noqa: BLE001  (backends without memory analysis)
        return None


def held_bytes(exe: Any) -> int | None:
    """Device bytes timing a compiled program may hold, from XLA's buffer assignment (None: not reported):
    its arguments and temporaries, and its outputs twice, less what outputs reuse of the arguments.

    Timing calls a program again right after the last call's results are dropped, and the device
    allocator may hand those back only later: on a GPU a chain's timing peaked one set of outputs
    above its buffer assignment (``docs/benchmarks.md``, Findings).
    """
    ma = memory_analysis(exe)
    if ma is None:
        return None
    return int(ma.argument_size_in_bytes + 2 * ma.output_size_in_bytes + ma.temp_size_in_bytes
               - ma.alias_size_in_bytes)


def _compiled(timing: Timing, one: Any, many: Any, platform: str) -> Timing | None:
    """``timing`` with its chains compiled untuned
    (:func:`~jaxaot._src.partition.costs.autotune_bytes.compile_untuned`), and None where they would hold
    more than its limit (XLA's temporaries, which :func:`~jaxaot._src.partition.costs.op_scaling.footprint`
    cannot see). A chain of ``copies`` over the limit comes back with fewer copies and ``many`` None, for
    :func:`_refit` to lower again (on the caller's thread, whose configuration tracing reads)."""
    one, many = compile_untuned(one, platform, [timing.eqn]), compile_untuned(many, platform, [timing.eqn])
    if timing.limit is None:
        return dataclasses.replace(timing, one=one, many=many)
    alone, chained = held_bytes(one), held_bytes(many)
    if alone is not None and 2 * alone > timing.limit:
        return None  # two runs, the fewest a chain times, would hold more than planning may
    if chained is not None and chained > timing.limit:
        copies = timing.limit * timing.copies // chained
        return dataclasses.replace(timing, one=one, many=None, copies=copies) if copies >= 2 else None
    return dataclasses.replace(timing, one=one, many=many)


def _refit(timing: Timing, device: Any) -> Timing | None:
    """A timing :func:`_compiled` cut to fewer copies, its chain lowered and compiled again (fewer copies
    each time, as XLA's temporaries need not grow in step with them) until it keeps to the limit; None
    where two copies do not."""
    while timing.copies >= 2:
        with holding(untuned_bytes([timing.eqn], device.platform)):
            many = compile_untuned(_lowered(timing, device)[1], device.platform, [timing.eqn])
        held = held_bytes(many)
        if held is None or held <= timing.limit:
            return dataclasses.replace(timing, many=many)
        timing = dataclasses.replace(timing, copies=min(timing.copies - 1, timing.limit * timing.copies // held))
    return None


def run_timing(timing: Timing, device: Any, repeats: int = 3) -> float:
    """Seconds one run of the planned eqn takes (scaled to the eqn planned for), from compiled chains, holding
    what the chain holds of the plan-time allowance (:mod:`jaxaot._src.allowance`) meanwhile."""
    held = held_bytes(timing.many)
    held = timing.limit if held is None else held
    with holding(held or 0), jax.ensure_compile_time_eval():  # the partitioner may run while a caller traces
        inputs = [_inputs(timing.eqn, device) for _ in range(timing.copies)]
        alone = best_seconds(lambda: timing.one(inputs[0]), repeats)
        chained = best_seconds(lambda: timing.many(*inputs), repeats)
    # Never below a hundredth of the per-call share: timer noise must not make an eqn free.
    return max((chained - alone) / (timing.copies - 1), alone / (100 * timing.copies), 1e-9) * timing.factor


def launch_seconds(device: Any) -> float:
    """What :func:`profile_seconds` gives an empty kernel (one add on one float) on ``device``.

    The part of a standalone op's time that fusion removes in context: a small
    reduction recomputed in a backward runs inside a kernel that runs anyway.
    """
    return profile_seconds(launch_eqn(), device) or 0.0


def launch_eqn() -> Any:
    """The empty kernel :func:`launch_seconds` times: one add on one float."""
    return jax.make_jaxpr(lambda x: x + 1.0)(jax.ShapeDtypeStruct((1,), jnp.float32)).jaxpr.eqns[0]


def profile_seconds(eqn: Any, device: Any, *, copies: int = COPIES, repeats: int = 3) -> float | None:
    """Seconds one run of ``eqn`` takes on ``device``; None when it cannot be timed.

    Under a byte limit (:func:`~jaxaot._src.allowance.byte_limit`, which the
    planner sets to the step's own size or a byte budget) the chained program holds at most
    that many bytes: fewer copies, and below two copies the eqn is timed at smaller shapes and
    its time scaled (:func:`~jaxaot._src.partition.costs.op_scaling.shrunk`).

    Raises nothing: an eqn that fails to compile or run here (too large for the
    device, say) returns None, and the caller estimates it instead.
    """
    return profile_many([eqn], device, copies=copies, repeats=repeats, threads=1)[0]


def profile_many(eqns: Sequence[Any], device: Any, *, copies: int = COPIES, repeats: int = 3,
                 threads: int | None = None) -> list[float | None]:
    """:func:`profile_seconds` of each of ``eqns``: their chains lowered here, compiled concurrently on the
    process's compile threads (:mod:`jaxaot._src.workers`; ``threads=1``: here, one after another), then
    timed one after another, so no timing shares the device with one of these compiles.

    A small program's compile is mostly one core's work, so the compiles of many eqns overlap where
    each alone would not use the machine; the timings stay sequential, each eqn's inputs alive only
    while it is timed.
    """
    plans = [plan_timing(e, copies=copies) for e in eqns]
    lowered = {}
    for k, p in enumerate(plans):  # here: tracing reads this thread's configuration (x64, say)
        try:
            lowered[k] = _lowered(p, device) if p is not None else None
        except Exception:  # noqa: BLE001 - params this backend cannot lower: estimated instead
            pass
    jobs = [k for k, low in lowered.items() if low is not None]

    def compiled(k: int) -> Timing | None:
        try:
            with holding(untuned_bytes([plans[k].eqn], device.platform)):
                return _compiled(plans[k], *lowered[k], device.platform)
        except Exception:  # noqa: BLE001 - unsupported on this backend: estimated instead
            return None

    if threads == 1 or len(jobs) < 2:
        ready = {k: compiled(k) for k in jobs}
    else:
        futures = {k: workers.submit(compiled, k) for k in jobs}
        ready = {k: f.result() for k, f in futures.items()}
        del futures
    out: list[float | None] = [None] * len(eqns)
    for k, timing in ready.items():
        try:
            if timing is not None and timing.many is None:
                timing = _refit(timing, device)
            if timing is None:
                continue
            out[k] = run_timing(timing, device, repeats)
        except Exception:  # noqa: BLE001 - out of memory on this device: estimated instead
            out[k] = None
        ready[k] = None  # its executables go with it
    return out
