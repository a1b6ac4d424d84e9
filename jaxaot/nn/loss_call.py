"""``jaxaot.value_and_grad(loss_fn)(aot_model, ...)``: the eager training step of a module, compiled.

Eager ``nnx.value_and_grad(loss_fn)(aot_model, x, y)`` works, but every step
pays for Flax's graph traversals, JAX's eager linearization of the loss around
the module (each op of ``loss_fn`` dispatched and linearized one at a time),
the ``custom_vjp`` bookkeeping of the module's call and an eager transposition.
On small and medium models that costs more than the compiled programs
themselves (a 3-layer MLP on a CPU: 23 ms per step against 9 ms for the whole
step under ``nnx.jit``).

:func:`module_value_and_grad` is what :func:`jaxaot.value_and_grad` runs when
its differentiated argument is an :class:`~jaxaot.nn.nnx.AOTModule`. It treats
``loss_fn`` as a method of the module (:class:`LossCall`) and compiles the
module's loss as one more call of the module, through the module's own options
(partitioner, compilers): the pure function :func:`~jaxaot.nn.pure.nnx_loss_pure`
returns ``(loss, (aux, state delta))``. Its gradient then runs as
:func:`jaxaot.value_and_grad` runs an ``aot_function``: one fused executable
(forward, then backward, with the partition's plan) called on the module's
state and the batch; the delta is written back into the module.

Costs per step: one ``nnx.split`` of the module, the signature lookup (which
hashes the module's graphdef), one executable call, and the write-back.
``loss_fn`` is traced once per signature, as the module's call is: Python side
effects in it happen at trace time. Under a trace (``jit``, ``vmap``), or when
another argument holds Flax objects, it is ``nnx.value_and_grad`` itself.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> loss_fn = lambda m, x: jnp.sum(m(x) ** 2)
    >>> loss, grads = jaxaot.value_and_grad(loss_fn)(model, jnp.ones((4, 3)))
    >>> grads["module"]["kernel"][...].shape
    (3, 2)
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable

import jax
from flax import nnx

from jaxaot import _compat as C
from jaxaot.nn.call import _FLAX_OBJECTS, CallStatic, check_static
from jaxaot.nn.flax_functions import FLAX_VALUE_AND_GRAD
from jaxaot.nn.state import FrozenState, flat_inputs
from jaxaot.nn.traversal import remember
from jaxaot.runtime import AOTFunction, value_and_grad


@dataclasses.dataclass(frozen=True)
class LossCall:
    """``fun`` as a method of the module: ``LossCall(fun, position)(module, *rest)`` calls
    ``fun`` with the module inserted at ``position``. Hashable (it keys the compile cache)."""

    fun: Callable[..., Any]
    position: int
    has_aux: bool

    def __call__(self, module: nnx.Module, *args: Any, **kwargs: Any) -> Any:
        return self.fun(*args[: self.position], module, *args[self.position:], **kwargs)

    @property
    def __name__(self) -> str:  # CallStatic's repr names the method
        return getattr(self.fun, "__name__", "loss_fn")


#: Per loss program, the fused and split ``value_and_grad`` of it (each keeps its per-signature plans).
_GRADIENTS: "weakref.WeakKeyDictionary[AOTFunction, dict]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _gradient_of(program: AOTFunction, fused: bool) -> Callable[..., Any]:
    with _LOCK:
        per_mode = _GRADIENTS.setdefault(program, {})
        vg = per_mode.get(fused)
        if vg is None:
            vg = per_mode[fused] = value_and_grad(program, argnums=1, has_aux=True, fused=fused)
    return vg


def _needs_nnx(state: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether the call must go through ``nnx.value_and_grad``: traced inputs, or Flax objects besides the module."""
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, _FLAX_OBJECTS))
    return (any(C.is_tracer(x) or isinstance(x, _FLAX_OBJECTS) for x in leaves)
            or any(C.is_tracer(x) for x in jax.tree_util.tree_leaves(state)))


def module_value_and_grad(model: nnx.Module, loss_program: AOTFunction, fun: Callable[..., Any], position: int,
                          args: tuple, kwargs: dict, has_aux: bool, fused: bool) -> Any:
    """``nnx.value_and_grad(fun, argnums=position, has_aux=has_aux)(*args, **kwargs)``, as one compiled step.

    ``model`` is ``args[position]``, an :class:`~jaxaot.nn.nnx.AOTModule`;
    ``loss_program`` its ``aot_function`` of :func:`~jaxaot.nn.pure.nnx_loss_pure`.
    """
    rest = args[:position] + args[position + 1:]
    graphdef, params, state = nnx.split(model, nnx.Param, ...)
    if _needs_nnx((params, state), rest, kwargs):
        return FLAX_VALUE_AND_GRAD(fun, argnums=position, has_aux=has_aux)(*args, **kwargs)
    method = LossCall(fun, position, has_aux)
    check_static("loss function", method)
    static = CallStatic(graphdef, method, (), ())
    frozen = FrozenState.of(state, False)
    (loss, (aux, delta)), grads = _gradient_of(loss_program, fused)(static, params, frozen, *rest, **kwargs)
    if delta is None or _write_back(model, (params, state), delta.rebuild(flat_inputs((params, state), rest, kwargs))):
        remember(grads, model, params)  # optimizer.update(model, grads) need not walk the module again
    return ((loss, aux), grads) if has_aux else (loss, grads)


def _write_back(model: nnx.Module, live: tuple, changed: tuple) -> bool:
    """Set the changed values into the module's own Variables (``nnx.split`` hands out the live ones);
    False when the call created Variables (no live one at their path): those take ``nnx.update``,
    which also walks the module's graph.
    """
    pairs = []
    for live_state, new_state in zip(live, changed):
        by_path = dict(nnx.to_flat_state(live_state))
        for path, var in nnx.to_flat_state(new_state):
            target = by_path.get(path)
            if target is None:
                nnx.update(model, *changed)
                return False
            pairs.append((target, var))
    for target, var in pairs:
        target.set_value(var.get_value())
    return True
