"""One pipeline stage on its device: its ``aot_function`` and, per input signature, its four executables.

:class:`StagePrograms` runs the passes a schedule asks for: ``F`` (the compiled
forward, with residuals), ``BW`` (the partition's backward), and ``B`` and ``W``
(the halves of :func:`jaxaot._src.partition.split_backward`). The backwards compile
through the runtime, so they share the persistent compile cache, once each on first
use. Leaves are flat: parameters, then activations, then targets.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.partition import BWSplit, Partitioner, split_backward
from jaxaot._src.runtime import AOTFunction, SignaturePrograms, TrainingPrograms, aot_function

#: ``Device`` or ``jax.sharding.Mesh``: where a stage runs (a mesh stage is replicated over its devices).
Placement = Any


def sharding_of(placement: Placement) -> jax.sharding.Sharding:
    """The sharding a stage's arrays take: a single device, or replicated over a (sub-)mesh."""
    if isinstance(placement, jax.sharding.Mesh):
        return jax.sharding.NamedSharding(placement, jax.sharding.PartitionSpec())
    if isinstance(placement, jax.sharding.Sharding):
        return placement
    return jax.sharding.SingleDeviceSharding(placement)


def _avals(args: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.aval.weak_type) for x in args]


class StagePrograms:
    """The passes of one stage for one input signature (see the module docstring).

    Attributes:
      training: the runtime's :class:`~jaxaot._src.runtime.TrainingPrograms`.
      num_params / num_activations: how many leaves the parameters and the activations have.
      param_grads: per parameter leaf, its position among the backward's gradients (None: not differentiated).
      activation_grads: likewise per activation leaf.
      cotangent_outputs: the output leaves that take a cotangent, in the backward's order.
    """

    def __init__(self, aot: AOTFunction, training: TrainingPrograms, num_params: int, num_activations: int):
        self.aot = aot
        self.training = training
        self.programs: SignaturePrograms = training.programs
        self.num_params = num_params
        self.num_activations = num_activations
        part = training.partition
        position = {leaf: k for k, leaf in enumerate(part.grad_inputs)}
        self.param_grads = [position.get(i) for i in range(num_params)]
        self.activation_grads = [position.get(num_params + j) for j in range(num_activations)]
        self.cotangent_outputs = tuple(part.cotangent_outputs)
        self._split: BWSplit | None = None
        self._lock = threading.Lock()

    # -- what the passes hold
    @property
    def split(self) -> BWSplit:
        """The B/W split of this stage's backward (built once)."""
        if self._split is None:
            with self._lock:
                if self._split is None:
                    acts = [self.num_params + j for j, k in enumerate(self.activation_grads) if k is not None]
                    self._split = split_backward(self.training.partition, acts)
        return self._split

    @property
    def residual_bytes(self) -> int:
        """Bytes one microbatch's residuals hold, less the parameters (alive anyway)."""
        return sum(r.nbytes for r in self.training.partition.residuals
                   if not (r.source == "input" and r.index < self.num_params))

    def output_specs(self) -> list[jax.ShapeDtypeStruct]:
        """The outputs' shapes and dtypes (flat)."""
        return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.training.out_avals]

    # -- the passes
    def forward(self, leaves: Sequence[Any]) -> tuple[list, list]:
        """F: ``(outputs, residuals)`` of one microbatch."""
        return self.training.forward(leaves, concrete=True)

    def backward(self, residuals: Sequence[Any], cts: Sequence[Any]) -> tuple[list, list]:
        """BW: ``(gradients in backward order, activation gradients per activation leaf)``."""
        args = [*cts, *residuals]
        exe = self._exe("pipeline_backward", self.training.partition.backward, args)
        grads = list(exe(*args))
        return grads, self._activation_grads(grads)

    def backward_input(self, residuals: Sequence[Any], cts: Sequence[Any]) -> tuple[list, list]:
        """B: ``(activation gradients per activation leaf, W's arguments)``; the residuals may be dropped after."""
        split = self.split
        args = [*cts, *residuals]
        if not C.jaxpr_of(split.backward_input).outvars:  # the first stage: no input gradient, W does it all
            return [None] * self.num_activations, split.weight_arguments(args, [])
        outs = list(self._exe("backward_input", split.backward_input, args)(*args))
        by_input = dict(zip(split.activation_inputs, outs))
        acts = [by_input.get(self.num_params + j) for j in range(self.num_activations)]
        return acts, split.weight_arguments(args, outs)

    def backward_weight(self, weight_args: Sequence[Any]) -> list:
        """W: the gradients in backward order, the activations' as None (B returned those)."""
        split = self.split
        outs = list(self._exe("backward_weight", split.backward_weight, weight_args)(*weight_args))
        return split.merge(self.training.partition.grad_inputs, [None] * len(split.activation_inputs), outs)

    def param_grads_of(self, grads: Sequence[Any]) -> list:
        """The parameters' gradients (None for parameters not differentiated)."""
        return [None if k is None else grads[k] for k in self.param_grads]

    def _activation_grads(self, grads: Sequence[Any]) -> list:
        return [None if k is None else grads[k] for k in self.activation_grads]

    def _exe(self, name: str, closed: Any, args: Sequence[Any]) -> Callable[..., Any]:
        full = name + self.training.name_suffix
        exe = self.programs.executables.get(full)
        if exe is None:
            exe = self.programs.compile(full, self.aot.bw_compiler, closed, _avals(args))
        return exe


class Stage:
    """A stage function, compiled with ``aot_function``, placed on its device.

    Attributes:
      index: the stage's position in the pipeline.
      placement / sharding: where its parameters, activations and gradients live.
      call: the stage function as it traces (:func:`placed`); aot: its :class:`~jaxaot.AOTFunction` (of
        ``loss_fn(stage_fn(p, a), t)`` on the last stage).
      is_last: whether it computes the loss (and takes targets).
    """

    def __init__(self, index: int, fn: Callable, placement: Placement, partition_fn: Partitioner,
                 loss_fn: Callable | None = None):
        self.index = index
        self.fn = fn
        self.placement = placement
        self.sharding = sharding_of(placement)
        self.is_last = loss_fn is not None
        self.loss_fn = loss_fn
        self.call = placed(fn, placement)
        self.aot = aot_function(_named(self.call, loss_fn, index), partition_fn=partition_fn)

    def place(self, tree: Any) -> Any:
        """``tree`` on this stage's device or sub-mesh (asynchronous; a no-op for arrays already there).

        An array already sharded over exactly this stage's devices keeps its
        sharding: parameters sharded over a sub-mesh (pipeline x data or tensor
        parallel) stay sharded, and the stage's programs compile for them.
        """
        devices = self.sharding.device_set

        def put(x: Any) -> Any:
            if isinstance(x, jax.Array) and x.committed and x.sharding.device_set == devices:
                return x
            return jax.device_put(x, self.sharding)

        return jax.tree_util.tree_map(put, tree)

    def spec(self, tree: Any) -> Any:
        """``tree``'s shapes as ``jax.ShapeDtypeStruct`` on this stage's device (sharded leaves keep theirs)."""
        devices = self.sharding.device_set

        def one(x: Any) -> jax.ShapeDtypeStruct:
            own = getattr(x, "sharding", None)
            sharding = own if own is not None and own.device_set == devices else self.sharding
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding,
                                        weak_type=bool(getattr(x, "weak_type", False)))

        return jax.tree_util.tree_map(one, tree)

    def programs(self, params: Any, activations: Any, targets: Any = None) -> StagePrograms:
        """The :class:`StagePrograms` for these (abstract or concrete) arguments, traced on first use."""
        args = (params, activations) if targets is None else (params, activations, targets)
        lookup = self.aot.lookup(args, {})
        num_params = len(jax.tree_util.tree_leaves(params))
        num_acts = len(jax.tree_util.tree_leaves(activations))
        mask = [True] * num_params + [self.index > 0] * num_acts
        mask += [False] * (len(lookup.leaves) - len(mask))
        return StagePrograms(self.aot, lookup.programs.training(mask), num_params, num_acts)


def placed(fn: Callable, placement: Placement) -> Callable:
    """``fn``, traced under the sub-mesh ``placement`` where it is one: a ``with_sharding_constraint`` by a
    PartitionSpec inside names the stage's own devices, as under ``jax.set_mesh`` around a plain call."""
    if not isinstance(placement, jax.sharding.Mesh):
        return fn
    where = placement.abstract_mesh

    def call(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(where):
            return fn(*args)
    return call


def _named(fn: Callable, loss_fn: Callable | None, index: int) -> Callable:
    """The stage's body (composed with the loss on the last stage), named ``stage<index>`` for messages."""
    if loss_fn is None:
        def body(params: Any, activations: Any) -> Any:
            return fn(params, activations)
    else:
        def body(params: Any, activations: Any, targets: Any) -> Any:
            return loss_fn(fn(params, activations), targets)
    body.__name__ = body.__qualname__ = f"stage{index}"
    return body


def float0_like(x: Any) -> np.ndarray:
    """``jax.vjp``'s gradient of a non-differentiable leaf: float0 zeros of its shape."""
    return C.zeros_float0(np.shape(x))
