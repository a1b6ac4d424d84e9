"""Order-free reductions the fused step's backward derives again instead of taking them as residuals.

The min-cut saves a softmax's row max beside its sum even when the backward
recomputes the scores the max was taken over; saving it keeps it alive across the
step and can change how XLA fuses the recomputation, where deriving it again is
fused for free (``docs/concepts/fused_step.md``, "Reductions derived again").
:func:`rederive_backward` drops residuals that a short chain of cheap eqns with an
order-free reduction (:data:`ORDER_FREE`: max, min, argmax, argmin, bit for bit
in any fusion, unlike a sum) derives from values the backward has. The saved set
only shrinks; the variant is kept where the compiled peak falls.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxaot._src import compat as C
from jaxaot._src.partition.costs import Recompute, classify

#: Reductions whose result does not depend on the order of evaluation.
ORDER_FREE = frozenset({"reduce_max", "reduce_min", "argmax", "argmin"})
#: The most forward eqns one residual's chain may hold.
MAX_CHAIN = 8


@dataclasses.dataclass(frozen=True)
class RederivedBackward:
    """A backward that computes some residuals itself.

    Attributes:
      backward: the closed jaxpr ``(cotangents..., residuals at kept...) -> grads``.
      kept: positions (among the partition's residuals) still passed, in order.
      rederived: positions the backward now computes (empty: ``backward`` is the partition's).
    """

    backward: Any
    kept: tuple[int, ...]
    rederived: tuple[int, ...]


def _rederivable(eqn: Any) -> bool:
    if eqn.effects or C.eqn_subjaxprs(eqn):
        return False
    return eqn.primitive.name in ORDER_FREE or classify(eqn) is Recompute.CHEAP


def _chain(root: Any, producer: dict, defined: dict, before: float) -> list | None:
    """The forward eqns, in order, that compute ``root`` from values defined in the backward
    before position ``before``; None if there is no such chain within the limits."""
    chain: list = []
    seen: set[int] = set()

    def visit(v: Any) -> bool:
        eqn = producer.get(id(v))
        if eqn is None or not _rederivable(eqn):
            return False
        if id(eqn) in seen:  # reached twice (a diamond): already in the chain
            return True
        seen.add(id(eqn))
        if any(id(o) in defined for o in eqn.outvars if o is not root) or len(seen) > MAX_CHAIN:
            return False
        for u in eqn.invars:
            if C.is_literal(u):
                continue
            if id(u) in defined:
                if defined[id(u)] >= before:
                    return False
            elif not visit(u):
                return False
        chain.append(eqn)
        return True

    if not visit(root) or not any(e.primitive.name in ORDER_FREE for e in chain):
        return None
    return chain


def rederive_backward(part: Any, num_cotangents: int) -> RederivedBackward:
    """The partition ``part``'s backward, computing itself each residual it can derive again
    through an order-free reduction (see the module docstring).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> from jaxaot._src.partition.step import rederive_backward
        >>> def f(w, x):
        ...     s = x @ w
        ...     return jnp.sum(jnp.exp(s - jnp.max(s, axis=1, keepdims=True)) ** 2)
        >>> joint = jaxaot.partition.trace_joint(f, jnp.ones((3, 64)), jnp.ones((2, 3)))
        >>> part = jaxaot.partition.min_cut_rematerialization_partition(joint)
        >>> [r.producer for r in part.residuals]
        ['input', 'input', 'dot_general', 'reduce_max', 'reduce_sum']
        >>> lean = rederive_backward(part, 1)
        >>> lean.kept, lean.rederived
        ((0, 1, 2, 4), (3,))
        >>> eqns = lean.backward.jaxpr.eqns
        >>> str(eqns[0].primitive), len(lean.backward.jaxpr.invars)
        ('reduce_max', 5)
    """
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    residuals = list(bwd.invars[num_cotangents:])
    n_in = len(part.saved_inputs)
    produced = [fwd.invars[i] for i in part.saved_inputs] + [fwd.outvars[i] for i in part.saved_outputs]
    producer = {id(o): e for e in fwd.eqns for o in e.outvars}
    defined: dict[int, float] = {id(v): -1 for v in (*bwd.invars, *bwd.constvars)}
    first_read: dict[int, int] = {}
    for i, eqn in enumerate(bwd.eqns):
        for o in eqn.outvars:
            defined[id(o)] = i
        for v in eqn.invars:
            if not C.is_literal(v):
                first_read.setdefault(id(v), i)
    outputs = {id(v) for v in bwd.outvars if not C.is_literal(v)}
    candidates = sorted(
        (first_read[id(v)], k) for k, v in enumerate(residuals)
        if k >= n_in and produced[k] is v and id(v) in first_read and id(v) not in outputs)
    inserted: dict[int, list] = {}
    dropped: set[int] = set()
    pinned: set[int] = set()  # residuals an accepted chain reads: they must stay inputs
    for at, k in candidates:
        v = residuals[k]
        if id(v) in pinned:
            continue
        chain = _chain(v, producer, defined, at)  # v itself is never its own chain's input
        if chain is None:
            continue
        dropped.add(k)
        inserted.setdefault(at, []).extend(chain)
        for e in chain:
            for o in e.outvars:
                defined[id(o)] = at - 0.5
            pinned.update(id(u) for u in e.invars if not C.is_literal(u) and defined.get(id(u)) == -1)
    if not dropped:
        return RederivedBackward(part.backward, tuple(range(len(residuals))), ())
    eqns = [e for i, eqn in enumerate(bwd.eqns) for e in (*inserted.get(i, ()), eqn)]
    kept = tuple(k for k in range(len(residuals)) if k not in dropped)
    invars = list(bwd.invars[:num_cotangents]) + [residuals[k] for k in kept]
    closed = C.make_closed_jaxpr(bwd.constvars, invars, bwd.outvars, eqns, C.consts_of(part.backward))
    return RederivedBackward(closed, kept, tuple(sorted(dropped)))
