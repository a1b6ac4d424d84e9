"""``AOTModule``: a ``flax.nnx`` module whose call runs through :func:`jaxaot.aot_function`.

The call becomes the pure function :func:`~jaxaot.nn.pure.nnx_pure`
``(static, params, state, *args, **kwargs) -> (out, StateDelta)``, which
reports the Variables whose values the call replaced (batch statistics, RNG
counts, user Variables, ``sow``\\ n intermediates). :class:`AOTModule` writes
them back into the wrapped module after each call, leaving it as eager Flax
would. ``jaxaot.value_and_grad(loss_fn)(aot_model, ...)`` runs the module's
loss as one compiled step (:mod:`jaxaot.nn.loss_call`, :mod:`jaxaot.autograd`).

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

from flax import nnx

from jaxaot.errors import InvalidInputError
from jaxaot.nn.call import CallStatic, Method, ModuleCall, check_static
from jaxaot.nn.metadata import ModuleLowered
from jaxaot.nn.pure import inlining, invoke, nnx_loss_pure, nnx_pure
from jaxaot.runtime import AOTFunction, CacheInfo, aot_function


# --------------------------------------------------------------------------- the wrapper
class AOTModule(nnx.Module):
    """An ``nnx.Module`` whose call runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. It holds the wrapped module as
    ``.module`` (so ``nnx.grad``, ``nnx.Optimizer``, ``nnx.split``, ``.train()``
    and ``.eval()`` see its state) and writes mutated state back after each call.
    """

    def __init__(self, module: nnx.Module, program: AOTFunction, method: Method, static_argnums: tuple,
                 static_argnames: tuple, loss_program: AOTFunction | None = None):
        self.module = module
        self.program = program
        self.loss_program = loss_program
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
        if inlining():  # traced into a loss program (jaxaot.value_and_grad): one program for both
            return invoke(self.module, self.method, args, kwargs)
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
    program = aot_function(nnx_pure, static_argnums=0, **aot_kwargs)
    loss_program = aot_function(nnx_loss_pure, static_argnums=0, **aot_kwargs)
    return AOTModule(module, program, method, static_argnums, static_argnames, loss_program)
