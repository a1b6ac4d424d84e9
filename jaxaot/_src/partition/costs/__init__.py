"""What values and eqns cost: modelled, and measured on the device.

The cuts (:mod:`jaxaot._src.partition.mincut`, :mod:`jaxaot._src.partition.bw`) and the
offload planner (:mod:`jaxaot._src.partition.offload`) ask these; nothing here knows
about partitions.

Modules:

* ``cost_model``: which eqns may be recomputed (:class:`Recompute`: cheap, expensive, never), and their FLOPs;
* ``op_costs``: the :class:`OpCosts` protocol, what one eqn costs to run, and its FLOP estimate :class:`FlopCosts`;
* ``op_scaling``: a byte limit on timing, and an eqn at smaller shapes to time within it;
* ``op_profile``: timing one eqn on one device, in a chain of copies;
* ``measured_costs``: :class:`MeasuredCosts`, each distinct expensive eqn timed once per device kind and cached;
* ``device_model``: :class:`DeviceModel`, the host link, the device's speed and how much of a copy compute hides;
* ``copy_slots``: how many copies to and from host memory the compiler keeps in flight at once;
* ``device_bytes``: per-device bytes of a sharded program's values (:func:`device_fractions`).
"""

from jaxaot._src.partition.costs.cost_model import Recompute, classify, flops, is_alias, is_loop, materializes_operands
from jaxaot._src.partition.costs.op_costs import FlopCosts, OpCosts
from jaxaot._src.partition.costs.op_scaling import byte_limit
from jaxaot._src.partition.costs.device_model import (
    HOST_MEMORY_KIND, MEASURED_HEADROOM, MIN_OVERLAP, DeviceModel, best_seconds, host_memory_note)
from jaxaot._src.partition.costs.measured_costs import MeasuredCosts, resolve_costs
from jaxaot._src.partition.costs.copy_slots import copies_in_flight, kernels_beside_copies, measure_copy_slots
from jaxaot._src.partition.costs.device_bytes import device_fractions

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
