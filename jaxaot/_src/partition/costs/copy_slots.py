"""How many copies to and from host memory XLA keeps in flight at once in one program.

XLA's latency-hiding scheduler gives asynchronous copies a fixed number of slots; a
copy beyond them waits for one, and the scheduler frees a slot by ending some copy
early, so its time is no longer hidden (``docs/benchmarks.md``, Findings). So the
offload planner moves at most that many values
(:attr:`~jaxaot._src.partition.costs.device_model.DeviceModel.copy_slots`).
:func:`measure_copy_slots` compiles (does not run) one program with eight host
copies beside compute and counts the copies its schedule keeps in flight
(:func:`copies_in_flight`).

Example:
    >>> schedule = '''ENTRY %main (a: f32[4]) -> f32[4] {
    ...   %copy-start = (f32[4], f32[4], u32[]) copy-start(%a)
    ...   %copy-start.1 = (f32[4], f32[4], u32[]) copy-start(%b)
    ...   %fusion = f32[4] fusion(%a), kind=kLoop, calls=%f
    ...   %copy-done = f32[4] copy-done(%copy-start)
    ...   %copy-done.1 = f32[4] copy-done(%copy-start.1)
    ... }'''
    >>> copies_in_flight(schedule)
    2
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp

_START = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bcopy-start\(")
_DONE = re.compile(r"\bcopy-done\(\s*%?([\w.\-]+)\s*\)")
_KERNEL = re.compile(r"=.*\b(fusion|custom-call|convolution|dot)\(")

#: Host-memory inputs of :func:`measure_copy_slots`'s program: more slots than this read as "no limit".
PROBE_COPIES = 8


def _entry(hlo: str) -> list[str]:
    """The lines of ``hlo``'s entry computation (all of it if none is marked)."""
    at = hlo.rfind("ENTRY")
    return (hlo[at:] if at >= 0 else hlo).splitlines()


def _copies(hlo: str) -> list[tuple[int, int, int]]:
    """Per copy of ``hlo``'s scheduled entry computation, in order of its done: ``(start line,
    done line, kernels scheduled between them)``."""
    started: dict[str, tuple[int, int]] = {}
    copies = []
    kernels = 0
    for at, line in enumerate(_entry(hlo)):
        done = _DONE.search(line)
        if done and done.group(1) in started:
            line0, kernels0 = started.pop(done.group(1))
            copies.append((line0, at, kernels - kernels0))
            continue
        start = _START.match(line)
        if start:
            started[start.group(1)] = (at, kernels)
        elif _KERNEL.search(line):
            kernels += 1
    return copies


def copies_in_flight(hlo: str) -> int:
    """The most asynchronous copies open at once in the scheduled entry computation of ``hlo``
    (a compiled executable's ``as_text()``): 0 where it makes none."""
    copies = _copies(hlo)
    return max((sum(s <= start < d for s, d, _ in copies) for start, _, _ in copies), default=0)


def kernels_beside_copies(hlo: str) -> list[int]:
    """Per copy in ``hlo``'s scheduled entry computation (in order of its done), the kernels
    (fusions, custom calls, dots, convolutions) scheduled between its start and its done: 0 means
    nothing hides it."""
    return [k for _, _, k in _copies(hlo)]


def measure_copy_slots(device: Any, host_memory_kind: str = "pinned_host") -> int | None:
    """The copies ``device``'s compiler keeps in flight at once (module docstring); None where it
    makes no asynchronous copies or keeps all :data:`PROBE_COPIES` of the probe open (no limit seen)."""
    n = 256

    def probe(a, *hosts):
        x = a
        for _ in range(PROBE_COPIES):
            x = jax.lax.optimization_barrier(jnp.tanh(x @ a))
        back = [jax.device_put(h, jax.memory.Space.Device) for h in hosts]
        return x + sum(jnp.sum(b) for b in back)

    try:
        on_device = jax.sharding.SingleDeviceSharding(device)
        on_host = on_device.with_memory_kind(host_memory_kind)
        a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=on_device)
        hosts = [jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=on_host) for _ in range(PROBE_COPIES)]
        text = jax.jit(probe).lower(a, *hosts).compile().as_text()
    except Exception:  # noqa: BLE001 - a backend that cannot compile the probe: no limit is known
        return None
    slots = copies_in_flight(text or "")
    return slots if 0 < slots < PROBE_COPIES else None


__all__ = ["copies_in_flight", "kernels_beside_copies", "measure_copy_slots"]
