"""The functions behind a ``jax.custom_jvp`` or ``jax.custom_vjp`` equation's rules.

A traced program shows such an equation's primal function as a jaxpr, but its
rules only as JAX's wrappers (``fwd_jaxpr_thunk``, ``bwd``, ``jvp_jaxpr_fun``), whose
text says nothing of the rules' code. What differentiating the program yields
depends on that code, so a key of the program (the compile cache's) names the
rules by the functions the wrappers were made of: :func:`custom_rule_functions`, or by those wrappers themselves,
with the static arguments JAX flattened them with: :func:`custom_rule_wrappers`.
"""

from __future__ import annotations

import types
from typing import Any

import jax
from jax._src import custom_derivatives as _cd
from jax._src import linear_util as _lu

__all__ = ["custom_rule_functions", "custom_rule_parts", "custom_rule_wrappers"]

#: The equations whose params hold rules (by primitive name: the set differs between JAX versions).
_CUSTOM_CALLS = frozenset(p.name for p in (getattr(_cd, n, None) for n in (
    "custom_jvp_call_p", "custom_vjp_call_p", "custom_vjp_call_jaxpr_p", "custom_lin_p")) if p is not None)
#: How deep the search goes through wrappers and the closures of JAX's functions.
_DEPTH = 6


def custom_rule_functions(eqn: Any) -> tuple | None:
    """The user's (or a library's) functions behind ``eqn``'s rules, in the order its params list them: ``()`` for
    an equation without rules, None for one whose rules were not found (a key cannot name them).

    A rule reaches the equation as a ``WrappedFun`` that JAX made of the function with its flattening
    transformations; the wrappers around it (memoized thunks) close over it. Both are walked, the wrapped
    function of each transformed ``WrappedFun`` kept."""
    wrappers = custom_rule_wrappers(eqn)
    if wrappers is None:
        return None
    found: list = []
    for w in wrappers:
        if not any(f is w.f for f in found):
            found.append(w.f)
    return tuple(found)


def custom_rule_wrappers(eqn: Any) -> tuple | None:
    """The ``WrappedFun`` of each rule behind ``eqn`` (its function and the static arguments of its flattening
    transformations, a key's parts: ``rule_key``), as :func:`custom_rule_functions` finds them."""
    if eqn.primitive.name not in _CUSTOM_CALLS:
        return ()
    found: list = []
    for value in eqn.params.values():
        if isinstance(value, _lu.WrappedFun):
            _reach(value, found, 0, set())
    return tuple(found) or None


def _reach(obj: Any, found: list, depth: int, seen: set) -> None:
    if depth > _DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _lu.WrappedFun):
        if obj.transforms:  # a rule, flattened for JAX: the function it was made of
            if not any(w is obj for w in found):
                found.append(obj)
            return
        obj = obj.f  # a wrapper of JAX's (a memoized thunk): what it closes over
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, (_lu.WrappedFun, types.FunctionType)):
            _reach(value, found, depth + 1, seen)


def custom_rule_parts(value: Any) -> tuple | None:
    """A ``jax.custom_jvp``'s or ``custom_vjp``'s function, rules and static argument numbers (what it is made of,
    for a key of one made anew at every call); None for another object."""
    if not isinstance(value, (jax.custom_jvp, jax.custom_vjp)):
        return None
    return (value.fun, *(getattr(value, name, None) for name in ("jvp", "fwd", "bwd")),
            tuple(getattr(value, "nondiff_argnums", ())))
