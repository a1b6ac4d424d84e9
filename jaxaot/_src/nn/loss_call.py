"""A loss function of an ``AOTModule``, prepared as one more call of the module.

``jaxaot.value_and_grad(loss_fn)(aot_model, x, y)`` (:mod:`jaxaot._src.autograd`)
compiles ``loss_fn`` together with the module and runs its gradient as one
executable (``docs/concepts/modules.md``, "The eager training step"). This module
is the Flax side of that step, as :class:`~jaxaot._src.nn.call.ModuleCall` is for the
module's own call:

* :class:`LossCall` treats ``loss_fn`` as a method of the module (hashable: it
  keys the compile cache), so the module's loss program, the pure function
  :func:`~jaxaot._src.nn.pure.nnx_loss_pure`, returns ``(loss, (aux, state delta))``;
  inside it ``loss_fn`` gets the rebuilt module wrapped as an ``AOTModule``,
  whose calls then join the loss program;
* :meth:`PreparedLoss.of` reads the module's state through its kept split
  (:mod:`jaxaot._src.nn.split_cache`) into the loss program's inputs (its static
  part, the parameters' flat leaves, the frozen state, the other arguments),
  or says the call must go through ``nnx.value_and_grad`` itself: traced
  inputs (under ``jit``, ``vmap``), or other arguments holding Flax objects;
* :meth:`PreparedLoss.finish` writes the state the call changed back into the
  module's own Variables, shapes the gradients as ``nnx.value_and_grad`` does
  (an ``nnx.State`` of the parameters) and remembers the parameters behind them
  for :class:`~jaxaot._src.nn.optimizer.Optimizer` (:mod:`jaxaot._src.nn.traversal`).

Costs per step, once the split is kept: the split's identity check (one pass
over the graph's attribute dicts), reading the Variables, the signature look-up
(the ``CallStatic`` and its hash are the split's, built once), the executable
call, the write-back of the changed Variables and the gradients' ``nnx.State``.
``loss_fn`` is traced once per signature, as the module's call is: Python side
effects in it happen at trace time.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> loss = PreparedLoss.of(model, lambda m, x: jnp.sum(m(x) ** 2), 0, (model, jnp.ones((4, 3))), {}, False)
    >>> [type(x).__name__ for x in loss.inputs[:3]], loss.inputs[3].shape   # then the other arguments
    (['CallStatic', 'list', 'FrozenState'], (4, 3))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from flax import nnx

from jaxaot._src import compat as C
from jaxaot._src.nn.call import _FLAX_OBJECTS, CallStatic, check_static
from jaxaot._src.nn.split_cache import ModuleSplit, split_of, write_back
from jaxaot._src.nn.state import FrozenState
from jaxaot._src.nn.traversal import remember


@dataclasses.dataclass(frozen=True)
class LossCall:
    """``fun`` as a method of the module: ``LossCall(...)(module, *rest)`` calls ``fun`` with
    ``wrapper._wrap(module, programs)`` (the rebuilt module, wrapped as the user's was) inserted at
    ``position``. Hashable (it keys the compile cache)."""

    fun: Callable[..., Any]
    position: int
    has_aux: bool
    wrapper: Any = None
    programs: Any = None

    def __call__(self, module: nnx.Module, *args: Any, **kwargs: Any) -> Any:
        if self.wrapper is not None:
            module = self.wrapper._wrap(module, self.programs)
        return self.fun(*args[: self.position], module, *args[self.position:], **kwargs)

    @property
    def __name__(self) -> str:  # CallStatic's repr names the method
        return getattr(self.fun, "__name__", "loss_fn")


def _needs_nnx(args: tuple, kwargs: dict) -> bool:
    """Whether the call must go through ``nnx.value_and_grad``: traced inputs, or Flax objects besides the module."""
    if not kwargs and all(type(a) is _ARRAY for a in args):  # the common case: arrays only
        return False
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, _FLAX_OBJECTS))
    return any(C.is_tracer(x) or isinstance(x, _FLAX_OBJECTS) for x in leaves)


_ARRAY = C.ArrayImpl
_MAX_LOSS_STATICS = 64  # a new loss function per step (a lambda made in the loop) compiles anew anyway


class PreparedLoss:
    """``fun(*args, **kwargs)`` with ``args[position]`` an ``AOTModule``, as inputs of its loss program.

    Attributes:
      inputs: the loss program's positional arguments ``(static, parameter leaves, frozen state,
        *other args)`` (the keyword arguments are the call's own).
    """

    def __init__(self, model: nnx.Module, split: ModuleSplit, inputs: tuple, leaves: list, rest: tuple,
                 kwargs: dict):
        self.model = model
        self.split = split
        self.inputs = inputs
        self._leaves = leaves
        self._rest = rest
        self._kwargs = kwargs

    @classmethod
    def of(cls, model: nnx.Module, fun: Callable[..., Any], position: int, args: tuple, kwargs: dict,
           has_aux: bool) -> "PreparedLoss | None":
        """The prepared call, or None where it must be ``nnx.value_and_grad`` itself."""
        rest = args[:position] + args[position + 1:]
        split = split_of(model, model.wrapped)
        if split.traced or _needs_nnx(rest, kwargs):
            return None
        if len(split._statics) > _MAX_LOSS_STATICS:
            split._statics.clear()

        def build() -> CallStatic:
            method = LossCall(fun, position, has_aux, type(model), model.programs)
            check_static("loss function", method)
            return CallStatic(split.graphdef, method, (), (), param_tree=split.param_tree)

        static = split.static(("loss", fun, position, has_aux), build)
        params, state = split.leaves()
        inputs = (static, params, FrozenState.of_leaves(split.rest_tree, state, False), *rest)
        return cls(model, split, inputs, params + state, rest, kwargs)

    def finish(self, delta: Any, grads: list) -> nnx.State:
        """Write the changed state (the loss program's ``StateDelta``, or None) back into the module,
        and return the gradients (the parameters' flat leaves) as an ``nnx.State``, remembering their
        parameters for the optimizer's update."""
        same = delta is None or not delta.sources or write_back(
            self.model.wrapped, self.split, delta,
            lambda: self._leaves + jax.tree_util.tree_leaves((self._rest, self._kwargs)))
        state = jax.tree_util.tree_unflatten(self.split.param_tree, grads)
        if same and self.split.plain:
            remember(state, self.model, self.split)
        return state


__all__ = ["LossCall", "PreparedLoss"]
