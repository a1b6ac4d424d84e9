"""The partition itself: what a partitioner returns, and the one mechanism that builds it.

Modules:

* ``split``: :class:`Partition`, :class:`Residual`, the :class:`Partitioner` protocol and
  :func:`split_joint`, which turns a chosen saved set into forward and backward programs;
* ``default``: :func:`default_partition` (what ``jax.vjp`` saves) and :func:`differentiate`
  (the same split, with TorchScript's bookkeeping).
"""

from jaxaot._src.partition.core.split import (
    EqnDescriptions, EqnKind, Partition, Partitioner, Residual, check_joint, classify_eqns,
    forward_values_used_by_backward, split_joint)
from jaxaot._src.partition.core.default import Gradient, default_partition, differentiate

__all__ = [
    "EqnDescriptions",
    "EqnKind",
    "Gradient",
    "Partition",
    "Partitioner",
    "Residual",
    "check_joint",
    "classify_eqns",
    "default_partition",
    "differentiate",
    "forward_values_used_by_backward",
    "split_joint",
]
