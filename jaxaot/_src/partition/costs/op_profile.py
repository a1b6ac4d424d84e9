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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.partition.costs import cost_model, op_scaling
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


def _inputs(eqn: Any, device: Any) -> list:
    out = []
    for v in eqn.invars:
        if C.is_literal(v):
            continue
        dtype = v.aval.dtype
        fill = 0.5 if jnp.issubdtype(dtype, np.inexact) else 0
        out.append(jax.device_put(jnp.full(v.aval.shape, fill, dtype), device))
    return out


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


def launch_seconds(device: Any) -> float:
    """What :func:`profile_seconds` gives an empty kernel (one add on one float) on ``device``.

    The part of a standalone op's time that fusion removes in context: a small
    reduction recomputed in a backward runs inside a kernel that runs anyway.
    """
    eqn = jax.make_jaxpr(lambda x: x + 1.0)(jnp.ones((1,), jnp.float32)).jaxpr.eqns[0]
    return profile_seconds(eqn, device) or 0.0


def profile_seconds(eqn: Any, device: Any, *, copies: int = COPIES, repeats: int = 3) -> float | None:
    """Seconds one run of ``eqn`` takes on ``device``; None when it cannot be timed.

    Under a byte limit (:func:`~jaxaot._src.partition.costs.op_scaling.byte_limit`, which the
    planner sets to the step's own size or a byte budget) the chained program holds at most
    that many bytes: fewer copies, and below two copies the eqn is timed at smaller shapes and
    its time scaled (:func:`~jaxaot._src.partition.costs.op_scaling.shrunk`).

    Raises nothing: an eqn that fails to compile or run here (too large for the
    device, say) returns None, and the caller estimates it instead.
    """
    if not measurable(eqn):
        return None
    limit = op_scaling.current_limit()
    limit = MAX_CHAIN_BYTES if limit is None else min(limit, MAX_CHAIN_BYTES)
    nbytes = op_scaling.footprint(eqn)
    if 2 * nbytes > limit:
        small, factor = op_scaling.shrunk(eqn, limit // 2)
        if small is None:
            return None
        seconds = profile_seconds(small, device, copies=copies, repeats=repeats)
        return None if seconds is None else seconds * factor
    copies = max(2, min(copies, limit // max(nbytes, 1)))
    try:
        with jax.ensure_compile_time_eval():  # the partitioner may run while a caller traces
            inputs = [_inputs(eqn, device) for _ in range(copies)]
            one, many = _chain(eqn, 1), _chain(eqn, copies)
            alone = best_seconds(lambda: one(inputs[0]), repeats)
            chained = best_seconds(lambda: many(*inputs), repeats)
    except Exception:  # noqa: BLE001 - out of memory, unsupported on this backend: estimate instead
        return None
    # Never below a hundredth of the per-call share: timer noise must not make an eqn free.
    return max((chained - alone) / (copies - 1), alone / (100 * copies), 1e-9)
