"""Stage 2, partition: decide what the forward saves for the backward, and split the joint graph.

A :class:`Partitioner` chooses the saved values; :func:`split_joint` is the one
mechanism that turns a choice into a :class:`Partition` (the forward and
backward programs and the :class:`Residual` table). Each sub-package holds one
concept, lowest first (imports run only downward, through each one's face):

* ``core``: the split itself: :class:`Partition`, :class:`Residual`, the
  :class:`Partitioner` protocol, :func:`split_joint`, and
  :func:`default_partition` / :func:`differentiate` (what ``jax.vjp`` saves);
* ``costs``: what an eqn costs to recompute (:class:`Recompute`,
  :func:`classify`), modelled (:class:`FlopCosts`) or measured once per device
  kind (:class:`MeasuredCosts`); what copies to host memory cost
  (:class:`DeviceModel`, measured once); per-device bytes on a mesh;
* ``offload``: the third choice beside saving and recomputing: large residuals
  whose copies to host memory and back hide behind compute, between the
  programs (:func:`apply_offload`) and per scan iteration;
* ``budget``: byte budgets: a plan's compiled step peak (:class:`StepPeak`,
  :func:`compiled_peak`), what holds it, and the fastest plan whose peak fits
  (:func:`plan_under_peak`);
* ``mincut``: the flow network and its cut (:class:`FlowGraph`), the memory
  budget's knapsack, the per-iteration plan of each ``lax.scan`` body,
  :func:`min_cut_rematerialization_partition` putting them together, and
  :func:`remat_policy`, the plan as a ``jax.checkpoint`` policy;
* ``bw``: the backward split into input-gradient and weight-gradient programs
  for pipeline schedules (:func:`split_backward`), a cut of the same network.

``docs/concepts/memory_planner.md`` explains the min-cut, its budgets (fractions
and bytes) and the offload planner; ``docs/concepts/pipeline.md`` the B/W split.
"""

from jaxaot._src.partition.core import (
    EqnKind, Gradient, Partition, Partitioner, Residual, classify_eqns, default_partition, differentiate, split_joint)
from jaxaot._src.partition.costs import (
    HOST_MEMORY_KIND, DeviceModel, FlopCosts, MeasuredCosts, OpCosts, Recompute, classify, flops,
    kernels_beside_copies, materializes_operands, resolve_costs)
from jaxaot._src.partition.offload import DEFAULT_MIN_BYTES, Timeline, apply_offload, saved_vars
from jaxaot._src.partition.budget import (
    MemoryBudget, StepPeak, compiled_peak, format_bytes, measure_step_peak, parse_memory_budget, peak_holders,
    plan_under_peak)
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
    "build_flow_graph",
    "MinCutOptions", "as_partitioner",
    "choose_saved_values",
    "classify",
    "classify_eqns",
    "compiled_peak",
    "default_partition",
    "differentiate",
    "flops",
    "format_bytes",
    "kernels_beside_copies",
    "materializes_operands",
    "measure_step_peak",
    "min_cut_rematerialization_partition",
    "parse_memory_budget",
    "peak_holders",
    "plan_under_peak",
    "remat_policy",
    "replay_joint",
    "resolve_costs",
    "saved_vars",
    "split_backward",
    "split_joint",
]
