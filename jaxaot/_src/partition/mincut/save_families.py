"""Plans shaped like JAX's ``dots_saveable``: the min-cut with only matmul outputs saveable.

The fraction budget's plans save whatever is cheapest in bytes, often a fusible
value beside a matmul rather than its result, and on an accelerator that can leave
the compiled peak above ``dots_saveable``'s (``docs/concepts/memory_planner.md``,
"Byte budgets"). So the byte-budget search also measures the ``"dots"`` family:
values saveable only where a ``dot_general`` made them (and primal inputs, and an
effect's outputs, which are never recomputed), planned at fraction 1. :func:`family_saveable` gives the predicate.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.partition.mincut import save_families
    >>> joint = jaxaot.partition.trace_joint(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2), jnp.ones((4, 4)), jnp.ones((8, 4)))
    >>> ok = save_families.family_saveable(joint, "dots")
    >>> eqns = joint.jaxpr.jaxpr.eqns[:2]  # the forward's matmul and tanh
    >>> [e.primitive.name for e in eqns], [ok(e.outvars[0]) for e in eqns]
    (['dot_general', 'tanh'], [True, False])
"""

from __future__ import annotations

from typing import Any, Callable

from jaxaot._src import compat as C
from jaxaot._src.tracing import JointGraph

#: The families the byte-budget search measures beside the fraction's plans, in the order it tries them.
FAMILIES = ("dots",)


def family_saveable(joint: JointGraph, family: str) -> Callable[[Any], bool]:
    """``saveable(var)`` of ``joint``'s vars under ``family`` (module docstring)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown plan family {family!r}; expected one of {FAMILIES}")
    jaxpr = C.jaxpr_of(joint.jaxpr)
    ok = set(jaxpr.invars[: joint.num_primals])
    for eqn in jaxpr.eqns:  # an effect's outputs too: it runs once, so the backward cannot recompute them
        if eqn.primitive.name == "dot_general" or eqn.effects:
            ok.update(v for v in eqn.outvars if not C.is_drop_var(v))
    return lambda v: v in ok


def restricted(saveable: Callable[[Any], bool] | None, joint: JointGraph, family: str | None
               ) -> Callable[[Any], bool] | None:
    """``saveable`` and ``family``'s predicate on ``joint`` together (either may be None: no restriction)."""
    if family is None:
        return saveable
    mine = family_saveable(joint, family)
    return mine if saveable is None else (lambda v: saveable(v) and mine(v))
