"""Offloading residuals to host memory: the third choice beside saving and recomputing.

Between the forward and backward programs (:func:`plan_offload`,
:func:`apply_offload`) and per iteration inside ``lax.scan`` bodies
(:func:`plan_body_offload`), costed with :mod:`jaxaot._src.partition.costs`; the min-cut
calls both planners.
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
