"""Per-iteration residuals of ``lax.scan`` chosen by the same min-cut.

To the partitioner a ``scan`` is one opaque node: JAX's own scan partial
evaluation decides what each iteration saves, and it saves everything its
linearization keeps. Models stack their layers with ``scan``, so that would
forfeit the min-cut's savings on exactly the bulk of the program.

This pass rewrites each top-level ``scan`` of a *primal* program before its
joint graph is built: it builds the joint graph of the scan body alone, runs
the min-cut on it (allowing only values it can name to be saved), then wraps
the body in ``jax.checkpoint`` with ``save_only_these_names`` naming exactly
those values. JAX's scan+remat partial evaluation then stacks only those per
iteration and the backward scan recomputes the rest. Nested scans are
rewritten innermost first. Bodies with effects are left alone.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot import min_cut, scan_remat
    >>> def f(w, xs):
    ...     step = lambda h, x: (jnp.tanh(jnp.sin(h @ w) + x), None)
    ...     return jax.lax.scan(step, jnp.zeros(3), xs)[0]
    >>> primal = jax.make_jaxpr(f)(jnp.ones((3, 3)), jnp.ones((5, 3)))
    >>> new = scan_remat.rewrite_primal(primal, min_cut.choose_saved_values)
    >>> [e.primitive.name for e in new.jaxpr.eqns if e.primitive.name == "scan"]
    ['scan']
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import jax
from jax.ad_checkpoint import checkpoint_name

from jaxaot import _compat as C
from jaxaot.tracing import JointGraph, build_joint

#: ``choose(joint, saveable=...) -> saved vars`` (the min-cut's chooser).
Chooser = Callable[..., list]

_TAG = "jaxaot_scan"
_uid = itertools.count()


def _avals(vars_: Sequence[Any]) -> list:
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=getattr(v.aval, "weak_type", False))
            for v in vars_]


def _nameable(v: Any) -> bool:
    # checkpoint_name needs a plain array; tokens and PRNG keys stay unnamed.
    dtype = getattr(v.aval, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def evaluate(closed: Any, args: Sequence[Any], names: dict | None = None, scans: dict | None = None) -> list:
    """Evaluate ``closed`` in the current trace.

    ``names`` maps vars to a ``checkpoint_name`` applied to their value;
    ``scans`` maps ``id(eqn)`` of scan eqns to a replacement body function.
    """
    jaxpr = C.jaxpr_of(closed)
    env: dict = dict(zip(jaxpr.constvars, C.consts_of(closed)))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if C.is_literal(v) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        body = scans.get(id(eqn)) if scans else None
        outs = _run_scan(eqn, body, invals) if body is not None else C.bind_eqn(eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            if C.is_drop_var(v):
                continue
            env[v] = checkpoint_name(x, names[v]) if names and v in names else x
    return [read(v) for v in jaxpr.outvars]


def _run_scan(eqn: Any, body: Callable, invals: list) -> list:
    """Re-run a scan eqn through ``lax.scan`` with a new body (``lax.scan`` hoists its consts)."""
    p = eqn.params
    nc, nk = C.scan_counts(p)
    consts, init, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]

    def step(carry, x):
        outs = body(*consts, *carry, *x)
        return list(outs[:nk]), list(outs[nk:])

    kwargs = {"_split_transpose": p["_split_transpose"]} if "_split_transpose" in p else {}
    with C.eqn_user_context(eqn):
        carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                                 unroll=p["unroll"], **kwargs)
    return [*carry, *ys]


def _flat_tree(n: int) -> Any:
    return jax.tree_util.tree_structure(((0,) * n, {}))


def body_joint(body: Any, names: dict) -> JointGraph:
    """The joint graph of a scan body with ``names`` applied (inputs: consts, carry, xs)."""
    jaxpr = C.jaxpr_of(body)
    avals = _avals(jaxpr.invars)
    tagged = jax.make_jaxpr(lambda *a: evaluate(body, a, names))(*avals)
    return build_joint(tagged, _flat_tree(len(avals)), _flat_tree(len(jaxpr.outvars)), avals)


def choose_body_names(body: Any, choose: Chooser, names: dict) -> set[str] | None:
    """Which of ``names`` (var -> name) the min-cut saves per iteration (None: leave the scan alone)."""
    joint = body_joint(body, names)
    bj = C.jaxpr_of(joint.jaxpr)
    wanted = set(names.values())
    tag_of = {e.outvars[0]: e.params["name"] for e, bwd in zip(bj.eqns, joint.is_backward)
              if not bwd and e.primitive.name == "name" and e.params.get("name") in wanted}
    inputs = set(bj.invars[: joint.num_primals])
    saved = choose(joint, saveable=lambda v: v in tag_of or v in inputs)
    if any(v not in tag_of and v not in inputs for v in saved):
        return None  # pragma: no cover - the min-cut saved a value it could not name
    return {tag_of[v] for v in saved if v in tag_of}


def plan_scan(eqn: Any, choose: Chooser) -> Callable | None:
    """The checkpointed body function to run ``eqn`` with, or None to keep it."""
    body = eqn.params["jaxpr"]
    if C.jaxpr_of(body).effects or eqn.params["length"] == 0:
        return None
    body = rewrite_primal(body, choose)  # innermost scans first
    jaxpr = C.jaxpr_of(body)
    tags = {v: f"{_TAG}{next(_uid)}" for e in jaxpr.eqns for v in e.outvars
            if not C.is_drop_var(v) and _nameable(v)}
    try:
        chosen = choose_body_names(body, choose, tags)
    except Exception:  # noqa: BLE001 - a body we cannot analyse keeps JAX's own residuals
        return None
    if chosen is None:
        return None
    keep = {v: n for v, n in tags.items() if n in chosen}
    policy = jax.checkpoint_policies.save_only_these_names(*sorted(chosen))
    return jax.checkpoint(lambda *a: evaluate(body, a, keep), policy=policy, prevent_cse=False)


def rewrite_primal(closed: Any, choose: Chooser) -> Any:
    """``closed`` with each top-level scan's body checkpointed to save the min-cut's choice.

    Returns ``closed`` itself when there is nothing to rewrite.

    The min-cut partitioner calls it itself and re-traces the joint graph, so
    no runtime hook is needed; a runtime that wants to skip the re-trace can
    apply :func:`jaxaot.min_cut.rewrite_primal` to the primal before ``build_joint``.
    """
    jaxpr = C.jaxpr_of(closed)
    plans = {id(e): plan_scan(e, choose) for e in jaxpr.eqns if e.primitive.name == "scan"}
    plans = {k: p for k, p in plans.items() if p is not None}
    if not plans:
        return closed
    return jax.make_jaxpr(lambda *a: evaluate(closed, a, scans=plans))(*_avals(jaxpr.invars))
