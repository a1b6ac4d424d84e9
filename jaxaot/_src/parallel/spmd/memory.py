"""Whether a compiled pipeline step fits its devices, checked before it first runs.

A step that runs out of memory on one device hangs the others in the tick's
``ppermute``, so :func:`check_fits` compares the compiled per-device peak with what
each device can give it and raises :class:`~jaxaot.errors.PipelineMemoryError`
naming the peak, the limit and what to change. Backends that report no limit (the
CPU) are not checked.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from jaxaot.errors import PipelineMemoryError
from jaxaot._src.parallel.schedule import Schedule
from jaxaot._src.units import format_bytes


def device_memory(device: Any) -> tuple[int, int] | None:
    """``(bytes_limit, bytes_in_use)`` of ``device``, or None where the backend does not report a limit."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))


def resident_bytes(args: Any) -> dict:
    """Per device, the bytes of ``args``' shards already there (the step's peak counts them)."""
    out: dict = {}
    for x in jax.tree_util.tree_leaves(args):
        for shard in getattr(x, "addressable_shards", ()):
            out[shard.device] = out.get(shard.device, 0) + int(shard.data.nbytes)
    return out


def check_fits(peak: int | None, devices: Sequence[Any], args: Any, where: str, schedule: Schedule) -> None:
    """Raise :class:`PipelineMemoryError` unless every device of ``devices`` has ``peak`` bytes for the step.

    ``where`` says in words what the peak holds (the buffers by kind), for the message.
    """
    if not peak:
        return
    resident = resident_bytes(args)
    for device in devices:
        memory = device_memory(device)
        if memory is None:
            continue
        limit, in_use = memory
        held = max(in_use - resident.get(device, 0), 0)
        available = limit - held
        if peak <= available:
            continue
        live = max(schedule.peak_live_microbatches())
        raise PipelineMemoryError(
            f"the compiled pipeline step needs {format_bytes(peak)} on each device (its compiled peak: {where}), "
            f"but {device} has {format_bytes(available)} for it ({format_bytes(limit)} limit, "
            f"{format_bytes(held)} held by other arrays). Run as it is, it would run out of memory on that device "
            f"while the others wait for it. To fit: a schedule that keeps fewer microbatches alive ("
            f"{schedule.name!r} keeps up to {live} per device; '1f1b' and 'zero_bubble' keep at most as many as "
            f"there are stages); fewer or smaller microbatches (num_microbatches={schedule.num_microbatches}, "
            "or a smaller batch); or stages that store less: partition_fn=functools.partial("
            "jaxaot.partition.min_cut_rematerialization_partition, memory_budget=...) recomputes what it does not store.",
            peak=peak, limit=limit, available=available, device=device)
