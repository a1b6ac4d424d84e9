"""The :class:`~.ops.Op` of one primitive applied to recorded values, memoized by primitive, avals and params.

A ``jit`` region closing over concrete arrays keeps them in its jaxpr (JAX's consts);
its ``Op`` takes them as leading arguments instead (:func:`~jaxaot._src.compat.hoisted_jit`),
which the tape makes inputs of the step, as it makes every array the forward closes
over: new values each call, no new structure. Only such a region pays for this: the
check runs where an ``Op`` is made, not where a memoized one is found.
"""

from __future__ import annotations

from typing import Any

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded import ops as O
from jaxaot._src.autograd.recorded.structure import closes_over, param_key, rules_keyed

_SIMPLE = (int, str, bool, type(None))  # a float is keyed by its bits (param_key): -0.0 is not 0.0

#: (primitive, input avals, params items) -> :class:`~.ops.Op`, for params that hash (jaxprs by
#: identity): the same ``jit`` region binds the same param objects every step, so one lookup replaces
#: its abstract evaluation and the walk of its jaxpr.
_MEMO: dict[tuple, O.Op] = {}
_MEMO_MAX = 4096


def params_key(params: dict) -> tuple:
    """A hashable key of an equation's params (jaxprs by structure: :func:`~.structure.param_key`)."""
    return tuple((k, v if type(v) in _SIMPLE else param_key(v)) for k, v in params.items())


def op(prim: Any, ins: tuple, avals: list, params: dict) -> O.Op:
    """The :class:`~.ops.Op` of one primitive application to the values ``ins`` (its output avals, effects
    and params key). Its ``special`` is set when it has effects or takes ``consts`` before ``ins``; ``closes``
    when a sub-jaxpr in it closes over arrays its key holds by value."""
    try:
        memo = (prim, *[avals[v] for v in ins], *params.items())
        hit = _MEMO.get(memo)
    except TypeError:  # an unhashable param: described afresh, keyed by content
        return _made(prim, ins, avals, params, True)
    if hit is None:
        before = rules_keyed()
        hit = _made(prim, ins, avals, params, False)
        if rules_keyed() != before:  # a custom rule's reads in its key: made anew next time (structure.rules_keyed)
            return hit
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[memo] = hit
    return hit


def _made(prim: Any, ins: tuple, avals: list, params: dict, by_content: bool) -> O.Op:
    out, effects = C.abstract_eval(prim, [avals[v] for v in ins], params)
    hoisted = C.hoisted_jit(prim, params)
    if hoisted is not None:  # the region's arrays become leading arguments: its own outputs and effects
        params, consts = hoisted
    made = O.Op(prim, params, tuple(out), params_key(params), False, effects, by_content=by_content)
    if hoisted is not None:
        made.consts, made.special = tuple(consts), True
    made.closes = closes_over(made.pkey)  # arrays closed over deeper (a jit inside a cond): in the key by value
    return made
