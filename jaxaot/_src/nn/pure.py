"""The module call as a pure function of its state, for :func:`jaxaot.aot_function`.

:func:`nnx_pure` merges the module from its graphdef (in the
:class:`~jaxaot._src.nn.module_call.CallStatic`) and state, calls it, and reports the
Variables whose values the call replaced (batch statistics, RNG counts, user
Variables, ``sow``\\ n intermediates) as a :class:`~jaxaot._src.nn.state.StateDelta`.
:func:`nnx_loss_pure` is the same for a loss function of the module
(:mod:`jaxaot._src.nn.loss_call`), shaped as ``value_and_grad(..., has_aux=True)`` wants it.
:func:`linen_pure` is a Linen module's ``apply`` (the module is ``static.graphdef``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import jax
from flax import nnx

from jaxaot.errors import InvalidOutputError
from jaxaot._src import compat as C
from jaxaot._src.pytrees import flatten_checked
from jaxaot._src.nn.graph_changes import check_unchanged, layout
from jaxaot._src.nn.module_call import CallStatic, Method
from jaxaot._src.nn.python_values import detached_graphdef, kept_aux
from jaxaot._src.nn.state import FrozenState, StateDelta, flat_inputs


def _leaves_by_path(state: nnx.State) -> dict:
    return {path: jax.tree.leaves(var) for path, var in nnx.to_flat_state(state)}


def _changed_variables(before: dict, new: nnx.State) -> nnx.State:
    """The Variables of ``new`` whose leaves are not those recorded in ``before`` (or are new)."""
    changed = []
    for path, var in nnx.to_flat_state(new):
        prev = before.get(path)
        leaves = jax.tree.leaves(var)
        if prev is None or len(prev) != len(leaves) or any(a is not b for a, b in zip(prev, leaves)):
            changed.append((path, var))
    return nnx.from_flat_state(changed)


def _invoke(module: nnx.Module, method: Method, args: tuple, kwargs: dict) -> Any:
    if isinstance(method, str):
        return getattr(module, method)(*args, **kwargs)
    return method(module, *args, **kwargs)


def nnx_pure(static: CallStatic, params: Any, state: FrozenState, *args: Any, **kwargs: Any):
    """The module call as a pure function: ``-> (outputs, StateDelta of changed Variables)``.

    ``params`` is the parameters' State, or its flat leaves when ``static.param_tree`` is set.

    Raises:
      InvalidInputError: the call changed the module's graph other than by Variables
        (:mod:`~jaxaot._src.nn.graph_changes`): that change could not be written back.
    """
    if static.param_tree is not None:
        params = jax.tree_util.tree_unflatten(static.param_tree, params)
    rest = state.thaw()
    old = (params, rest)
    # Snapshot before the call: merge reuses these Variables, and the call mutates them.
    inputs = flat_inputs(old, args, kwargs)
    before = (_leaves_by_path(params), _leaves_by_path(rest))
    # A fresh copy of the graphdef's dicts and lists: the call may change them, the compile cache keys on them.
    module = nnx.merge(detached_graphdef(static.graphdef), params, rest)
    structure = layout(module)
    out = _invoke(module, static.method, *static.merge(args, kwargs))
    loss = getattr(static.method, "fun", None)  # a loss function's call (LossCall), named as such
    check_unchanged(module, structure, loss=None if loss is None else getattr(loss, "__name__", "loss_fn"))
    new_params, new_rest = nnx.state(module, nnx.Param, ...)
    changed = (_changed_variables(before[0], new_params), _changed_variables(before[1], new_rest))
    return out, StateDelta.capture(changed, old, inputs, state.frozen)


def nnx_call_pure(static: CallStatic, params: Any, state: FrozenState, *args: Any, **kwargs: Any):
    """:func:`nnx_pure` for the module's own call, whose outputs leave the program: one that is not an array is
    named by its place in what the call returned (``output['tag']``)."""
    out, delta = nnx_pure(static, params, state, *args, **kwargs)
    flatten_checked(out, "output", InvalidOutputError)
    return out, delta


_INLINE = threading.local()


@contextlib.contextmanager
def _inlining() -> Iterator[None]:
    previous = getattr(_INLINE, "on", False)
    _INLINE.on = True
    try:
        yield
    finally:
        _INLINE.on = previous


def inlining() -> bool:
    """Whether a loss program is being traced: ``AOTModule`` calls then run their module directly,
    so the module's call joins the loss program instead of nesting its own."""
    return getattr(_INLINE, "on", False)


def invoke(module: nnx.Module, method: Method, args: tuple, kwargs: dict) -> Any:
    """``module.method(*args, **kwargs)`` (``method`` a name or ``fn(module, *args, **kwargs)``)."""
    return _invoke(module, method, args, kwargs)


def nnx_loss_pure(static: CallStatic, params: Any, state: FrozenState, *args: Any, **kwargs: Any):
    """``(loss, (aux, StateDelta))`` of a loss call (``static.method`` is a :class:`~jaxaot._src.nn.loss_call.LossCall`).

    The module's own calls inside the loss are inlined (:func:`inlining`). Traced, the leaves of ``aux`` that
    the loss returns untraced (Python values, NumPy values) stay out of the program's outputs and come back as
    they were returned (:func:`~jaxaot._src.nn.python_values.kept_aux`), as ``nnx.value_and_grad`` returns them.
    """
    with _inlining():
        out, delta = nnx_pure(static, params, state, *args, **kwargs)
    if not static.method.has_aux:
        return out, (None, delta)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise InvalidOutputError(
            f"value_and_grad(..., has_aux=True) requires the function to return a pair (loss, aux), "
            f"got {type(out).__name__}."
        )
    aux = out[1]
    if any(map(C.is_tracer, jax.tree_util.tree_leaves((params, state, args, kwargs)))):
        aux = kept_aux(aux)
    return out[0], (aux, delta)


def linen_pure(static: CallStatic, params: Any, state: FrozenState, rngs: Any, *args: Any, **kwargs: Any):
    """``static.graphdef.apply`` (a Linen module) as a pure function: ``-> (out, StateDelta | None)``,
    the delta of the collections ``static.mutable`` names."""
    others = state.thaw()
    full_args, full_kwargs = static.merge(args, kwargs)
    variables = {**({"params": params} if params is not None else {}), **others}
    result = static.graphdef.apply(variables, *full_args, rngs=rngs, method=static.method, mutable=static.mutable,
                                   capture_intermediates=static.capture_intermediates, **full_kwargs)
    if static.mutable is False:
        return result, None
    out, new_vars = result
    old = (params, others)
    inputs = flat_inputs(old, (rngs, *args), kwargs)  # the traced leaves, in program order
    new = (new_vars.get("params"), {k: v for k, v in new_vars.items() if k != "params"})
    return out, StateDelta.capture(new, old, inputs, state.frozen)
