"""The fused training step: forward and backward compiled as one program that keeps the partition's plan.

``jaxaot.value_and_grad`` of an :class:`~jaxaot.AOTFunction` with a scalar loss
needs no boundary between the forward and the backward, so the runtime runs one
executable (:func:`run_fused`) instead of two. This package plans that
executable at compile time; it sits above ``compile`` and below ``runtime``,
and reads the runtime's programs only through the protocols of ``interface``
(:class:`TrainingLike`, :class:`ProgramsLike`).

The algorithm, module by module (each imports only those before it):

* ``ordering``: :func:`eval_backward` evaluates the backward with each
  recomputed matmul operand consumed before its residuals are read again, so
  XLA cannot merge that recomputation into a later kernel (one barrier per
  such matmul, one more read of its residuals);
* ``rederive``: :func:`rederive_backward` drops residuals the backward can
  derive again through an order-free reduction (a softmax's row max), bit for
  bit (one pass over the backward);
* ``residual_slices``: :func:`slice_residual_reads` passes a residual the
  backward only slices as its slices, each freed after its last reader (one
  more copy of the slices in the forward);
* ``program``: :func:`fused_program`, the one jaxpr ``inputs -> (outputs,
  grads)``: the partition's forward, the residuals through an
  ``optimization_barrier`` (so XLA keeps no more than the plan saves), the
  backward with unit cotangents; its options (layouts, order, barrier, slices,
  rederive) are the variants;
* ``variants``: :func:`fused_exe` compiles the step and, on an accelerator,
  each variant in turn, keeping one by compiled peak memory
  (:func:`choose_layouts`, :func:`choose_order`, :func:`choose_barrier`,
  :func:`choose_rederive`, all on :func:`compiled_peak`);
* ``step_choice``: :func:`fused_choice` decides once whether the fused step or
  the split executables run (:func:`budget_choice`, :func:`choose_step`), keeps
  only the winner's executables, and records a :class:`FusedChoice`.

Cost: one compilation per signature, up to five on an accelerator plus the two
split programs timed against it; run time is one executable call. Measurements
behind each rule are in ``docs/concepts/fused_step.md``.
"""

from jaxaot._src.fusion.interface import ProgramsLike, TrainingLike
from jaxaot._src.fusion.ordering import eval_backward, ordered_eqns
from jaxaot._src.fusion.rederive import RederivedBackward, rederive_backward
from jaxaot._src.fusion.residual_slices import SlicedBackward, residual_readers, slice_residual_reads
from jaxaot._src.fusion.program import (
    barred_residuals, fused_program, library_kernel_residuals, pinned_layouts, read_orders, recomputation_inputs,
)
from jaxaot._src.fusion.variants import (
    choose_barrier, choose_layouts, choose_order, choose_rederive, compiled_peak, default_barrier, fused_exe,
    fused_name,
)
from jaxaot._src.fusion.step_choice import (
    FusedChoice, budget_choice, choose_step, fused_choice, is_decided, run_fused, run_split,
)

__all__ = [
    "FusedChoice", "ProgramsLike", "RederivedBackward", "SlicedBackward", "TrainingLike", "barred_residuals", "budget_choice",
    "choose_barrier", "choose_layouts", "choose_order", "choose_rederive", "choose_step", "compiled_peak",
    "default_barrier", "eval_backward", "fused_choice", "fused_exe", "fused_name", "is_decided", "fused_program", "library_kernel_residuals", "ordered_eqns",
    "pinned_layouts", "read_orders", "recomputation_inputs", "rederive_backward", "residual_readers", "run_fused",
    "run_split", "slice_residual_reads",
]
