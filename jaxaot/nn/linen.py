"""``AOTLinenModule``: a ``flax.linen`` module whose ``apply`` runs through :func:`jaxaot.aot_function`.

Linen is functional already: ``apply(variables, ..., mutable=[...])`` returns
the updated collections. The wrapper compiles ``apply`` as the pure function
``(static, params, state, rngs, *args, **kwargs) -> (out, StateDelta | None)``
where ``params`` is the ``"params"`` collection, ``state`` the others (frozen
when traced) and ``static`` holds ``method``, ``mutable`` and
``capture_intermediates``; it returns what linen returns.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from flax import linen as nn
    >>> dense = AOTLinenModule(nn.Dense(2), (), ())
    >>> variables = dense.module.init(jax.random.key(0), jnp.ones((1, 3)))
    >>> dense.apply(variables, jnp.ones((1, 3))).shape
    (1, 2)
"""

from __future__ import annotations

from typing import Any, Mapping

from flax import linen as nn

from jaxaot.errors import InvalidInputError
from jaxaot.nn.call import CallStatic, ModuleCall
from jaxaot.nn.metadata import ModuleLowered
from jaxaot.nn.state import FrozenState, StateDelta, flat_inputs
from jaxaot.runtime import CacheInfo, aot_function


def _normalize_mutable(mutable: Any) -> Any:
    # Hashable and canonical, so that equal filters share a compiled entry.
    if isinstance(mutable, (list, tuple, set, frozenset)):
        return tuple(sorted(mutable))
    return mutable


def _as_state_pair(variables: Mapping[str, Any]) -> tuple:
    # (params, other collections): the pair the pure function takes and its delta describes.
    return variables.get("params"), {k: v for k, v in variables.items() if k != "params"}


def _from_state_pair(params: Any, others: dict) -> dict:
    return {**({"params": params} if params is not None else {}), **others}


class AOTLinenModule:
    """A linen module whose ``apply`` runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. ``apply`` has linen's signature and return
    value: ``out``, or ``(out, updated_collections)`` when ``mutable`` is set.
    """

    def __init__(self, module: nn.Module, static_argnums: tuple, static_argnames: tuple, **aot_kwargs: Any):
        self.module = module
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.program = aot_function(self._pure, static_argnums=0, **aot_kwargs)

    def _pure(self, static: CallStatic, params: Any, state: FrozenState, rngs: Any, *args: Any, **kwargs: Any):
        others = state.thaw()
        full_args, full_kwargs = static.merge(args, kwargs)
        result = self.module.apply(_from_state_pair(params, others), *full_args, rngs=rngs, method=static.method,
                                   mutable=static.mutable, capture_intermediates=static.capture_intermediates,
                                   **full_kwargs)
        if static.mutable is False:
            return result, None
        out, new_vars = result
        old = (params, others)
        inputs = flat_inputs(old, (rngs, *args), kwargs)  # the traced leaves, in program order
        return out, StateDelta.capture(_as_state_pair(new_vars), old, inputs, state.frozen)

    def prepare_call(self, variables: Mapping[str, Any], args: tuple, kwargs: dict, *, rngs: Any = None,
                     method: Any = None, mutable: Any = False, capture_intermediates: Any = False,
                     freeze: bool | None = None) -> ModuleCall:
        """Within :mod:`jaxaot.nn` (``apply``, ``lower``, ``aot_export_module``): this call, prepared.

        The keywords are ``apply``'s; ``freeze`` is as in :class:`ModuleCall`.
        """
        if not isinstance(variables, Mapping):
            raise InvalidInputError(
                f"apply expects the variables mapping ({{'params': ...}}), got {type(variables).__name__}."
            )
        static, args, kwargs = CallStatic.split(
            args, kwargs, self.static_argnums, self.static_argnames, graphdef=None, method=method,
            mutable=_normalize_mutable(mutable), capture_intermediates=capture_intermediates)
        return ModuleCall(self.program, static, _as_state_pair(variables), args, kwargs, extra=(("rngs", rngs),),
                          freeze=freeze)

    def apply(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> Any:
        """``module.apply(variables, *args, rngs=..., method=..., mutable=..., **kwargs)``, compiled.

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> bn = nn.BatchNorm(use_running_average=False)
            >>> variables = bn.init(jax.random.key(0), jnp.ones((2, 3)))
            >>> y, updates = jaxaot.aot_module(bn).apply(variables, jnp.ones((2, 3)), mutable=["batch_stats"])
            >>> sorted(updates)
            ['batch_stats']
        """
        call = self.prepare_call(variables, args, kwargs, rngs=rngs, method=method, mutable=mutable,
                                 capture_intermediates=capture_intermediates)
        out, new_state = call.run_rebuilt()
        return out if new_state is None else (out, _from_state_pair(*new_state))

    __call__ = apply

    def lower(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> ModuleLowered:
        """Build everything for this ``apply`` signature (as traced) and describe it (see :class:`AOTModule.lower`)."""
        call = self.prepare_call(variables, args, kwargs, rngs=rngs, method=method, mutable=mutable,
                                 capture_intermediates=capture_intermediates, freeze=True)
        return call.lower()

    def cache_info(self) -> CacheInfo:
        """The compile cache of the underlying :class:`jaxaot.AOTFunction`.

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> m = jaxaot.aot_module(nn.Dense(2))
            >>> variables = m.module.init(jax.random.key(0), jnp.ones((1, 3)))
            >>> _ = m.apply(variables, jnp.ones((1, 3)))
            >>> m.cache_info().misses
            1
        """
        return self.program.cache_info()

    def __repr__(self) -> str:
        return f"<AOTLinenModule {type(self.module).__name__}: {self.program!r}>"
