"""Where a compiled pipeline step's time goes, per tick: ``bench_pipeline.py --profile SCHEDULE``.

Runs one compiled step a few times under ``jax.profiler.trace``, reads the trace
back (``jax.profiler.ProfileData``) and sums each device's kernel time by kind:

* **compute**: matrix products, fusions and reductions of the stages' passes;
* **copy**: ``copy``, ``dynamic-slice`` / ``dynamic-update-slice`` and ``concatenate``
  kernels and device-to-device memcpys (records fetched from and stored into buffers);
* **fill**: memsets and broadcast kernels (zero records and fresh buffers);
* **collective**: NCCL kernels (``ppermute`` and the final ``psum`` / ``pmean``).

Each is printed per step and per tick, averaged over the devices, next to the
measured step time and the lockstep model's, so that the per-tick overhead
``(measured - model) / ticks`` can be traced to its kinds. The ``--top`` kernels
by total time follow.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
import time
from typing import Any, Callable

import jax
from jax.profiler import ProfileData

from benchmarks.harness import table

KINDS = ("compute", "copy", "fill", "collective")


def kind_of(name: str) -> str:
    """The kind of a device event, from its kernel name or HLO op (lower case)."""
    n = name.lower()
    if "nccl" in n or "collective" in n or "all-reduce" in n or "all_reduce" in n or "sendrecv" in n:
        return "collective"
    if "memset" in n or "broadcast" in n:
        return "fill"
    if ("copy" in n or "dynamic_update_slice" in n or "dynamic-update-slice" in n or "dynamic_slice" in n
            or "dynamic-slice" in n or "concatenate" in n or "memcpy" in n):
        return "copy"
    return "compute"


def device_times(path: str) -> dict[str, dict[str, list[float]]]:
    """Per device plane, ``{event name: [seconds]}`` of its kernels and copies."""
    out: dict[str, dict[str, list[float]]] = {}
    for plane in ProfileData.from_file(path).planes:
        if not plane.name.startswith("/device:"):
            continue
        events = out.setdefault(plane.name, collections.defaultdict(list))
        for line in plane.lines:
            lname = line.name.lower()
            if "stream" not in lname and "memcpy" not in lname:
                continue
            for ev in line.events:
                op = str(dict(ev.stats).get("hlo_op", ""))
                label = f"{ev.name} [{op}]" if op and op not in ev.name else ev.name
                events[label].append(ev.duration_ns * 1e-9)
    return out


def profile(run: Callable[[], Any], *, steps: int, ticks: int, lockstep: float, top: int = 20) -> str:
    """The per-tick breakdown of ``run`` (one compiled pipeline step) over ``steps`` traced steps."""
    jax.block_until_ready(run())  # compiled and warm
    walls = []
    for _ in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(run())
        walls.append(time.perf_counter() - t)
    wall = sorted(walls)[len(walls) // 2]
    folder = tempfile.mkdtemp(prefix="pipeline_trace_")
    with jax.profiler.trace(folder):
        for _ in range(steps):
            jax.block_until_ready(run())
    files = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return f"no trace written under {folder}"
    per_device = device_times(files[0])
    if not per_device:
        return f"the trace under {folder} has no device planes (a CPU run: profile on a GPU)"
    totals = {k: 0.0 for k in KINDS}
    kernels: dict[str, float] = collections.defaultdict(float)
    for events in per_device.values():
        for name, xs in events.items():
            totals[kind_of(name)] += sum(xs)
            kernels[name] += sum(xs)
    n = len(per_device) * steps  # per device and step
    rows = [("kind", "ms / step", "ms / tick", "share")]
    busy = sum(totals.values()) / n
    for k in KINDS:
        rows.append((k, f"{totals[k] / n * 1e3:.2f}", f"{totals[k] / n / ticks * 1e3:.3f}",
                     f"{totals[k] / n / max(busy, 1e-12):.1%}"))
    rows.append(("device busy", f"{busy * 1e3:.2f}", f"{busy / ticks * 1e3:.3f}", ""))
    head = (f"measured {wall * 1e3:.2f} ms / step (median of {steps}), lockstep model {lockstep * 1e3:.2f} ms, "
            f"{ticks} ticks: overhead (measured - model) / ticks = {(wall - lockstep) / ticks * 1e3:.3f} ms; "
            f"device time averaged over {len(per_device)} devices; trace in {folder}")
    top_rows = [("kernel [hlo op]", "kind", "ms / step / device")]
    for name, total in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
        top_rows.append((name[:90], kind_of(name), f"{total / n * 1e3:.3f}"))
    return head + "\n" + table(rows) + "\n\ntop kernels\n" + table(top_rows)
