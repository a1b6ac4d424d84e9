"""A loss function of an ``AOTModule``, prepared as one more call of the module.

``jaxaot.value_and_grad(loss_fn)(aot_model, x, y)`` (:mod:`jaxaot.autograd`)
compiles ``loss_fn`` together with the module and runs its gradient as one
executable (``docs/concepts/modules.md``, "The eager training step"). This module
is the Flax side of that step, as :class:`~jaxaot.nn.call.ModuleCall` is for the
module's own call:

* :class:`LossCall` treats ``loss_fn`` as a method of the module (hashable: it
  keys the compile cache), so the module's loss program, the pure function
  :func:`~jaxaot.nn.pure.nnx_loss_pure`, returns ``(loss, (aux, state delta))``;
* :meth:`PreparedLoss.of` splits the module once into the loss program's inputs
  (its static part, parameters, frozen state, the other arguments), or says the
  call must go through ``nnx.value_and_grad`` itself: traced inputs (under
  ``jit``, ``vmap``), or other arguments holding Flax objects;
* :meth:`PreparedLoss.finish` writes the state the call changed back into the
  module's own Variables and remembers the parameters behind the gradients for
  :class:`~jaxaot.nn.optimizer.Optimizer` (:mod:`jaxaot.nn.traversal`).

Costs per step: one ``nnx.split`` of the module and the write-back; the
signature look-up (which hashes the module's graphdef) and the executable call
are the gradient's. ``loss_fn`` is traced once per signature, as the module's
call is: Python side effects in it happen at trace time.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> loss = PreparedLoss.of(model, lambda m, x: jnp.sum(m(x) ** 2), 0, (model, jnp.ones((4, 3))), {}, False)
    >>> [type(x).__name__ for x in loss.inputs[:3]], loss.inputs[3].shape   # then the other arguments
    (['CallStatic', 'State', 'FrozenState'], (4, 3))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from flax import nnx

from jaxaot import _compat as C
from jaxaot.nn.call import _FLAX_OBJECTS, CallStatic, check_static
from jaxaot.nn.state import FrozenState, flat_inputs
from jaxaot.nn.traversal import remember


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


def _needs_nnx(state: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether the call must go through ``nnx.value_and_grad``: traced inputs, or Flax objects besides the module."""
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, _FLAX_OBJECTS))
    return (any(C.is_tracer(x) or isinstance(x, _FLAX_OBJECTS) for x in leaves)
            or any(C.is_tracer(x) for x in jax.tree_util.tree_leaves(state)))


class PreparedLoss:
    """``fun(*args, **kwargs)`` with ``args[position]`` an ``AOTModule``, as inputs of its loss program.

    Attributes:
      inputs: the loss program's positional arguments ``(static, params, frozen state, *other args)``
        (the keyword arguments are the call's own).
    """

    def __init__(self, model: nnx.Module, inputs: tuple, live: tuple, rest: tuple, kwargs: dict):
        self.model = model
        self.inputs = inputs
        self._live = live
        self._rest = rest
        self._kwargs = kwargs

    @classmethod
    def of(cls, model: nnx.Module, fun: Callable[..., Any], position: int, args: tuple, kwargs: dict,
           has_aux: bool) -> "PreparedLoss | None":
        """The prepared call, or None where it must be ``nnx.value_and_grad`` itself."""
        rest = args[:position] + args[position + 1:]
        graphdef, params, state = nnx.split(model, nnx.Param, ...)
        if _needs_nnx((params, state), rest, kwargs):
            return None
        method = LossCall(fun, position, has_aux)
        check_static("loss function", method)
        static = CallStatic(graphdef, method, (), ())
        return cls(model, (static, params, FrozenState.of(state, False), *rest), (params, state), rest, kwargs)

    def finish(self, delta: Any, grads: Any) -> None:
        """Write the changed state (the loss program's ``StateDelta``, or None) back into the module,
        and remember ``grads``' parameters for the optimizer's update."""
        if delta is None or _write_back(self.model, self._live,
                                        delta.rebuild(flat_inputs(self._live, self._rest, self._kwargs))):
            remember(grads, self.model, self._live[0])  # optimizer.update(model, grads) need not walk the module


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


__all__ = ["LossCall", "PreparedLoss"]
