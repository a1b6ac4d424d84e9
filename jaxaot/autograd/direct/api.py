"""``jaxaot.value_and_grad`` and ``jaxaot.grad``: eager gradients that go straight to compiled programs.

They take the arguments of ``jax.value_and_grad`` / ``jax.grad`` and dispatch on
what is differentiated:

* an ``aot_function``: its compiled forward and backward run directly on
  concrete arguments (:mod:`jaxaot.autograd.direct.function`);
* a plain function whose one differentiated argument (``argnums`` an int or a
  1-tuple) is an ``aot_module``: the function is compiled with the module into
  one step, with ``nnx.value_and_grad``'s results
  (:mod:`jaxaot.autograd.direct.module`); any other ``nnx.Module`` there (a
  plain model holding ``aot_module`` submodules, say): ``nnx.value_and_grad``;
* anything else: ``jax.value_and_grad`` itself.

Whether an argument is a Flax module is decided per call. No module can exist
before Flax is imported, so until then the check is one dictionary look-up,
and ``jaxaot.value_and_grad`` of plain functions never imports Flax.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import jax

from jaxaot.autograd.direct.function import function_value_and_grad
from jaxaot.runtime import AOTFunction


_MODULE_STEP: list = []  # the module step, once imported


def _module_step() -> Any:
    """:mod:`jaxaot.autograd.direct.module` once Flax is loaded (else None: no Flax module exists)."""
    if _MODULE_STEP:
        return _MODULE_STEP[0]
    if "flax" not in sys.modules:
        return None
    # Deferred, within this package: the module step imports Flax and jaxaot.nn.
    from jaxaot.autograd.direct import module

    _MODULE_STEP.append(module)
    return module


def _built_on_first_call(build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """``build()``'s function, built when first called: a training loop that writes
    ``jaxaot.value_and_grad(loss_fn)(model, ...)`` builds the gradient every step, and the
    module's compiled step never needs JAX's."""
    built: list = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not built:
            built.append(build())
        return built[0](*args, **kwargs)

    return call


def module_dispatch(fun: Callable[..., Any], argnums: Any, has_aux: bool, fused: bool,
                    fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback`` (a ``value_and_grad`` of ``fun``), except when the one differentiated argument
    (``argnums`` an int or a 1-tuple) is an ``nnx.Module``: then the call is an ``aot_module``'s compiled
    step, or ``nnx.value_and_grad`` for other modules, and with a 1-tuple ``argnums`` the gradients
    come in a 1-tuple, as JAX and Flax return them.
    :func:`value_and_grad` and :func:`~jaxaot.patch_value_and_grad` dispatch through it."""
    as_tuple = isinstance(argnums, (tuple, list))
    position = argnums[0] if as_tuple and len(argnums) == 1 else argnums
    if isinstance(position, bool) or not isinstance(position, int):  # DiffState, several argnums: not ours
        return fallback

    def vg(*args: Any, **kwargs: Any):
        step = _module_step()
        if step is not None and 0 <= position < len(args):
            if step.is_aot_module(args[position]):
                out, grads = step.module_value_and_grad(fun, position, args, kwargs, has_aux, fused)
                return out, ((grads,) if as_tuple else grads)
            if step.is_flax_module(args[position]):  # a plain module (it may hold aot_module submodules)
                return step.FLAX_VALUE_AND_GRAD(fun, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        return fallback(*args, **kwargs)

    return vg


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *, fused: bool = True
) -> Callable[..., Any]:
    """Like ``jax.value_and_grad``, with an eager fast path for :class:`~jaxaot.AOTFunction`.

    For a plain ``fun`` whose differentiated argument is a ``jaxaot.aot_module``
    (``loss_fn(aot_model, x, y)``), it behaves as ``nnx.value_and_grad``: the
    gradient is an ``nnx.State`` of the module's parameters, and the state the
    call changes is written back. Eagerly, ``fun`` is then traced once per
    signature together with the module and runs as one compiled step (Python
    side effects in ``fun`` happen when it is traced, as in the module's own
    call); under ``jit`` it is ``nnx.value_and_grad``.

    Args:
      fun, argnums, has_aux: as ``jax.value_and_grad``'s.
      fused: run one executable that computes the forward and then the
        backward, keeping the partition's plan (``docs/concepts/fused_step.md``);
        False runs the split forward and backward executables. ``cache_info()``
        lists which were compiled (``fused`` or ``forward``/``backward``).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
        >>> loss, dw = jaxaot.value_and_grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3)))
        >>> dw.shape
        (3, 2)
    """
    if isinstance(fun, AOTFunction):
        return function_value_and_grad(fun, argnums, has_aux, fused)
    if not callable(fun):
        jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux)  # JAX's own error
    return module_dispatch(fun, argnums, has_aux, fused,
                           _built_on_first_call(lambda: jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux)))


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *,
         fused: bool = True) -> Callable[..., Any]:
    """Like ``jax.grad``, with the eager fast path of :func:`value_and_grad`.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sum(x ** 2))
        >>> jaxaot.grad(f)(jnp.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
    """
    vg = value_and_grad(fun, argnums=argnums, has_aux=has_aux, fused=fused)

    def g(*args: Any, **kwargs: Any):
        value, gr = vg(*args, **kwargs)
        return (gr, value[1]) if has_aux else gr

    g.__wrapped__ = fun
    return g
