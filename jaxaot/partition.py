"""Stages 1 and 2: the joint forward+backward graph and the partitioners that split it."""

import typing as _typing

from jaxaot._src import deprecations as _deprecations
from jaxaot._src.tracing import (
    JointGraph as JointGraph,
    trace_joint as trace_joint,
)
from jaxaot._src.partition import (
    Partition as Partition,
    Partitioner as Partitioner,
    Residual as Residual,
    default_partition as default_partition,
    min_cut_rematerialization_partition as min_cut_rematerialization_partition,
    MinCutOptions as MinCutOptions,
    remat_policy as remat_policy,
    RematPolicy as RematPolicy,
    Gradient as Gradient,
    differentiate as differentiate,
    MemoryBudget as MemoryBudget,
    parse_memory_budget as parse_memory_budget,
    StepPeak as StepPeak,
    DeviceModel as DeviceModel,
    OpCosts as OpCosts,
    FlopCosts as FlopCosts,
    MeasuredCosts as MeasuredCosts,
    split_backward as split_backward,
    split_joint as split_joint,
)

__all__ = [
    "JointGraph", "trace_joint", "Partition", "Partitioner", "Residual", "default_partition",
    "min_cut_rematerialization_partition", "MinCutOptions", "remat_policy", "RematPolicy", "Gradient", "differentiate",
    "MemoryBudget", "parse_memory_budget", "StepPeak", "DeviceModel", "OpCosts", "FlopCosts",
    "MeasuredCosts", "split_backward", "split_joint",
]

# The old layout's paths, for one release: ``import jaxaot.partition.<module>`` and names its package exported.
__path__: list[str] = []
if not _typing.TYPE_CHECKING:
    __getattr__ = _deprecations.face_getattr("jaxaot.partition", "jaxaot._src.partition")
