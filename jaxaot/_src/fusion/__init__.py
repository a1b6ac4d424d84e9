"""The fused training step: forward and backward compiled as one program that keeps the partition's plan.

``jaxaot.value_and_grad`` of a scalar loss needs no boundary between forward and
backward, so the runtime can run one executable (:func:`run_fused`) instead of
two. This package plans it at compile time: the partition's step program
(:func:`fused_program`, built by ``jaxaot._src.partition.step``, which a byte budget's
search measures too), the variant kept by compiled peak (:func:`fused_exe`), and
whether the fused or the split step runs (:func:`fused_choice`), on an accelerator
weighed over the calls that follow the first (:class:`Tuning`). It reads the
runtime's programs only through the protocols of ``interface``; the reasons
behind each rule are in ``docs/concepts/fused_step.md``.
"""

from jaxaot._src.fusion.interface import ProgramsLike, TrainingLike
from jaxaot._src.fusion.prefetch import Prefetch
from jaxaot._src.fusion.variants import (
    choose_barrier, choose_layouts, choose_order, choose_rederive, compiled_peak, default_barrier, fused_exe,
    fused_name, fused_program,
)
from jaxaot._src.fusion.step_choice import (
    FusedChoice, budget_choice, choose_step, fused_choice, fused_outputs, is_decided, run_split, timing_settled,
)
from jaxaot._src.fusion.tuning import Tuning, run_fused

__all__ = [
    "FusedChoice", "Prefetch", "ProgramsLike", "TrainingLike", "Tuning", "budget_choice", "choose_barrier",
    "choose_layouts", "choose_order", "choose_rederive", "choose_step", "compiled_peak", "default_barrier",
    "fused_choice", "fused_exe", "fused_name", "fused_outputs", "fused_program", "is_decided", "run_fused",
    "run_split", "timing_settled",
]
