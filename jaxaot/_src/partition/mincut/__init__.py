"""The min-cut rematerialization partitioner: which forward values to save, which to recompute.

Modules, lowest first:

* ``flow_graph``: the flow network (:class:`FlowGraph`), its one builder and its minimum cut
  closest to the sink; the B/W split (:mod:`jaxaot._src.partition.bw`) cuts the same network;
* ``knapsack``: below ``memory_budget=1``, which expensive values to recompute, in which order;
* ``saved_values``: the joint graph's forward as a flow graph, and its cut under a memory budget;
* ``scan_remat``: the per-iteration plan of each ``lax.scan``'s body, by the same cut;
* ``save_families``: plans shaped like JAX's ``dots_saveable`` (only matmul outputs saveable), for byte budgets;
* ``rematerialize``: :func:`min_cut_rematerialization_partition`, the above and offload put together;
* ``policy``: :func:`remat_policy`, the plan as a ``jax.checkpoint`` policy.
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
