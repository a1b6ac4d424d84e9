"""Plans shaped like JAX's ``dots_saveable``: the min-cut with only matmul outputs saveable.

The fraction budget orders plans by seconds per saved byte, and its plans save
whatever the cut finds cheapest in bytes: often a fusible value beside a
matmul (a softmax's input, a norm's output) rather than the matmul's own
result. On an accelerator the compiled peak depends on more than the residual
bytes: which values the backward recomputes decides which temporaries it holds
at once. On an H200 16-head GPT-2 block no fraction reached
``jax.checkpoint(dots_saveable)``'s peak, while the min-cut restricted to
saving matmul outputs matched it to the byte
(``docs/concepts/memory_planner.md``, "Byte budgets"). So the byte-budget search
(:mod:`jaxaot._src.partition.budget.search`) also measures this family, ``"dots"``:
values saveable only where a ``dot_general`` made them (``dots_saveable``'s
choice), planned at fraction 1 (nothing expensive recomputed).

Primal inputs stay saveable. Values the fraction forbids recomputing that no
matmul made (a softmax's row statistics, a norm's mean) are not: as under
``dots_saveable``, the backward recomputes them from the saved matmul outputs
(:func:`~jaxaot._src.partition.split_joint` recomputes whatever is not saved, so
every saved set is a valid plan). :func:`family_saveable` gives the predicate
over a joint graph's vars. Cost: one pass over the joint graph's eqns.

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
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            ok.update(v for v in eqn.outvars if not C.is_drop_var(v))
    return lambda v: v in ok


def restricted(saveable: Callable[[Any], bool] | None, joint: JointGraph, family: str | None
               ) -> Callable[[Any], bool] | None:
    """``saveable`` and ``family``'s predicate on ``joint`` together (either may be None: no restriction)."""
    if family is None:
        return saveable
    mine = family_saveable(joint, family)
    return mine if saveable is None else (lambda v: saveable(v) and mine(v))
