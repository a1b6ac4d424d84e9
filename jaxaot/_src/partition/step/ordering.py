"""Consume-first ordering: the fused step's backward uses a recomputed matmul operand before anything else reads its residuals.

Inside one program XLA may merge the recomputation of a matmul's operand into a
later kernel that reads the same residuals, so the recomputed value is produced
only when that kernel runs, beside its outputs, and the peak rises
(``docs/concepts/fused_step.md``, "Backward order"). :func:`eval_backward` runs each
such matmul as soon as its operands exist and passes its residuals through an
``optimization_barrier`` with its result, so later readers depend on it and the
operand can be freed first. The cost: one more read of those residuals, and
cheap recomputation after a barrier runs twice.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxaot._src import compat as C
from jaxaot._src.partition.costs import Recompute, classify

#: Primitives whose recomputed operands are ordered (XLA writes their operands to memory).
MATERIALIZING = frozenset({"dot_general", "conv_general_dilated"})
_CHEAP = Recompute.CHEAP
#: Eqns that only move or relabel data: an operand recomputed by these alone (a transposed
#: weight) costs no kernel worth ordering.
_MOVES = frozenset("transpose reshape rev squeeze expand_dims broadcast_in_dim copy convert_element_type".split())


def _reads(eqn: Any) -> list:
    return [v for v in eqn.invars if not C.is_literal(v)]


def _residual_sources(v: Any, producer: dict[int, Any], residuals: set[int]) -> list:
    """The backward's residual inputs that the recomputed value ``v`` is computed from (none
    when only data movement computes it)."""
    out: dict[int, Any] = {}
    stack, seen, arithmetic = [v], set(), False
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if id(u) in residuals:
            out[id(u)] = u
        elif id(u) in producer:
            arithmetic |= producer[id(u)].primitive.name not in _MOVES
            stack.extend(_reads(producer[id(u)]))
    return list(out.values()) if arithmetic else []


def _walk(jaxpr: Any, num_cotangents: int) -> tuple[dict[int, Any], list]:
    """``(producer, reached)``: the recomputed eqns (no cotangent reaches them) by the ``id`` of
    each of their outputs, and the eqns a cotangent reaches, in order."""
    seen = set(map(id, jaxpr.invars[:num_cotangents]))
    producer: dict[int, Any] = {}
    reached: list = []
    for eqn in jaxpr.eqns:
        if any(id(v) in seen for v in _reads(eqn)):
            seen.update(id(o) for o in eqn.outvars)
            reached.append(eqn)
        else:
            producer.update((id(o), eqn) for o in eqn.outvars)
    return producer, reached


def ordered_eqns(backward: Any, num_cotangents: int) -> dict[int, list]:
    """``{id(eqn): residual vars}`` for each matmul/convolution a cotangent reaches that reads a
    recomputed value: the residuals to pass the barrier after it."""
    jaxpr = C.jaxpr_of(backward)
    residuals = set(map(id, jaxpr.invars[num_cotangents:]))
    producer, reached = _walk(jaxpr, num_cotangents)
    out: dict[int, list] = {}
    for eqn in reached:
        if eqn.primitive.name in MATERIALIZING:
            recomputed = [v for v in _reads(eqn) if id(v) in producer]
            sources = {id(s): s for v in recomputed for s in _residual_sources(v, producer, residuals)}
            if sources:
                out[id(eqn)] = list(sources.values())
    return out


def eval_backward(backward: Any, num_cotangents: int, *args: Any) -> list:
    """Evaluate the closed jaxpr ``backward`` on ``args`` (cotangents first, then residuals) with
    recomputed matmul operands consumed first (see the module docstring).

    Recomputed values are computed when first read. After a barrier, the cheap ones that were
    computed from the residuals it passed are forgotten, so later readers recompute them from
    the barrier's outputs (that re-read is the order's cost); expensive ones are kept.

    Same values as ``jax.core.eval_jaxpr``; a different program.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.partition.step import eval_backward
        >>> def bwd(g, s, w):  # exp(s) recomputed: a matmul operand, and read again after it
        ...     dw = jnp.exp(s).T @ g
        ...     return dw, (g @ w.T) * jnp.exp(s)
        >>> args = (jnp.ones((2, 3)), jnp.ones((2, 4)), jnp.ones((4, 3)))
        >>> closed = jax.make_jaxpr(bwd)(*args)
        >>> got, want = eval_backward(closed, 1, *args), bwd(*args)
        >>> all(bool(jnp.allclose(a, b)) for a, b in zip(got, want))
        True
    """
    jaxpr = C.jaxpr_of(backward)
    ordered = ordered_eqns(backward, num_cotangents)
    producer, reached = _walk(jaxpr, num_cotangents)
    env: dict[int, Any] = {id(v): x for v, x in zip(jaxpr.constvars, C.consts_of(backward))}
    env.update((id(v), x) for v, x in zip(jaxpr.invars, args))
    memo: dict[int, Any] = {}  # recomputed values computed so far
    deps: dict[int, frozenset] = {id(v): frozenset({id(v)}) for v in jaxpr.invars[num_cotangents:]}

    def have(v: Any) -> bool:
        return C.is_literal(v) or id(v) in env or id(v) in memo

    def read(v: Any) -> Any:
        """``v``'s value, computing the recomputed eqns it needs first (iteratively: chains are long)."""
        stack = [] if have(v) else [producer[id(v)]]
        while stack:
            eqn = stack[-1]
            missing = [u for u in _reads(eqn) if not have(u)]
            if missing:
                stack.extend(producer[id(u)] for u in missing)
                continue
            stack.pop()
            if have(eqn.outvars[0]):
                continue
            ins = [u.val if C.is_literal(u) else env.get(id(u), memo.get(id(u))) for u in eqn.invars]
            d = frozenset().union(*(deps.get(id(u), frozenset()) for u in _reads(eqn)))
            for o, x in zip(eqn.outvars, C.bind_eqn(eqn, ins)):
                memo[id(o)], deps[id(o)] = x, d
        return v.val if C.is_literal(v) else env[id(v)] if id(v) in env else memo[id(v)]

    def run(eqn: Any) -> None:
        outs = C.bind_eqn(eqn, [read(v) for v in eqn.invars])
        sources = ordered.get(id(eqn))
        if sources:
            passed = jax.lax.optimization_barrier([env[id(s)] for s in sources] + list(outs))
            env.update((id(s), x) for s, x in zip(sources, passed))
            outs = passed[len(sources):]
            stale = {id(s) for s in sources}
            for k in [k for k in memo if deps[k] & stale and classify(producer[k]) is _CHEAP]:
                del memo[k]
        env.update((id(o), x) for o, x in zip(eqn.outvars, outs))

    available = lambda v: C.is_literal(v) or id(v) in env or id(v) in producer  # noqa: E731
    pending = [e for e in reached if id(e) in ordered]
    done: set[int] = set()
    for eqn in reached:
        if id(eqn) not in done:
            run(eqn)
            done.add(id(eqn))
        for early in [e for e in pending if all(available(v) for v in e.invars)]:
            if id(early) not in done:  # as soon as its operands exist, before later readers of its residuals
                run(early)
                done.add(id(early))
        pending = [e for e in pending if id(e) not in done]
    return [read(v) for v in jaxpr.outvars]
