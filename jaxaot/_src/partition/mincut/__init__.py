"""The min-cut rematerialization partitioner: which forward values to save, which to recompute.

The flow network and its cut (:class:`FlowGraph`, shared with the B/W split), the
memory budget's knapsack, the forward's cut under a budget, the per-iteration plan
of each ``lax.scan`` body, plans shaped like ``dots_saveable``, all put together in
:func:`min_cut_rematerialization_partition`, and the plan as a ``jax.checkpoint``
policy (:func:`remat_policy`).
"""

from jaxaot._src.partition.mincut.flow_graph import (
    CHEAP, EXPENSIVE, INF, INPUT, NEVER, Cut, FlowGraph, FlowGraphBuilder, cut_value, min_cut, scaled_capacities)
from jaxaot._src.partition.mincut.saved_values import (
    build_flow_graph, choose_saved_nodes, choose_saved_values, offloaded_saved_nodes)
from jaxaot._src.partition.mincut.scan_remat import BodyChoice, replay_joint, rewrite_primal, rewrite_primal_planned
from jaxaot._src.partition.mincut.save_families import FAMILIES, family_saveable
from jaxaot._src.partition.mincut.rematerialize import MinCutOptions, as_partitioner, min_cut_rematerialization_partition
from jaxaot._src.partition.mincut.policy import RematPolicy, remat_policy

__all__ = [
    "BodyChoice",
    "CHEAP",
    "Cut",
    "EXPENSIVE",
    "FAMILIES",
    "FlowGraph",
    "FlowGraphBuilder",
    "INF",
    "INPUT",
    "NEVER",
    "RematPolicy",
    "build_flow_graph",
    "MinCutOptions", "as_partitioner",
    "choose_saved_nodes",
    "choose_saved_values",
    "cut_value",
    "family_saveable",
    "min_cut",
    "min_cut_rematerialization_partition",
    "offloaded_saved_nodes",
    "remat_policy",
    "replay_joint",
    "rewrite_primal",
    "rewrite_primal_planned",
    "scaled_capacities",
]
