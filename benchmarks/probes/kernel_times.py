"""Where a fused step's time goes, kernel by kernel, from a ``jax.profiler`` trace.

For one zoo model this compiles ``jit(value_and_grad)``, ``jaxaot.value_and_grad`` with the
default partition and with the min-cut at budget 1 (as chosen), and the min-cut step in XLA's
backward order and consume-first behind the barrier, in the layouts the product chose.
Each runs ``--rounds`` times under ``jax.profiler.trace``; the trace is read back with
``jax.profiler.ProfileData`` and the device events are summed per program (by their
``hlo_module``) and per kernel. It prints each program's device time per step and its
``--top`` most expensive kernels with the output shape the optimized HLO gives them, so two
programs' schedules can be compared where their step times differ.

With ``--budget B`` (a ``memory_budget``: a fraction, bytes, or a string with a unit) it compares instead
``jit(value_and_grad)``, JAX's ``dots_saveable`` steps (on the whole loss and per layer), the step
``jaxaot.value_and_grad`` keeps at that budget (and its executable called directly, without the Python of
the call), and the same plan's fused step in the other residual layouts (pinned where XLA's were kept,
XLA's where pinned ones were) and without the barrier, each with its compiled peak: where a budget's step
is slower, the kernels that differ say why.

Each program's row gives its step blocked on (the median of ``--rounds`` calls, each waited for, as
``bench_budget`` times), the device's span per step over calls dispatched back to back (first kernel's
start to last kernel's end), and the kernels' own time: the span less the kernels is the device idle
between kernels, the blocked step less the span the host's part (the call's Python, launch and wait).

Usage: ``python -m benchmarks.probes.kernel_times MODEL [MODEL ...] [--budget B] [--rounds 20] [--top 25]
[--out FILE]`` (MODEL: a name of ``benchmarks/models.py``'s zoo or ``bench_budget``'s two models;
``--small`` for CPU sizes).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import tempfile
from typing import Any

import jax
from jax.profiler import ProfileData

import jaxaot
from benchmarks.bench_budget import all_models
from benchmarks.bench_fused import PARTITIONS, fused_variant, jax_references
from benchmarks.harness import fmt_bytes, median_time, peak_bytes, report, table


def _shapes(hlo: str) -> dict[str, str]:
    """``{instruction name: output shape}`` for the optimized HLO's instructions (also under the
    name with ``_`` for ``.``, as their kernels are named)."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = ([^=]*?) [a-z][\w\-]*\(", hlo, re.M):
        shape = re.sub(r"\{[^}]*\}", "", m.group(2)).strip()[:60]
        out[m.group(1)] = out[m.group(1).replace(".", "_")] = shape  # kernels are named with "_"
    return out


def _device_events(path: str) -> tuple[dict[str, list[float]], list[str], float]:
    """``({kernel's hlo op (or name): [durations in s]}, the device lines seen, seconds from the first
    kernel's start to the last one's end)`` from a trace's device planes."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    lines, starts, ends = [], [], []
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
                starts.append(ev.start_ns)
                ends.append(ev.end_ns)
    return out, lines, (max(ends) - min(starts)) * 1e-9 if starts else 0.0


def _trace(step: Any, args: tuple, steps: int) -> tuple[dict[str, list[float]], list[str], float]:
    """One program's device events over ``steps`` calls dispatched back to back, traced alone
    (:func:`_device_events`)."""
    jax.block_until_ready(step(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(steps):
                out = step(*args)
            jax.block_until_ready(out)
        (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        return _device_events(path)


def _partition_steps(model: Any, args: tuple) -> dict[str, tuple[Any, Any]]:
    """The default partition's and the min-cut 1's steps (as chosen, and in both backward orders)."""
    progs = {}
    for label, pf in (("default partition", None), ("min-cut 1 as chosen", PARTITIONS["min-cut 1"])):
        f = jaxaot.aot_function(model.loss) if pf is None else jaxaot.aot_function(model.loss, partition_fn=pf)
        vg = jaxaot.value_and_grad(f, argnums=model.argnums)
        vg(*args)
        (exe,) = [e for n, e in f.lookup(args, {}).programs.executables.items() if n.startswith("fused")]
        progs[label] = (vg, exe)
        if pf is not None:
            for order in ("xla", "consume_first"):
                progs[f"min-cut 1, {order}"] = fused_variant(f, model.argnums, args, "all", exe.layouts, order)
    return progs


def _budget_steps(model: Any, args: tuple, budget: Any) -> dict[str, tuple[Any, Any]]:
    """The step kept at ``budget`` and its plan's fused step in the other residual layouts."""
    pf = jaxaot.partition.min_cut_rematerialization_partition(memory_budget=budget)
    f = jaxaot.aot_function(model.loss, partition_fn=pf)
    vg = jaxaot.value_and_grad(f, argnums=model.argnums)
    vg(*args)  # a byte budget's first call makes every choice
    (exe,) = [e for n, e in f.lookup(args, {}).programs.executables.items() if n.startswith("fused")]
    v = exe.variant
    other = "auto" if v.layouts == "pinned" else "pinned"
    leaves = f.lookup(args, {}).leaves
    out = {f"budget {budget}, kept ({v.layouts}, {v.order}, barrier {v.barrier})": (vg, exe),
           "the kept executable, called directly": (lambda *_: exe(*leaves), exe),
           f"the same plan, {other} layouts": fused_variant(f, model.argnums, args, v.barrier, other, v.order,
                                                            bool(v.rederived))}
    if v.barrier != "none":
        out["the same plan, no barrier"] = fused_variant(f, model.argnums, args, "none", v.layouts, v.order,
                                                         bool(v.rederived))
    return out


def probe(model: Any, steps: int, top: int, budget: Any = None) -> str:
    args = model.make_args(jax.random.key(0))
    refs = jax_references(model, args)
    progs = {"jit(value_and_grad)": refs["jit(value_and_grad)"]}
    if budget is None:
        progs.update(_partition_steps(model, args))
    else:
        progs.update((k, v) for k, v in refs.items() if "dots_saveable" in k)
        progs.update(_budget_steps(model, args, budget))
    rows = [["program", "blocked ms/step", "device span ms/step", "kernel ms/step", "kernels/step", "compiled peak"]]
    sections, seen = [], []
    for name, (step, exe) in progs.items():
        events, lines, span = _trace(step, args, steps)
        blocked = median_time(lambda: step(*args), warmup=2, iters=steps, min_seconds=0)
        seen = seen or lines
        rows.append([name, f"{blocked * 1e3:.3f}", f"{span / steps * 1e3:.3f}",
                     f"{sum(map(sum, events.values())) / steps * 1e3:.3f}",
                     f"{sum(map(len, events.values())) / steps:.0f}", fmt_bytes(peak_bytes(exe)) if exe else "-"])
        shapes = _shapes(exe.as_text()) if exe is not None else {}
        ks = sorted(events.items(), key=lambda kv: -sum(kv[1]))[:top]
        body = [["kernel", "us/step", "calls/step", "output"]]
        body += [[k[:44], f"{sum(v) / steps * 1e6:.1f}", f"{len(v) / steps:.0f}", shapes.get(k, "-")] for k, v in ks]
        sections.append(f"### {name}\n" + table(body))
    sections.insert(0, table(rows) + f"\n(device lines: {', '.join(seen[:8]) or 'none'})")
    return f"## {model.label}\n" + "\n\n".join(sections)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--budget", help="a memory_budget: compare the step kept there (a JSON number, or bytes with a unit)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", help="also write the report to this file")
    a = ap.parse_args(argv)
    budget = None
    if a.budget is not None:
        try:
            budget = json.loads(a.budget)
        except json.JSONDecodeError:
            budget = a.budget
    models = all_models("small" if a.small else "gpu")
    report("kernel_times: device time per kernel of fused steps",
           (probe(models[m], a.rounds, a.top, budget) for m in a.models), a.out)


if __name__ == "__main__":
    main()
