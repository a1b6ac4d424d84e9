"""Casts of a loop's invariant operands to varying, moved out of its body.

Inside ``jax.shard_map`` a replicated value read with a sharded one is cast to vary over the mesh axis
(``pvary``), and the cast's transpose is a ``psum``. In a loop body that reads a replicated parameter, the
backward so sums the parameter's cotangent across devices at every iteration. Where the trip count differs per
device (a condition on the local shard), the devices then wait on sums the others never reach: a hang. Cast once
before the loop, the parameter enters the body varying, and its cotangent is summed once, after the backward
loop: the same values, and one collective instead of one per iteration.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.loops.common import trace_flat

__all__ = ["hoist_invariant_casts"]


def _casts(body: Any, num_consts: int) -> list[tuple[int, tuple[str, ...]]]:
    """``(const position, axes)`` of each distinct cast of a body const to varying, in the body's order."""
    jaxpr = C.jaxpr_of(body)
    position = {v: i for i, v in enumerate(jaxpr.invars[:num_consts])}
    found: list[tuple[int, tuple[str, ...]]] = []
    for eqn in jaxpr.eqns:
        key = _key(eqn, position)
        if key is not None and key not in found:
            found.append(key)
    return found


def _key(eqn: Any, position: dict) -> tuple[int, tuple[str, ...]] | None:
    axes = C.varying_cast_axes(eqn)
    if not axes or len(eqn.invars) != 1 or C.is_literal(eqn.invars[0]) or eqn.invars[0] not in position:
        return None
    return position[eqn.invars[0]], axes


def _body_with(body: Any, num_consts: int, casts: list) -> Any:
    """``body`` taking the casts as consts after its own, each reading one where it cast the const."""
    jaxpr = C.jaxpr_of(body)
    position = {v: i for i, v in enumerate(jaxpr.invars[:num_consts])}
    index = {key: j for j, key in enumerate(casts)}
    n, h = num_consts, len(casts)

    def run(*args: Any) -> list:
        env: dict = dict(zip(jaxpr.constvars, C.consts_of(body)))
        env.update(zip(jaxpr.invars, [*args[:n], *args[n + h:]]))

        def read(v: Any) -> Any:
            return v.val if C.is_literal(v) else env[v]

        for eqn in jaxpr.eqns:
            key = _key(eqn, position)
            outs = [args[n + index[key]]] if key in index else C.bind_eqn(eqn, [read(v) for v in eqn.invars])
            env.update((v, x) for v, x in zip(eqn.outvars, outs) if not C.is_drop_var(v))
        return [read(v) for v in jaxpr.outvars]

    return run


def hoist_invariant_casts(cond: Any, body: Any, consts: Sequence[Any]) -> tuple[Any, Any, list]:
    """``(cond, body, consts)`` with each cast of a const to varying in ``body`` made once, before the loop, its
    result passed as one more const (module docstring); the arguments themselves where ``body`` casts none."""
    consts = list(consts)
    casts = _casts(body, len(consts))
    if not casts:
        return cond, body, consts
    extra = [C.vary_over(consts[i], axes) for i, axes in casts]
    n, h = len(consts), len(extra)
    carry = [v.aval for v in C.jaxpr_of(body).invars[n:]]
    avals = [*(jax.typeof(x) for x in (*consts, *extra)), *carry]
    new_body = trace_flat(_body_with(body, n, casts), avals)
    new_cond = trace_flat(lambda *a: C.eval_closed(cond, *a[:n], *a[n + h:]), avals)
    return new_cond, new_body, [*consts, *extra]
