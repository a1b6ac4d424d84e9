"""One stage's passes as traceable functions of leaves, from its jaxaot partition.

The compiled pipeline inlines each stage's programs, so it needs them as functions
to trace, not executables. :class:`StagePasses` wraps a stage's
:class:`~jaxaot._src.partition.Partition` and its B/W split as ``forward``,
``backward`` (BW), ``backward_input`` (B) and ``backward_weight`` (W). Residuals
that are parameters are never stored per microbatch; gradients a stage does not
produce are None.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError


class StagePasses:
    """The passes of one stage (see the module docstring).

    Attributes:
      stored_residuals: avals of the residuals stored per microbatch.
      stored_weight_args: avals of W's stored arguments (the split's handoff and kept values).
      output_avals: the stage's outputs (the loss, on the last stage).
      cotangent_outputs: indices of the outputs that take a cotangent.
    """

    def __init__(self, index: int, training: Any, num_params: int, num_activations: int, param_avals: Sequence[Any],
                 activation_avals: Sequence[Any], split: Any | None):
        part = training.partition
        if training.num_aux:
            raise InvalidInputError(
                f"stage {index} runs a jaxaot.loops.while_loop without max_steps, whose stack grows at run time; the "
                "compiled pipeline needs fixed shapes: give the loop max_steps, or pass executor='python'.")
        if any(r.offloaded or r.in_joint_host for r in part.residuals):
            raise InvalidInputError(
                f"stage {index}'s partition offloads residuals to host memory, which the compiled pipeline does "
                "not place: use a partitioner without offload for pipeline stages, or pass executor='python'.")
        self.index = index
        self.part = part
        self.split = split
        self.num_params = num_params
        self.num_activations = num_activations
        self.param_avals = list(param_avals)
        self.activation_avals = list(activation_avals)
        self.num_outputs = len(training.out_avals)
        self.output_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in training.out_avals]
        self.cotangent_outputs = tuple(part.cotangent_outputs)
        grad_position = {leaf: k for k, leaf in enumerate(part.grad_inputs)}
        self._param_grad = [grad_position.get(i) for i in range(num_params)]
        self._act_grad = [grad_position.get(num_params + j) for j in range(num_activations)]
        # residuals: (param index) or None, in the backward's order
        self._res_param = [r.index if r.source == "input" and r.index < num_params else None for r in part.residuals]
        self.stored_residuals = [jax.ShapeDtypeStruct(r.aval.shape, r.aval.dtype)
                                 for r, p in zip(part.residuals, self._res_param) if p is None]
        self.stored_weight_args: list = []
        if split is not None:
            n_ct = len(self.cotangent_outputs)
            self._w_param = [None] * len(split.handoff) + [
                self._res_param[i - n_ct] if i >= n_ct else None for i in split.kept]
            bw_avals = [self.output_avals[i] for i in self.cotangent_outputs] + [
                jax.ShapeDtypeStruct(r.aval.shape, r.aval.dtype) for r in part.residuals]
            w_avals = [jax.ShapeDtypeStruct(h.shape, h.dtype) for h in split.handoff] + [bw_avals[i] for i in split.kept]
            self.stored_weight_args = [a for a, p in zip(w_avals, self._w_param) if p is None]

    # -- helpers
    @staticmethod
    def _fill(stored: Sequence[Any], from_params: Sequence[int | None], params: Sequence[Any]) -> list:
        it = iter(stored)
        return [next(it) if p is None else params[p] for p in from_params]

    def _param_grads(self, grads_by_position: Sequence[Any]) -> list:
        return [None if k is None else grads_by_position[k].astype(a.dtype)
                for k, a in zip(self._param_grad, self.param_avals)]

    def _act_grads(self, grads_by_position: Sequence[Any]) -> list:
        return [None if k is None else grads_by_position[k] for k in self._act_grad]

    # -- the passes
    def forward(self, params: Sequence[Any], activations: Sequence[Any], targets: Sequence[Any] = ()) -> tuple:
        """F: ``(outputs, stored residuals)``."""
        leaves = [*params, *activations, *targets]
        outs = C.eval_closed(self.part.forward, *leaves)
        part = self.part
        residuals = [leaves[i] for i in part.saved_inputs] + [outs[i] for i in part.saved_outputs]
        stored = [r for r, p in zip(residuals, self._res_param) if p is None]
        return list(outs[:self.num_outputs]), stored

    def _cotangents(self, cts: Sequence[Any]) -> list:
        return [jnp.asarray(c, self.output_avals[i].dtype) for c, i in zip(cts, self.cotangent_outputs)]

    def backward(self, params: Sequence[Any], stored: Sequence[Any], cts: Sequence[Any]) -> tuple[list, list]:
        """BW: ``(param grads, activation grads)``, per parameter and activation leaf, None where none."""
        residuals = self._fill(stored, self._res_param, params)
        grads = C.eval_closed(self.part.backward, *self._cotangents(cts), *residuals)
        return self._param_grads(grads), self._act_grads(grads)

    def backward_input(self, params: Sequence[Any], stored: Sequence[Any], cts: Sequence[Any]) -> tuple[list, list]:
        """B: ``(activation grads per activation leaf, stored weight arguments)``."""
        split = self.split
        args = [*self._cotangents(cts), *self._fill(stored, self._res_param, params)]
        outs = C.eval_closed(split.backward_input, *args) if C.jaxpr_of(split.backward_input).outvars else []
        by_input = dict(zip(split.activation_inputs, outs))
        acts = [by_input.get(self.num_params + j) for j in range(self.num_activations)]
        wargs = split.weight_arguments(args, outs)
        return acts, [w for w, p in zip(wargs, self._w_param) if p is None]

    def backward_weight(self, params: Sequence[Any], stored: Sequence[Any]) -> list:
        """W: the param grads (None where none)."""
        split = self.split
        wargs = self._fill(stored, self._w_param, params)
        outs = C.eval_closed(split.backward_weight, *wargs)
        by_input = dict(zip(split.weight_inputs, outs))
        return [by_input[i].astype(a.dtype) if i in by_input else None for i, a in enumerate(self.param_avals)]
