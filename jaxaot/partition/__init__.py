"""Stage 2, partition: decide what the forward saves for the backward, and split the joint graph.

A :class:`Partitioner` chooses the saved values; :func:`split_joint` is the one
mechanism that turns a choice into a :class:`Partition` (the forward and
backward programs and the :class:`Residual` table).

Modules, each one concept:

* ``split``: :class:`Partition`, :class:`Residual`, the :class:`Partitioner`
  protocol and :func:`split_joint`;
* ``default``: :func:`default_partition` (what ``jax.vjp`` saves) and
  :func:`differentiate` (the same split, TorchScript's bookkeeping);
* ``min_cut``: the cut, using ``cost_model`` (what an eqn costs to recompute)
  and ``knapsack`` (which expensive values to trade under a memory budget),
  counting per-device bytes on a mesh (``device_bytes``);
* ``scan_remat``: the per-iteration plan of each ``lax.scan``'s body;
* ``device_model``: :class:`DeviceModel`, what copies and eqns cost on a device
  (measured once), how much of a copy compute hides;
* ``offload``: the offload pass, a third choice beside saving and recomputing:
  large residuals whose copies to host memory and back hide behind compute;
  ``scan_offload``: the same per scan iteration;
* ``rematerialize``: :func:`min_cut_rematerialization_partition`, the above put together;
* ``policy``: :func:`remat_policy`, the min-cut's plan as a ``jax.checkpoint`` policy;
* ``bw_split``: the backward split into input-gradient and weight-gradient
  programs, for pipeline schedules.
"""

from jaxaot.partition.split import EqnKind, Partition, Partitioner, Residual, split_joint
from jaxaot.partition.default import Gradient, default_partition, differentiate
from jaxaot.partition.rematerialize import min_cut_rematerialization_partition
from jaxaot.partition.policy import RematPolicy, remat_policy
from jaxaot.partition.bw_split import BWSplit, split_backward
from jaxaot.partition.offload import HOST_MEMORY_KIND, DeviceModel, apply_offload, saved_vars
from jaxaot.partition.scan_remat import replay_joint
from jaxaot.partition.cost_model import Recompute, classify, materializes_operands

__all__ = [
    "BWSplit",
    "HOST_MEMORY_KIND",
    "Recompute",
    "apply_offload",
    "classify",
    "materializes_operands",
    "replay_joint",
    "saved_vars",
    "DeviceModel",
    "EqnKind",
    "Gradient",
    "Partition",
    "Partitioner",
    "RematPolicy",
    "Residual",
    "default_partition",
    "differentiate",
    "min_cut_rematerialization_partition",
    "remat_policy",
    "split_backward",
    "split_joint",
]
