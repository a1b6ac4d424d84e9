"""Offloading residuals to host memory: the third choice beside saving and recomputing.

Costed with :mod:`jaxaot._src.partition.costs` (a :class:`~jaxaot._src.partition.costs.DeviceModel`
and an :class:`~jaxaot._src.partition.costs.OpCosts`); the min-cut
(:mod:`jaxaot._src.partition.mincut`) calls both planners.

Modules:

* ``host_offload``: between the forward and backward programs: the :class:`Timeline`,
  :func:`plan_offload` and the program rewrite :func:`apply_offload`;
* ``scan_offload``: inside ``lax.scan`` bodies, per iteration (:func:`plan_body_offload`).
"""

from jaxaot._src.partition.offload.host_offload import (
    DEFAULT_MIN_BYTES, OffloadPlan, Timeline, apply_offload, check_offload, offload_partition, offloadable_dtype,
    plan_offload, resolve_model, saved_vars)
from jaxaot._src.partition.offload.scan_offload import plan_body_offload

__all__ = [
    "DEFAULT_MIN_BYTES",
    "OffloadPlan",
    "Timeline",
    "apply_offload",
    "check_offload",
    "offload_partition",
    "offloadable_dtype",
    "plan_body_offload",
    "plan_offload",
    "resolve_model",
    "saved_vars",
]
