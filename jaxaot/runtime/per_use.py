"""Per-use recomputation: the fused step's backward re-emits cheap recomputed values once per consumer.

A partition's backward recomputes some forward values from the residuals (the
eqns no cotangent reaches). Emitted once, a cheap elementwise value with several
consumers becomes one multi-output kernel in XLA, and every output of that
kernel is written to memory and stays alive until its last consumer runs. On
an attention block whose plan saves the scores and the softmax statistics, the
recomputed probabilities feed the value gradient's matmul and, in float32, two
steps of the score gradient: XLA materialized two 256 MB buffers for them,
and the fused step's peak rose 1.28x above ``dots_saveable``'s.

:func:`eval_backward` evaluates the backward so that each eqn a cotangent
reaches gets its *own* copy of the cheap recomputed values it reads (the cone
of :data:`~jaxaot.partition.cost_model.Recompute.CHEAP` eqns back to residuals
or to values computed once). The copy is emitted right before its consumer,
behind an ``optimization_barrier`` over the cone's inputs and the consumer's
other operands, so that:

* XLA fuses each copy into its consumer instead of materializing it (a read
  of the residual per consumer, rather than a write and a read of the
  recomputed value, and no buffer kept alive between consumers);
* the copy is computed no earlier than its consumer's other operands (XLA
  cannot hoist it, which would keep it alive across the backward);
* copies are not merged again by XLA's common-subexpression elimination (each
  barrier has different operands).

Recomputed eqns that are not cheap (matmuls, large reductions, loops) are
computed once, where the backward has them, as before.

Cost: every consumer re-reads the cone's inputs and re-runs its arithmetic
(elementwise, so bandwidth, not FLOPs); one barrier per consumer.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxaot import _compat as C
from jaxaot.partition import cost_model


def _reads(eqn: Any) -> list:
    return [v for v in eqn.invars if not C.is_literal(v)]


def deferred_eqns(backward: Any, num_cotangents: int) -> dict[int, Any]:
    """The backward's cheap recomputed eqns, by the ``id`` of each of their outputs.

    An eqn is recomputed when no cotangent reaches it; it is deferred (emitted
    per use) when :func:`~jaxaot.partition.cost_model.classify` calls it cheap.
    """
    jaxpr = C.jaxpr_of(backward)
    reached = set(map(id, jaxpr.invars[:num_cotangents]))
    out: dict[int, Any] = {}
    for eqn in jaxpr.eqns:
        if any(id(v) in reached for v in _reads(eqn)):
            reached.update(id(v) for v in eqn.outvars)
        elif cost_model.classify(eqn) is cost_model.Recompute.CHEAP and not C.is_effectful(eqn):
            out.update((id(v), eqn) for v in eqn.outvars)
    return out


def _cone(vars_: list, deferred: dict[int, Any]) -> tuple[list, list]:
    """``(eqns, leaves)``: the deferred eqns ``vars_`` need, in dependency order, and the
    values outside them that those eqns read."""
    order: list = []
    seen: set[int] = set()
    leaves: dict[int, Any] = {}

    def visit(v: Any) -> None:
        eqn = deferred.get(id(v))
        if eqn is None:
            leaves.setdefault(id(v), v)
            return
        if id(eqn) in seen:
            return
        seen.add(id(eqn))
        for u in _reads(eqn):
            visit(u)
        order.append(eqn)

    for v in vars_:
        visit(v)
    return order, list(leaves.values())


def _read(env: dict, v: Any) -> Any:
    return v.val if C.is_literal(v) else env[id(v)]


def _emit(vars_: list, partners: list, env: dict, deferred: dict[int, Any]) -> tuple[dict, list]:
    """Emit one private copy of the cone of ``vars_`` behind a barrier shared with ``partners``
    (the consumer's other operands). Returns the copy's values by var id, and the partners' values
    as they come out of the barrier."""
    eqns, leaves = _cone(vars_, deferred)
    values = [env[id(v)] for v in leaves] + [env[id(v)] for v in partners]
    if values:
        values = list(jax.lax.optimization_barrier(values))
    local = {id(v): x for v, x in zip(leaves, values)}
    for eqn in eqns:
        outs = C.bind_eqn(eqn, [_read(local, u) for u in eqn.invars])
        local.update((id(o), x) for o, x in zip(eqn.outvars, outs))
    return local, values[len(leaves):]


def eval_backward(backward: Any, num_cotangents: int, *args: Any) -> list:
    """Evaluate the closed jaxpr ``backward`` on ``args`` (cotangents first, then residuals),
    emitting its cheap recomputed values once per consumer (see the module docstring).

    Same values as ``jax.core.eval_jaxpr``; a different program.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot.runtime.per_use import eval_backward
        >>> def bwd(g, x):  # exp(x) recomputed, read by two consumers
        ...     e = jnp.exp(x)
        ...     return (g * e + jnp.sum(g * e),)
        >>> closed = jax.make_jaxpr(bwd)(1.0, 2.0)
        >>> bool(jnp.allclose(eval_backward(closed, 1, 3.0, 0.5)[0], bwd(3.0, 0.5)[0]))
        True
    """
    jaxpr = C.jaxpr_of(backward)
    deferred = deferred_eqns(backward, num_cotangents)
    env: dict[int, Any] = {id(v): x for v, x in zip(jaxpr.constvars, C.consts_of(backward))}
    env.update((id(v), x) for v, x in zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        if eqn.outvars and id(eqn.outvars[0]) in deferred:
            continue
        wanted = [v for v in _reads(eqn) if id(v) in deferred]
        if wanted:
            partners = [v for v in _reads(eqn) if id(v) not in deferred]
            local, passed = _emit(wanted, partners, env, deferred)
            local.update((id(v), x) for v, x in zip(partners, passed))
            invals = [_read(local if id(v) in local else env, v) for v in eqn.invars]
        else:
            invals = [_read(env, v) for v in eqn.invars]
        outs = C.bind_eqn(eqn, invals)
        env.update((id(o), x) for o, x in zip(eqn.outvars, outs))
    results = []
    for v in jaxpr.outvars:
        if not C.is_literal(v) and id(v) in deferred:
            local, _ = _emit([v], [], env, deferred)
            results.append(local[id(v)])
        else:
            results.append(_read(env, v))
    return results
