"""The fused training step: forward and backward compiled as one program that keeps the partition's plan.

``jaxaot.value_and_grad`` of a scalar loss needs no boundary between forward and
backward, so the runtime can run one executable (:func:`run_fused`) instead of
two. This package plans it at compile time: the one program and its options
(:func:`fused_program`), the variant kept by compiled peak (:func:`fused_exe`), and
whether the fused or the split step runs (:func:`fused_choice`). It reads the
runtime's programs only through the protocols of ``interface``; the reasons
behind each rule are in ``docs/concepts/fused_step.md``.
"""

from jaxaot._src.fusion.interface import ProgramsLike, TrainingLike
from jaxaot._src.fusion.ordering import eval_backward, ordered_eqns
from jaxaot._src.fusion.rederive import RederivedBackward, rederive_backward
from jaxaot._src.fusion.residual_slices import SlicedBackward, residual_readers, slice_residual_reads
from jaxaot._src.fusion.fused_jaxpr import (
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
