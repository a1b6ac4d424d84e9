"""The eager gradient of a loss of an ``aot_module``: one compiled step.

Eager ``nnx.value_and_grad(loss_fn)(aot_model, ...)`` pays, every step, for Flax's
graph traversals and JAX's op-by-op linearization around the module, which on
small and medium models costs more than the compiled programs. What
:func:`module_value_and_grad` runs instead: the module compiles ``loss_fn`` as one
more call of itself (its ``loss_program``), and the gradient runs as that of an
``aot_function``, on the module's cached split. Under a trace it is
``nnx.value_and_grad`` itself. This module imports Flax.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> loss_fn = lambda m, x: jnp.sum(m(x) ** 2)
    >>> loss, grads = jaxaot.value_and_grad(loss_fn)(model, jnp.ones((4, 3)))
    >>> grads["kernel"][...].shape
    (3, 2)
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import jax
from flax import nnx

from jaxaot._src.autograd.direct.flax_functions import FLAX_VALUE_AND_GRAD
from jaxaot._src.autograd.direct.function_grad import function_value_and_grad
from jaxaot._src.nn import READS_A_NUMBER, AOTModule, PreparedLoss, has_numbers
from jaxaot._src.runtime import AOTFunction

_LOCK = threading.Lock()


def _gradient_of(program: AOTFunction, fused: bool) -> Callable[..., Any]:
    """The fused or split ``value_and_grad`` of a loss program (keeping its per-signature plans), held by the
    program, so that both go together."""
    key = ("module value_and_grad", fused)
    vg = program._derived.get(key)
    if vg is None:
        with _LOCK:
            vg = program._derived.get(key)
            if vg is None:
                vg = program._derived[key] = function_value_and_grad(program, argnums=1, has_aux=True, fused=fused)
    return vg


def is_aot_module(x: Any) -> bool:
    """Whether ``x`` is an ``aot_module`` (an :class:`~jaxaot._src.nn.AOTModule`)."""
    return isinstance(x, AOTModule)


def _is_module(x: Any) -> bool:
    return isinstance(x, nnx.Module)


def holds_flax_module(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.Module`` (a plain one may hold ``aot_module`` submodules) or a pytree holding one
    (a list, tuple or dict of modules), which ``nnx.value_and_grad`` finds by its graph traversal."""
    if isinstance(x, nnx.Module):
        return True
    if isinstance(x, jax.Array):
        return False
    return any(map(_is_module, jax.tree_util.tree_leaves(x, is_leaf=_is_module)))


#: What JAX raises where Python reads the value of a traced number: a loss given numbers is traced again with
#: them static (:func:`_run_loss`), once.
_READS_A_NUMBER = READS_A_NUMBER

#: Loss functions whose Python read the value of a number they were given (:func:`module_value_and_grad`).
_READS_NUMBERS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def module_value_and_grad(fun: Callable[..., Any], position: int, args: tuple, kwargs: dict, has_aux: bool,
                          fused: bool) -> Any:
    """``nnx.value_and_grad(fun, argnums=position, has_aux=has_aux)(*args, **kwargs)``, as one compiled step.

    ``args[position]`` is an :class:`~jaxaot._src.nn.AOTModule`.
    """
    return _run_loss(fun, position, args, kwargs, has_aux, fused, fun in _READS_NUMBERS)


def _run_loss(fun: Callable[..., Any], position: int, args: tuple, kwargs: dict, has_aux: bool, fused: bool,
              numbers: bool) -> Any:
    model = args[position]
    loss = PreparedLoss.of(model, fun, position, args, kwargs, has_aux, numbers)
    if loss is None:
        return FLAX_VALUE_AND_GRAD(fun, argnums=position, has_aux=has_aux)(*args, **kwargs)
    try:
        (value, (aux, delta)), grads = _gradient_of(model.loss_program, fused)(*loss.inputs, **loss.kwargs)
    except _READS_A_NUMBER:
        if numbers or not has_numbers(args, kwargs):
            raise
        try:
            _READS_NUMBERS.add(fun)  # its Python reads a number it was given: numbers are its statics from now on
        except TypeError:
            pass  # not weakly referable: each call finds it out again
        return _run_loss(fun, position, args, kwargs, has_aux, fused, True)
    grads = loss.finish(delta, grads)
    return ((value, loss.relinked(aux)), grads) if has_aux else (value, grads)
