"""The inputs of an ``aot_module``'s programs named as the user wrote them, in cache entries and reasons.

The programs take ``(static, params, state, *args)``: the parameters as a flat list, the other state as a
:class:`~jaxaot._src.nn.state.FrozenState` and the call's arguments by position. Their entries name those as
the module holds them and the method (or loss function) takes them: ``params['l1']['kernel']``,
``state['bn']['mean']``, ``x``, where a plain function's would read ``params[1]``, ``state[<flat index 0>]``,
``args[0]``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from jaxaot._src.nn.loss_call import LossCall
from jaxaot._src.nn.module_call import CallStatic
from jaxaot._src.nn.state import FrozenState
from jaxaot._src.pytrees import leaf_paths
from jaxaot._src.runtime import ArgNames

_STATIC, _PARAMS, _STATE = 0, 1, 2  #: positions of the programs' own arguments; the call's follow


def method_names(module_type: type, method: Any) -> Callable[[int], str]:
    """The names of the positional arguments a call of ``method`` takes after the module (``method`` a method's
    name on ``module_type``, or ``fn(module, ...)``)."""
    names = ArgNames.of(getattr(module_type, method, None) if isinstance(method, str) else method)
    return lambda i: names(i + 1)


def loss_names(call: LossCall) -> Callable[[int], str]:
    """The names of a loss call's traced arguments: the loss function's, less the module and its Python values."""
    names = ArgNames.of(call.fun)
    static = {i for i, _ in call.statics}

    def name(k: int) -> str:
        other = [i for i in range(k + len(static) + 1) if i not in static][k]  # among the arguments but the module
        return names(other if other < call.position else other + 1)

    return name


def _trimmed(path: str) -> str:
    """An nnx Variable's leaf without its ``.value``: ``['l1']['kernel']``."""
    return path[: -len(".value")] if path.endswith(".value") else path


class ModuleArgNames(ArgNames):
    """:class:`~jaxaot._src.runtime.ArgNames` of one signature of an ``aot_module`` program."""

    def __init__(self, static: CallStatic, dynamic: tuple, call: Callable[[int], str]):
        super().__init__()
        self.call = call
        tree = static.param_tree
        self.params = [_trimmed(p) for p in leaf_paths(tree)] if tree is not None else []
        state = dynamic[_STATE - 1] if len(dynamic) >= _STATE else None
        self.state = [_trimmed(p) for p in leaf_paths(state.treedef)] if isinstance(state, FrozenState) else []

    def __call__(self, i: int) -> str:
        return ("static", "params", "state")[i] if i <= _STATE else self.call(i - _STATE - 1)

    def path(self, i: int, rest: tuple) -> str:
        held = {_PARAMS: self.params, _STATE: self.state}.get(i, ())
        index = getattr(rest[0], "idx", getattr(rest[0], "key", None)) if rest else None
        if isinstance(index, int) and 0 <= index < len(held):
            return self(i) + held[index] + jax.tree_util.keystr(rest[1:])
        return super().path(i, rest)


def names_for(module_type: type | None = None, method: Any = None) -> Callable[[Any], ArgNames]:
    """``sig -> ArgNames`` for an ``aot_module`` program: the call's arguments named by ``method``'s parameters
    (a method of ``module_type``), or, for the loss program (no ``method``), by the loss function's."""
    call = method_names(module_type, method) if method is not None else None

    def of(sig: Any) -> ArgNames:
        static = sig.static[0].value
        if not isinstance(static, CallStatic):
            return ArgNames()
        names = call or (loss_names(static.method) if isinstance(static.method, LossCall) else ArgNames())
        dummy = jax.tree_util.tree_unflatten(sig.treedef, list(range(sig.treedef.num_leaves)))
        return ModuleArgNames(static, tuple(dummy[0]), names)

    return of


__all__ = ["ModuleArgNames", "loss_names", "method_names", "names_for"]
