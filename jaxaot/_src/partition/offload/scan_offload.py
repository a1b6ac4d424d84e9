"""Offloading inside ``lax.scan`` bodies: which per-iteration residuals go to host memory.

The top-level pass sees a scan's stacked residuals only at its end, when nothing is
left to hide copies behind. So this chooses which of a scan body's saved values
travel to host (the body's ``jax.checkpoint`` policy offloads them by name): in the
steady state an iteration's copies must fit within one iteration's compute each
way, scaled by how much of such copies compute hides (``scan_overlap``, nothing
offloaded under one half) and the device's ``headroom``.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.partition import DeviceModel, Timeline
    >>> from jaxaot._src.partition.offload import plan_body_offload
    >>> def body(w, h):
    ...     a = jnp.tanh(h @ w)
    ...     return jnp.sum(jnp.sin(a @ w))
    >>> w, h = jnp.ones((256, 256)) / 256, jnp.ones((256, 256))
    >>> joint = jaxaot.partition.trace_joint(body, w, h)
    >>> fast = DeviceModel(host_bandwidth=1e12, device_flops=1e12)
    >>> slow = DeviceModel(host_bandwidth=1e9, device_flops=1e12)  # 256 KiB take 0.26 ms
    >>> values = list(Timeline.of(joint, fast).produced)  # as if it saved every value it computes
    >>> len(plan_body_offload(Timeline.of(joint, fast), values, fast).offloaded) > 0
    True
    >>> plan_body_offload(Timeline.of(joint, slow), values, slow).offloaded
    ()
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxaot._src.pytrees import in_host_memory
from jaxaot._src.pytrees import nbytes as aval_nbytes
from jaxaot._src.partition.costs import DeviceModel
from jaxaot._src.partition.offload.host_offload import DEFAULT_MIN_BYTES, OffloadPlan, Timeline, offloadable_dtype


def plan_body_offload(timeline: Timeline, saved: Sequence[Any], model: DeviceModel,
                      nbytes: Mapping[Any, int] | None = None, *, min_bytes: int = DEFAULT_MIN_BYTES) -> OffloadPlan:
    """Which of a scan body's ``saved`` values to offload, each iteration's copies fitting one iteration (module doc).

    Args:
      timeline: the body's joint graph timed on ``model``'s device.
      saved: the body's saved vars (its joint jaxpr's).
      model: the device.
      nbytes: bytes per var as the planner counts them (default: the avals').
      min_bytes: smaller values stay on the device.
    """
    if model.scan_offload_note:
        return OffloadPlan((), 0, model.scan_offload_note)
    size = (lambda v: nbytes[v]) if nbytes is not None else (lambda v: aval_nbytes(v.aval))
    window = min(timeline.forward_seconds, timeline.backward_seconds)
    candidates = [v for v in dict.fromkeys(saved) if v in timeline.produced and v not in timeline.outputs
                  and size(v) >= min_bytes and offloadable_dtype(v.aval) and not in_host_memory(v.aval)]
    candidates.sort(key=lambda v: (-size(v), timeline.order[v]))
    chosen, busy = [], 0.0
    for v in candidates:
        if len(chosen) >= model.max_offloaded:
            break  # no more values than copies the compiler keeps in flight (DeviceModel.copy_slots)
        t = model.hidden_seconds(size(v), in_scan=True)
        if busy + t <= window:
            chosen.append(v)
            busy += t
    chosen.sort(key=timeline.order.__getitem__)
    note = "" if chosen else "nothing offloaded: no per-iteration copy fits in an iteration's compute"
    return OffloadPlan(tuple(chosen), sum(size(v) for v in chosen), note)
