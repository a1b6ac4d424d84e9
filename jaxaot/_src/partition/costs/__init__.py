"""What values and eqns cost: modelled, and measured on the device.

The cuts and the offload planner ask these; nothing here knows about partitions.
Which eqns may be recomputed (:class:`Recompute`), what one eqn costs to run
(:class:`OpCosts`: FLOP estimates or :class:`MeasuredCosts`, timed once per device
kind), what copies to host memory cost (:class:`DeviceModel`), and per-device
bytes of a sharded program's values (:func:`device_fractions`).
"""

from jaxaot._src.partition.costs.cost_model import Recompute, classify, flops, is_alias, is_loop, materializes_operands
from jaxaot._src.partition.costs.op_costs import FlopCosts, OpCosts
from jaxaot._src.allowance import byte_limit
from jaxaot._src.partition.costs.device_model import (
    HOST_MEMORY_KIND, MEASURED_HEADROOM, MIN_OVERLAP, DeviceModel, best_seconds, host_memory_note)
from jaxaot._src.partition.costs.measured_costs import MeasuredCosts, resolve_costs
from jaxaot._src.partition.costs.copy_slots import copies_in_flight, kernels_beside_copies, measure_copy_slots
from jaxaot._src.partition.costs.device_bytes import device_fractions
from jaxaot._src.partition.costs.autotune_bytes import compile_bytes

__all__ = [
    "DeviceModel",
    "FlopCosts",
    "HOST_MEMORY_KIND",
    "MEASURED_HEADROOM",
    "MIN_OVERLAP",
    "MeasuredCosts",
    "OpCosts",
    "Recompute",
    "best_seconds",
    "byte_limit",
    "classify",
    "compile_bytes",
    "copies_in_flight",
    "device_fractions",
    "flops",
    "host_memory_note",
    "is_alias",
    "is_loop",
    "kernels_beside_copies",
    "materializes_operands",
    "measure_copy_slots",
    "resolve_costs",
]
