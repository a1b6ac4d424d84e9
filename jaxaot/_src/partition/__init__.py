"""Stage 2, partition: decide what the forward saves for the backward, and split the joint graph.

A :class:`Partitioner` chooses the saved values; :func:`split_joint` is the one
mechanism that turns a choice into a :class:`Partition` (forward and backward
programs and the :class:`Residual` table). Sub-packages, lowest first: ``core``
(the split, and what ``jax.vjp`` saves), ``costs`` (what eqns and copies cost),
``offload`` (residuals moved to host memory), ``step`` (the training step as one
program), ``budget`` (byte budgets on its compiled peak), ``mincut`` (the min-cut
partitioner) and ``bw`` (the backward's B/W split for pipelines);
``docs/concepts/memory_planner.md`` explains them.
"""

from jaxaot._src.partition.core import (
    EqnKind, Gradient, Partition, Partitioner, Residual, classify_eqns, default_partition, differentiate, split_joint)
from jaxaot._src.partition.costs import (
    HOST_MEMORY_KIND, DeviceModel, FlopCosts, MeasuredCosts, OpCosts, Recompute, classify, flops,
    kernels_beside_copies, materializes_operands, resolve_costs)
from jaxaot._src.partition.offload import DEFAULT_MIN_BYTES, Timeline, apply_offload, saved_vars
from jaxaot._src.partition.step import (
    barred_residuals, layout_choice_platforms, ordered_eqns, rederive_backward, step_program)
from jaxaot._src.partition.budget import (
    MemoryBudget, StepPeak, budget_of, compiled_peak, measure_step_peak, measured_executables, measured_layouts,
    parse_memory_budget, peak_holders, peak_search, program_platform)
from jaxaot._src.partition.mincut import (
    FlowGraph, RematPolicy, MinCutOptions, as_partitioner, build_flow_graph, choose_saved_values,
    min_cut_rematerialization_partition, remat_policy, replay_joint)
from jaxaot._src.partition.bw import BWSplit, split_backward

__all__ = [
    "BWSplit",
    "DEFAULT_MIN_BYTES",
    "DeviceModel",
    "EqnKind",
    "FlopCosts",
    "FlowGraph",
    "Gradient",
    "HOST_MEMORY_KIND",
    "MeasuredCosts",
    "MemoryBudget",
    "OpCosts",
    "Partition",
    "Partitioner",
    "Recompute",
    "RematPolicy",
    "Residual",
    "StepPeak",
    "Timeline",
    "apply_offload",
    "barred_residuals",
    "budget_of",
    "build_flow_graph",
    "MinCutOptions", "as_partitioner",
    "choose_saved_values",
    "classify",
    "classify_eqns",
    "compiled_peak",
    "default_partition",
    "differentiate",
    "flops",
    "kernels_beside_copies",
    "layout_choice_platforms",
    "materializes_operands",
    "measure_step_peak",
    "measured_executables",
    "measured_layouts",
    "min_cut_rematerialization_partition",
    "ordered_eqns",
    "parse_memory_budget",
    "peak_holders",
    "peak_search",
    "program_platform",
    "rederive_backward",
    "remat_policy",
    "replay_joint",
    "resolve_costs",
    "saved_vars",
    "split_backward",
    "split_joint",
    "step_program",
]
