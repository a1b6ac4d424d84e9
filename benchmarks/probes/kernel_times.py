"""Where a fused step's time goes, kernel by kernel, from a ``jax.profiler`` trace.

For one zoo model this compiles ``jit(value_and_grad)``, ``jaxaot.value_and_grad`` with the
default partition and with the min-cut at budget 1 (as chosen), and the min-cut step in XLA's
backward order and consume-first behind the barrier, in the layouts the product chose.
Each runs ``--rounds`` times under ``jax.profiler.trace``; the trace is read back with
``jax.profiler.ProfileData`` and the device events are summed per program (by their
``hlo_module``) and per kernel. It prints each program's device time per step and its
``--top`` most expensive kernels with the output shape the optimized HLO gives them, so two
programs' schedules can be compared where their step times differ.

Usage: ``python -m benchmarks.probes.kernel_times MODEL [MODEL ...] [--rounds 20] [--top 25] [--out FILE]``
(MODEL: a name of ``benchmarks/models.py``'s zoo; ``--small`` for CPU sizes).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
from typing import Any

import jax
from jax.profiler import ProfileData

import jaxaot
from benchmarks.bench_fused import PARTITIONS, fused_variant, jax_references, probe_main
from benchmarks.harness import table


def _shapes(hlo: str) -> dict[str, str]:
    """``{instruction name: output shape}`` for the optimized HLO's instructions (also under the
    name with ``_`` for ``.``, as their kernels are named)."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = ([^=]*?) [a-z][\w\-]*\(", hlo, re.M):
        shape = re.sub(r"\{[^}]*\}", "", m.group(2)).strip()[:60]
        out[m.group(1)] = out[m.group(1).replace(".", "_")] = shape  # kernels are named with "_"
    return out


def _device_events(path: str) -> tuple[dict[str, list[float]], list[str]]:
    """``({kernel's hlo op (or name): [durations in s]}, the device lines seen)`` from a trace's
    device planes."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    lines = []
    for plane in ProfileData.from_file(path).planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            lines.append(f"{plane.name}/{line.name}")
            name = line.name.lower()  # "Stream #14(Compute,MemcpyD2D)": one stream, kernels and copies
            if "stream" not in name or ("memcpy" in name and "compute" not in name):
                continue
            for ev in line.events:
                op = str(dict(ev.stats).get("hlo_op", ""))  # a command buffer's kernels share its op
                out[ev.name if not op or op.startswith("command_buffer") else op].append(ev.duration_ns * 1e-9)
    return out, lines


def _trace(step: Any, args: tuple, steps: int) -> tuple[dict[str, list[float]], list[str]]:
    """One program's device events over ``steps`` calls, traced alone."""
    jax.block_until_ready(step(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(steps):
                out = step(*args)
            jax.block_until_ready(out)
        (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        return _device_events(path)


def probe(model: Any, steps: int, top: int) -> str:
    args = model.make_args(jax.random.key(0))
    refs = jax_references(model, args)
    progs = {"jit(value_and_grad)": refs["jit(value_and_grad)"]}
    for label, pf in (("default partition", None), ("min-cut 1 as chosen", PARTITIONS["min-cut 1"])):
        f = jaxaot.aot_function(model.loss) if pf is None else jaxaot.aot_function(model.loss, partition_fn=pf)
        vg = jaxaot.value_and_grad(f, argnums=model.argnums)
        vg(*args)
        (exe,) = [e for n, e in f.lookup(args, {}).programs.executables.items() if n.startswith("fused")]
        progs[label] = (vg, exe)
        if pf is not None:
            for order in ("xla", "consume_first"):
                progs[f"min-cut 1, {order}"] = fused_variant(f, model.argnums, args, "all", exe.layouts, order)
    rows = [["program", "device ms/step", "kernels/step"]]
    sections, seen = [], []
    for name, (step, exe) in progs.items():
        events, lines = _trace(step, args, steps)
        seen = seen or lines
        rows.append([name, f"{sum(map(sum, events.values())) / steps * 1e3:.3f}",
                     f"{sum(map(len, events.values())) / steps:.0f}"])
        shapes = _shapes(exe.as_text()) if exe is not None else {}
        ks = sorted(events.items(), key=lambda kv: -sum(kv[1]))[:top]
        body = [["kernel", "us/step", "calls/step", "output"]]
        body += [[k[:44], f"{sum(v) / steps * 1e6:.1f}", f"{len(v) / steps:.0f}", shapes.get(k, "-")] for k, v in ks]
        sections.append(f"### {name}\n" + table(body))
    sections.insert(0, table(rows) + f"\n(device lines: {', '.join(seen[:8]) or 'none'})")
    return f"## {model.label}\n" + "\n\n".join(sections)


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "kernel_times: device time per kernel of fused steps",
               lambda model, rounds, iters, top: probe(model, rounds, top), argv, rounds=20, top=25)


if __name__ == "__main__":
    main()
