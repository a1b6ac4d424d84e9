"""How many device bytes plan-time measurement may hold.

Planning times ops on the device, and those programs must not raise the process's
device peak above what the step itself needs, nor above a byte ``memory_budget``.
:func:`measurement_limit` is that allowance: the largest expensive eqn's operands
and results (the step writes those to memory anyway; larger eqns are timed at
smaller shapes and scaled), and under a byte budget at most the budget less what
the device holds now.
"""

from __future__ import annotations

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import device_nbytes
from jaxaot._src.partition.costs import Recompute, classify
from jaxaot._src.tracing import JointGraph


def bytes_in_use(device=None) -> int:
    """Bytes the device holds now, where the backend reports it (0 elsewhere: the CPU)."""
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return 0
    return int(stats.get("bytes_in_use", 0))


def measurement_limit(joint: JointGraph, budget: int | None = None) -> int:
    """The device bytes one timing program may hold while planning ``joint`` (module docstring)."""
    jaxpr = C.jaxpr_of(joint.jaxpr)
    inputs = set(jaxpr.invars[: joint.num_primals])
    largest = 0
    for eqn in jaxpr.eqns:
        if classify(eqn) is Recompute.CHEAP:
            continue
        held = [v for v in (*eqn.invars, *eqn.outvars) if not C.is_literal(v) and v not in inputs]
        largest = max(largest, sum(_nbytes(v) for v in held))
    if budget is not None:
        largest = min(largest, max(budget - bytes_in_use(), 0))
    return largest


def _nbytes(v) -> int:
    try:
        return int(device_nbytes(v.aval))
    except Exception:  # noqa: BLE001 - tokens, opaque dtypes
        return 0
