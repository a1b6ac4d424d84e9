"""A partition's training step as one program, and the rewrites of its backward that the variants use.

:func:`step_program` is what ``jaxaot.value_and_grad`` compiles as the fused step
and what a byte budget's search measures (``docs/concepts/fused_step.md``): the
residuals' barrier and layouts, the backward's order (``ordering``), the
residuals derived again (``rederive``) and those passed as slices (``residual_slices``).
"""

from jaxaot._src.partition.step.ordering import eval_backward, ordered_eqns
from jaxaot._src.partition.step.rederive import RederivedBackward, rederive_backward
from jaxaot._src.partition.step.residual_slices import SlicedBackward, residual_readers, slice_residual_reads
from jaxaot._src.partition.step.step_program import (
    BARRIERS, LAYOUTS, ORDERS, barred_residuals, layout_choice_platforms, library_kernel_residuals,
    pinned_layouts, read_orders, recomputation_inputs, step_program,
)

__all__ = [
    "BARRIERS", "LAYOUTS", "ORDERS", "RederivedBackward", "SlicedBackward",
    "barred_residuals", "eval_backward",
    "layout_choice_platforms", "library_kernel_residuals",
    "ordered_eqns", "pinned_layouts", "read_orders", "recomputation_inputs", "rederive_backward",
    "residual_readers", "slice_residual_reads", "step_program",
]
