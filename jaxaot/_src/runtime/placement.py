"""Where one training program's values live on a mesh: the pins and shardings of its two executables.

A :class:`Placement` belongs to one :class:`~jaxaot._src.runtime.TrainingPrograms` and
answers, for a sharded signature, what each forward output is pinned to, each
gradient's sharding, what each backward input is compiled for (which compiles the
forward, to read its output shardings), the same known without compiling (for
``lower()``), and which residuals arrive in ``pinned_host`` memory. An unsharded
signature gets Nones throughout.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxaot._src import compat as C
from jaxaot._src.partition import HOST_MEMORY_KIND
from jaxaot._src.runtime import shardings as S


class Placement:
    """The shardings of one training program's forward and backward (see the module docstring)."""

    def __init__(self, training: Any):
        self._training = training  # a TrainingPrograms: it builds one Placement per rebuild
        self._backward: list | None = None

    @property
    def _programs(self) -> Any:
        return self._training.programs

    def forward_pins(self) -> list:
        """Per output of the pruned forward (computed outputs, then the rest), its pin or None."""
        p, part = self._programs, self._training.partition
        n_user = len(p.output_is_input)
        n_rest = len(C.jaxpr_of(part.forward).outvars) - n_user
        pins = [p.out_shardings[i] for i in p.computed_outputs] + [None] * n_rest
        if self._training.options.residual_sharding == "replicated" and p.mesh is not None:
            everywhere = S.replicated(p.mesh)
            on_host = everywhere.with_memory_kind(HOST_MEMORY_KIND)
            for r, i in zip(part.residuals[len(part.saved_inputs):], part.saved_outputs):
                if i >= n_user:
                    pins[len(p.computed_outputs) + i - n_user] = S.Copy(on_host if r.offloaded else everywhere)
        return pins

    def host_residuals(self, avals: list) -> list:
        """The backward's ``avals`` (cotangents, then residuals) of an unsharded signature, offloaded ones on the host.

        (A sharded signature's residuals take the memory kinds the compiled forward gave them.)
        """
        part = self._training.partition
        if not any(r.offloaded for r in part.residuals):
            return avals
        host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=HOST_MEMORY_KIND)
        n_ct = len(part.cotangent_outputs)
        return [S.with_sharding(a, host) if i >= n_ct and part.residuals[i - n_ct].offloaded else a
                for i, a in enumerate(avals)]

    def grad_pins(self) -> list:
        """Per gradient, its input's sharding in a sharded signature (else None: unpinned)."""
        p, part = self._programs, self._training.partition
        if not p.sharded:
            return [None] * len(part.grad_inputs)
        return [p.in_avals[i].sharding for i in part.grad_inputs]

    def backward_inputs(self) -> list:
        """Per backward input (cotangents, then residuals), the sharding it is compiled for (None: free)."""
        if self._backward is None:
            p, tr = self._programs, self._training
            outs = S.output_shardings(tr.forward_exe) if p.sharded else None
            self._backward = self._inputs(outs)
        return self._backward

    def residuals(self) -> list:
        """Per residual (backward order), the sharding the backward takes it in (compiles the forward)."""
        return self.backward_inputs()[len(self._training.partition.cotangent_outputs):]

    def known_residuals(self) -> list | None:
        """Per residual, its sharding where known without compiling; None for an unsharded signature."""
        p, tr = self._programs, self._training
        if not p.sharded:
            return None
        part = tr.partition
        if p.executables.get(tr.forward_name) is not None:
            # A saved input the backward takes as it comes (its aval unplaced) is where the forward took it.
            known, took = self.residuals(), S.input_shardings(tr.forward_exe)
            return [took[part.saved_inputs[k]] if s is None and took and k < len(part.saved_inputs) else s
                    for k, s in enumerate(known)]
        return [p.in_avals[i].sharding for i in part.saved_inputs] + [None] * len(part.saved_outputs)

    def _inputs(self, outs: list | None) -> list:
        p, part = self._programs, self._training.partition
        n_user, n_real = len(p.output_is_input), len(p.computed_outputs)

        def of_output(i: int) -> Any:  # forward output i, as the runtime numbers them
            if i < n_user and p.output_is_input[i] is not None:
                return p.in_avals[p.output_is_input[i]].sharding
            if outs is None:
                return None
            return outs[p.computed_outputs.index(i) if i < n_user else n_real + i - n_user]

        return ([of_output(i) for i in part.cotangent_outputs]
                + [p.in_avals[i].sharding for i in part.saved_inputs]
                + [of_output(i) for i in part.saved_outputs])
