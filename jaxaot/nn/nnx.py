"""``AOTModule``: a ``flax.nnx`` module whose call runs through :func:`jaxaot.aot_function`.

The call becomes the pure function ``_nnx_pure(static, params, state, *args,
**kwargs) -> (out, StateDelta)``: it merges the module from its graphdef (in
the :class:`CallStatic`) and state, calls it, and reports the Variables whose
values the call replaced (batch statistics, RNG counts, user Variables,
``sow``\\ n intermediates). :class:`AOTModule` writes them back into the wrapped
module after each call, leaving it as eager Flax would.

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> bn = nnx.BatchNorm(2, rngs=nnx.Rngs(0))
    >>> aot_bn = wrap_nnx(bn, "__call__", (), ())
    >>> _ = aot_bn(jnp.array([[0.0, 1.0], [2.0, 3.0]]))
    >>> bool(jnp.allclose(bn.mean[...], jnp.array([0.01, 0.02])))   # momentum 0.99: 1% of the batch mean
    True
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from jaxaot.errors import InvalidInputError
from jaxaot.nn.call import CallStatic, Method, ModuleCall, check_static
from jaxaot.nn.metadata import ModuleLowered
from jaxaot.nn.state import FrozenState, StateDelta, flat_inputs
from jaxaot.runtime import AOTFunction, CacheInfo, aot_function


# --------------------------------------------------------------------------- the pure function
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


def _nnx_pure(static: CallStatic, params: nnx.State, state: FrozenState, *args: Any, **kwargs: Any):
    """The module call as a pure function: ``-> (outputs, StateDelta of changed Variables)``."""
    rest = state.thaw()
    old = (params, rest)
    # Snapshot before the call: merge reuses these Variables, and the call mutates them.
    inputs = flat_inputs(old, args, kwargs)
    before = (_leaves_by_path(params), _leaves_by_path(rest))
    module = nnx.merge(static.graphdef, params, rest)
    out = _invoke(module, static.method, *static.merge(args, kwargs))
    new_params, new_rest = nnx.state(module, nnx.Param, ...)
    changed = (_changed_variables(before[0], new_params), _changed_variables(before[1], new_rest))
    return out, StateDelta.capture(changed, old, inputs, state.frozen)


# --------------------------------------------------------------------------- the wrapper
class AOTModule(nnx.Module):
    """An ``nnx.Module`` whose call runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. It holds the wrapped module as
    ``.module`` (so ``nnx.grad``, ``nnx.Optimizer``, ``nnx.split``, ``.train()``
    and ``.eval()`` see its state) and writes mutated state back after each call.
    """

    def __init__(self, module: nnx.Module, program: AOTFunction, method: Method, static_argnums: tuple,
                 static_argnames: tuple):
        self.module = module
        self.program = program
        self.method = method
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames

    def prepare_call(self, args: tuple, kwargs: dict, *, freeze: bool | None = None) -> ModuleCall:
        """Within :mod:`jaxaot.nn` (``__call__``, ``lower``, ``aot_export_module``): this call, prepared.

        ``freeze`` is as in :class:`ModuleCall`.
        """
        graphdef, params, rest = nnx.split(self.module, nnx.Param, ...)
        static, args, kwargs = CallStatic.split(args, kwargs, self.static_argnums, self.static_argnames,
                                                graphdef=graphdef, method=self.method)
        return ModuleCall(self.program, static, (params, rest), args, kwargs, freeze=freeze)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out, (changed_params, changed_rest) = self.prepare_call(args, kwargs).run()
        if len(changed_params) or len(changed_rest):
            nnx.update(self.module, changed_params, changed_rest)
        return out

    def lower(self, *args: Any, **kwargs: Any) -> ModuleLowered:
        """Build everything for this call signature (as traced, i.e. training) and describe it.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> bn = jaxaot.aot_module(nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
            >>> meta = bn.lower(jnp.ones((2, 3))).meta
            >>> [(i.name, i.kind, i.mutated) for i in meta.inputs][2:]
            [('mean', 'state', True), ('var', 'state', True), ('arg[0]', 'user_input', False)]
        """
        return self.prepare_call(args, kwargs, freeze=True).lower()

    def cache_info(self) -> CacheInfo:
        """The compile cache of the underlying :class:`jaxaot.AOTFunction`.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> model = jaxaot.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
            >>> _ = model(jnp.ones((1, 3)))
            >>> model.cache_info().misses
            1
        """
        return self.program.cache_info()


def wrap_nnx(module: nnx.Module, method: Method, static_argnums: tuple, static_argnames: tuple,
             **aot_kwargs: Any) -> AOTModule:
    """An :class:`AOTModule` of ``module`` (``aot_kwargs`` as in :func:`jaxaot.aot_function`).

    Raises:
      InvalidInputError: ``method`` is not a method of ``module`` nor a hashable callable.
    """
    if isinstance(method, str) and not callable(getattr(module, method, None)):
        raise InvalidInputError(f"{type(module).__name__} has no method {method!r}.")
    if not isinstance(method, str) and not callable(method):
        raise InvalidInputError(f"method must be a method name or a callable, got {type(method).__name__}.")
    check_static("method", method)
    program = aot_function(_nnx_pure, static_argnums=0, **aot_kwargs)
    return AOTModule(module, program, method, static_argnums, static_argnames)
