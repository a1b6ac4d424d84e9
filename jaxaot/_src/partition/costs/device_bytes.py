"""Per-device bytes of a sharded program's values: what the partitioner's budget counts.

The memory budget is per device, and a residual sharded eight ways costs a device
an eighth of its bytes. The joint graph knows its inputs' shardings but not where
XLA will put an ``Auto`` mesh's intermediates, so this propagates per-dimension
shard counts eqn by eqn (shardings, constraints, elementwise, broadcasts, reshapes,
reductions, matmuls; anything else replicated). The estimate only over-counts.
Unsharded programs skip it (:func:`device_fractions` returns None).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.costs import device_fractions
    >>> closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(jnp.ones(8))
    >>> device_fractions(closed, [None]) is None
    True
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from jaxaot._src import compat as C
from jaxaot._src.pytrees import concrete_shape

Counts = tuple  # one int per dimension


def _counts_of_sharding(sharding: Any, shape: Sequence[Any]) -> Counts | None:
    if sharding is None or C.single_device_of(sharding) is not None:
        return None
    shape = concrete_shape(shape)
    try:
        local = sharding.shard_shape(tuple(shape))
    except Exception:  # an abstract or unusual sharding: no estimate
        return None
    return tuple(max(1, d // max(ld, 1)) for d, ld in zip(shape, local))


def _explicit_counts(aval: Any) -> Counts | None:
    """Counts from the sharding in a value's type (a mesh with explicit axes), else None."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if not spec or all(p is None for p in spec):
        return None
    return _spec_counts(spec, sharding.mesh, len(aval.shape))


def _spec_counts(spec: Any, mesh: Any, ndim: int) -> Counts:
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    out = []
    for p in tuple(spec) + (None,) * (ndim - len(spec)):
        names = () if p is None else (p,) if isinstance(p, str) else tuple(p)
        out.append(math.prod(sizes.get(n, 1) for n in names))
    return tuple(out)


def _replicated(aval: Any) -> Counts:
    return (1,) * len(getattr(aval, "shape", ()))


def _rule(eqn: Any, ins: list[Counts]) -> list[Counts] | None:
    """Output counts of ``eqn`` from its operands' counts (None: replicated)."""
    name, params = eqn.primitive.name, eqn.params
    out_avals = [v.aval for v in eqn.outvars]
    if name == "sharding_constraint":
        c = _counts_of_sharding(params.get("sharding"), out_avals[0].shape)
        return [c] if c is not None else [ins[0]]
    if name == "shard_map" and "out_specs" in params:
        return [_spec_counts(s, params["mesh"], len(a.shape)) for s, a in zip(params["out_specs"], out_avals)]
    if name == "transpose":
        return [tuple(ins[0][p] for p in params["permutation"])]
    if name == "broadcast_in_dim":
        out = [1] * len(out_avals[0].shape)
        for src, dst in enumerate(params["broadcast_dimensions"]):
            if concrete_shape(eqn.invars[0].aval.shape)[src] == concrete_shape(out_avals[0].shape)[dst]:
                out[dst] = ins[0][src]
        return [tuple(out)]
    if name == "reshape":
        old, new = concrete_shape(eqn.invars[0].aval.shape), concrete_shape(out_avals[0].shape)
        out = [1] * len(new)
        for d, (a, b) in enumerate(zip(old, new)):
            if a != b:
                break
            out[d] = ins[0][d]
        return [tuple(out)]
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        axes = set(params.get("axes", ()))
        kept = tuple(c for d, c in enumerate(ins[0]) if d not in axes)
        return [kept if len(kept) == len(out_avals[0].shape) else _replicated(out_avals[0])]
    if name == "dot_general":
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        lhs, rhs = ins[0], ins[1]
        batch = [max(lhs[a], rhs[b]) for a, b in zip(lb, rb)]
        lfree = [c for d, c in enumerate(lhs) if d not in lc and d not in lb]
        rfree = [c for d, c in enumerate(rhs) if d not in rc and d not in rb]
        return [tuple(batch + lfree + rfree)]
    # Elementwise (and any eqn whose outputs have an operand's shape): the most-sharded operand.
    result = []
    for a in out_avals:
        shape = tuple(concrete_shape(getattr(a, "shape", ())))
        same = [c for v, c in zip(eqn.invars, ins) if tuple(concrete_shape(getattr(v.aval, "shape", ()))) == shape]
        result.append(tuple(max(cs) for cs in zip(*same)) if same and shape else _replicated(a))
    return result


def device_fractions(closed: Any, in_shardings: Sequence[Any]) -> dict | None:
    """Per var of ``closed``, the estimated fraction of its bytes one device holds.

    Args:
      closed: a closed jaxpr (the joint graph's).
      in_shardings: per leading input, its ``jax.sharding.Sharding`` or None;
        inputs past these (cotangents) are taken as replicated.

    Returns None when nothing in the program is sharded: every fraction is 1.
    """
    jaxpr = C.jaxpr_of(closed)
    counts: dict = {}
    sharded = False
    for i, v in enumerate(jaxpr.invars):
        c = _explicit_counts(v.aval)
        if c is None and i < len(in_shardings):
            c = _counts_of_sharding(in_shardings[i], v.aval.shape)
        counts[v] = c or _replicated(v.aval)
        sharded |= c is not None
    for eqn in jaxpr.eqns:
        ins = [counts.get(v) or _replicated(v.aval) if not C.is_literal(v) else _replicated(v.aval)
               for v in eqn.invars]
        try:
            outs = _rule(eqn, ins)
        except (KeyError, IndexError, TypeError, ValueError):
            outs = None
        for j, v in enumerate(eqn.outvars):
            c = _explicit_counts(v.aval) or (outs[j] if outs is not None and j < len(outs) else None)
            c = c if c is not None and len(c) == len(getattr(v.aval, "shape", ())) else _replicated(v.aval)
            counts[v] = c
            sharded |= eqn.primitive.name in ("sharding_constraint", "shard_map") or any(x > 1 for x in c)
    if not sharded:
        return None
    return {v: 1.0 / max(1, math.prod(c)) for v, c in counts.items()}
