"""``AOTModule``: a ``flax.nnx`` module whose call runs through :func:`jaxaot.aot_function`.

The call becomes :func:`~jaxaot._src.nn.pure.nnx_pure`, which reports the Variables
it replaced (batch statistics, RNG counts, ``sow``\\ n values); :class:`AOTModule`
writes them back, leaving the module as eager Flax would. The wrapper is a
:class:`~jaxaot._src.nn.proxy.ProxyModule`, so its attributes, state and paths are
the wrapped module's and it mixes with plain Flax state; eager calls reuse the
module's kept split instead of walking Flax's graph.

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> bn = nnx.BatchNorm(2, rngs=nnx.Rngs(0))
    >>> aot_bn = wrap_nnx(bn, "__call__", (), ())
    >>> _ = aot_bn(jnp.array([[0.0, 1.0], [2.0, 3.0]]))
    >>> bool(jnp.allclose(bn.mean[...], jnp.array([0.01, 0.02])))   # momentum 0.99: 1% of the batch mean
    True
    >>> aot_bn.mean is bn.mean   # the wrapped module's attributes are the wrapper's
    True
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from jaxaot.errors import InvalidInputError
from jaxaot._src.nn.module_call import CallStatic, Method, ModuleCall, check_static, run_reading_numbers
from jaxaot._src.nn.metadata import ModuleLowered
from jaxaot._src.nn.module_programs import ModulePrograms
from jaxaot._src.nn.proxy import ProxyModule
from jaxaot._src.nn.nnx_capture import run_direct
from jaxaot._src.nn.pure import inlining
from jaxaot._src.nn.split_cache import ModuleSplit, split_of, write_back
from jaxaot._src.runtime import AOTFunction, CacheInfo


class AOTModule(ProxyModule):
    """An ``nnx.Module`` whose call runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. Its attributes, state and graph are the
    wrapped module's (``aot_model.kernel`` is ``module.kernel``; ``nnx.state``
    of a model holding it has the paths the model holding ``module`` has), and
    it writes mutated state back into the wrapped module after each call.
    Traced into a loss program, or while ``nnx.capture`` collects from it, the
    call runs the wrapped module's Python (``docs/concepts/modules.md``).
    """

    @property
    def wrapped(self) -> nnx.Module:
        """The wrapped module (whose state the calls read and write)."""
        return self._jaxaot_inner

    @property
    def programs(self) -> ModulePrograms:
        """The compiled programs and their options (shared by the module's copies)."""
        return self._jaxaot_extra

    @property
    def program(self) -> AOTFunction:
        """The ``aot_function`` of the module's call."""
        return self._jaxaot_extra.program

    @property
    def loss_program(self) -> AOTFunction:
        """The ``aot_function`` of a loss of the module (:func:`jaxaot.value_and_grad`)."""
        return self._jaxaot_extra.loss_program

    def prepare_call(self, args: tuple, kwargs: dict, *, freeze: bool | None = None) -> ModuleCall:
        """This call, prepared for the module's program: what ``__call__``, ``lower`` and
        :func:`~jaxaot.nn.aot_export_module` run first.

        ``freeze``: pass the state other than the parameters in frozen, so that it gets no
        cotangents; None: when any input is traced, i.e. when the call may be differentiated.
        """
        return self._prepare(split_of(self, self._jaxaot_inner), args, kwargs, freeze)

    def _prepare(self, split: ModuleSplit, args: tuple, kwargs: dict, freeze: bool | None,
                 numbers: bool = False) -> ModuleCall:
        programs = self._jaxaot_extra
        static, args, kwargs = CallStatic.split(args, kwargs, programs.static_argnums, programs.static_argnames,
                                                graphdef=split.graphdef, method=programs.method,
                                                param_tree=split.param_tree, cache=split.static,
                                                numbers=numbers or programs.reads_numbers)
        return ModuleCall(programs.program, static, (split.params, split.rest), args, kwargs, freeze=freeze,
                          leaves=split.leaves(), rest_tree=split.rest_tree)

    def lower(self, *args: Any, **kwargs: Any) -> ModuleLowered:
        """Build everything for this call signature (as traced, i.e. training) and describe it.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> bn = jaxaot.nn.aot_module(nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
            >>> meta = bn.lower(jnp.ones((2, 3))).meta
            >>> [(i.name, i.kind, i.mutated) for i in meta.inputs][2:]
            [('mean', 'state', True), ('var', 'state', True), ('arg[0]', 'user_input', False)]
        """
        return self.prepare_call(args, kwargs, freeze=True).lower()

    def cache_info(self) -> CacheInfo:
        """The compile caches of the module's programs: its call (entries labelled ``call``) and the
        losses :func:`jaxaot.value_and_grad` compiled with it (``loss``).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
            >>> _ = model(jnp.ones((1, 3)))
            >>> _ = jaxaot.value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))(model, jnp.ones((1, 3)))
            >>> info = model.cache_info()
            >>> info.misses, [e.program for e in info.entries]
            (2, ['call', 'loss'])
        """
        programs = self._jaxaot_extra
        return CacheInfo.combine({"call": programs.program.cache_info(), "loss": programs.loss_program.cache_info()})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Private helpers only: nnx.capture(method_outputs=...) swaps this class's public methods for sowing ones.
        inner = self._jaxaot_inner
        if inlining():  # traced into a loss program (jaxaot.value_and_grad): one program for both
            return run_direct(type(self), inner, self._jaxaot_extra.method, args, kwargs)
        split = split_of(self, inner)
        if split.capturing:  # nnx.capture collects: its swapped methods are Python the program cannot see
            return run_direct(type(self), inner, self._jaxaot_extra.method, args, kwargs)
        return run_reading_numbers(self._jaxaot_extra, args, kwargs, lambda numbers: self._run(
            split, args, kwargs, numbers))

    def _run(self, split: ModuleSplit, args: tuple, kwargs: dict, numbers: bool) -> Any:
        call = self._prepare(split, args, kwargs, None, numbers)
        out, delta = call.run()
        if delta.sources:
            write_back(self._jaxaot_inner, split, delta, call.flat_inputs)
        return out


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
    return AOTModule(module, ModulePrograms(method, static_argnums, static_argnames, aot_kwargs, type(module)))
