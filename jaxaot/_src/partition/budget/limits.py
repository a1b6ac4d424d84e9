"""How many device bytes plan-time measurement may hold.

Planning times ops on the device; that must not raise the process's device peak
above the step's own, nor above a byte ``memory_budget``. :func:`measurement_limit`
bounds one timing: the largest expensive eqn's operands and results (larger eqns are
timed at smaller shapes), under a byte budget at most the room left (half of it where
compiles hold device memory, a GPU's autotuner). :func:`measuring_within` opens that
room as the process's allowance (:mod:`jaxaot._src.allowance`), shared by timings,
probes and candidates' compiles."""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax

from jaxaot._src import compat as C
from jaxaot._src.allowance import allowance, byte_limit
from jaxaot._src.pytrees import var_device_nbytes
from jaxaot._src.partition.budget.step_peak import program_platform
from jaxaot._src.partition.costs import Recompute, classify
from jaxaot._src.partition.costs.autotune_bytes import UNTUNED_PLATFORMS
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
        largest = max(largest, sum(var_device_nbytes(v) for v in held))
    if budget is not None:
        room = max(budget - bytes_in_use(), 0)
        if program_platform(joint.in_avals) not in UNTUNED_PLATFORMS:
            room //= 2
        largest = min(largest, room)
    return largest


@contextlib.contextmanager
def measuring_within(joint: JointGraph, budget: int | None) -> Iterator[None]:
    """Within the block, a timing holds at most :func:`measurement_limit`, and under a byte budget all
    plan-time work together at most the budget less what the device holds now (module docstring)."""
    with byte_limit(measurement_limit(joint, budget)):
        if budget is None:
            yield
            return
        with allowance(budget - bytes_in_use()):
            yield
