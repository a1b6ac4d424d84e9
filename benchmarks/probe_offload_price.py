"""Probe: what offloading each saved value alone costs, against the same plan with everything on the device.

The offload planner (:mod:`jaxaot.partition.offload`) takes a copy to host
memory to cost nothing while its timeline says compute hides it. ``bench_offload``
found plans whose offloading costs 1.15-1.5x the step on the GPT-2 block. This
probe prices the values one at a time: at min-cut budget 1 (no offloading), each
saved temporary of at least 4 MiB is offloaded alone (``apply_offload``), and so
are the small ones (under 1 MiB) together, and the planner's own choice; every
variant runs split (forward, then backward) and fused, interleaved with the plan
that offloads nothing, as the median ratio (min-max) to
``jit(value_and_grad)``. Beside each: the timeline's slack for the value (seconds
between its production and the end of the forward, and between the backward's
start and its first read, against one copy's time), and in the compiled split
programs and the fused one, how many kernels XLA scheduled between each copy's
start and its done (``jaxaot.partition.copy_slots.kernels_beside_copies``). Rows
"planner's offloads, on this plan" apply the planner's chosen set to the plan
without offloading (the same saved set), with and without its small values.
``PROBE_HLO_DIR=DIR`` also writes each variant's compiled HLO there.

Found with it (H100, session 14): values that cost nothing offloaded alone cost
1.25x together, because XLA keeps two copies in flight; the planner now moves
at most ``DeviceModel.copy_slots`` values.

``--budget_pct P`` takes the min-cut at budget P/100 instead of 1 (the planner's choice then
plans at that budget, with a saved set of its own).

Usage: python benchmarks/probe_offload_price.py MODEL [MODEL ...] [--budget_pct 100] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import functools
import math
import os
import sys
from typing import Any

import jax

import jaxaot
from jaxaot.partition import offload as host_offload
from jaxaot.partition.copy_slots import kernels_beside_copies
from jaxaot.partition.measured_costs import resolve_costs
from jaxaot.partition.split import split_joint

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import jax_references, measure, probe_main, ratio_cells  # noqa: E402
from harness import fmt_bytes, table  # noqa: E402

LARGE, SMALL = 4 << 20, 1 << 20
#: Where to write each variant's compiled HLO (environment variable ``PROBE_HLO_DIR``; unset: nowhere).
HLO_DIR = os.environ.get("PROBE_HLO_DIR")


def _offloading(base: Any, positions: tuple[int, ...], joint: Any) -> Any:
    """``base`` (a partition of a joint graph like ``joint``) with the residuals at ``positions`` offloaded."""
    return host_offload.apply_offload(base, positions)


def _variants(plain: Any, timeline: Any, device: Any, prefix: str = "") -> dict[str, tuple[tuple[int, ...], str]]:
    """Each large saved temporary of ``plain`` offloaded alone, and the small ones together:
    ``label -> (positions, its windows out / back in copies, or "-")``."""
    saved = host_offload.saved_vars(plain)
    temps = [(j, r) for j, r in enumerate(plain.residuals) if r.source == "temporary"]
    variants = {f"{prefix}nothing offloaded": ((), "-")}
    windows = timeline.windows(set(saved))
    for j, r in temps:
        if r.nbytes >= LARGE:
            out, back = windows.get(saved[j], (timeline.forward_seconds, math.inf))
            copy = device.transfer_seconds(r.nbytes)
            variants[f"{prefix}[{j}] {r.aval.dtype}{list(r.aval.shape)} {r.producer}"] = (
                (j,), f"{out / copy:.1f}x / {back / copy:.1f}x")
    small = tuple(j for j, r in temps if host_offload.DEFAULT_MIN_BYTES <= r.nbytes < SMALL)
    if small:
        label = f"{prefix}{len(small)} small ({fmt_bytes(sum(plain.residuals[j].nbytes for j in small))})"
        variants[label] = (small, "-")
    return variants


def probe(model: Any, rounds: int, iters: int, budget_pct: int = 100) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    budget = budget_pct / 100
    device = jaxaot.DeviceModel.measure()
    joint = jaxaot.trace_joint(model.loss, *sets[0])
    plain = jaxaot.min_cut_rematerialization_partition(joint, memory_budget=budget)
    timeline = host_offload.Timeline.of(joint, device, resolve_costs("auto", device, model_given=True))  # as planned
    planned = jaxaot.min_cut_rematerialization_partition(joint, memory_budget=budget, offload=True,
                                                         device_model=device)
    chosen = [v for v, r in zip(host_offload.saved_vars(planned), planned.residuals) if r.offloaded]
    same = set(host_offload.saved_vars(planned)) == set(host_offload.saved_vars(plain))
    bases = [plain]
    if not same:  # the planner saved more to offload: its saved set, everything on the device, is the control
        bases.append(split_joint(joint, host_offload.saved_vars(planned)))
    variants: dict[str, tuple[Any, tuple[int, ...]] | None] = {}
    slack: dict[str, str] = {}
    for i, base in enumerate(bases):
        for label, (positions, sl) in _variants(base, timeline, device, "planner's set: " if i else "").items():
            variants[label], slack[label] = (base, positions), sl
    base = bases[-1]
    at = {v: j for j, v in enumerate(host_offload.saved_vars(base))}
    if chosen and all(v in at for v in chosen):
        variants["planner's offloads, on this plan"] = (base, tuple(at[v] for v in chosen))
        large = tuple(at[v] for v in chosen if base.residuals[at[v]].nbytes >= SMALL)
        if 0 < len(large) < len(chosen):
            variants["planner's large offloads, on this plan"] = (base, large)
    variants["planner's choice"] = None
    progs = dict(jax_references(model, sets[0]))
    info = {}
    for label, spec in variants.items():
        pf = (functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=budget, offload=True,
                                device_model=device) if spec is None else functools.partial(_offloading, *spec))
        f = jaxaot.aot_function(model.loss, partition_fn=pf)
        low = f.lower(*sets[0])
        texts = low.compile().as_text()
        gaps = [kernels_beside_copies(texts[k]) for k in ("forward", "backward")]
        off = [r for r in low.saved if r.offloaded]
        if HLO_DIR:
            for k, t in texts.items():
                with open(f"{HLO_DIR}/{model.name}_{len(info)}_{k}.txt", "w") as fh:
                    fh.write(f"# {label}\n{t}")
        progs[label + ", split"] = (jaxaot.value_and_grad(f, argnums=model.argnums, fused=False), None)
        vg = jaxaot.value_and_grad(f, argnums=model.argnums)
        vg(*sets[0])
        (fused,) = [e for n, e in f.lookup(sets[0], {}).programs.executables.items() if n.startswith("fused")]
        gaps.append(kernels_beside_copies(fused.as_text()))
        if HLO_DIR:
            with open(f"{HLO_DIR}/{model.name}_{len(info)}_fused.txt", "w") as fh:
                fh.write(f"# {label}\n{fused.as_text()}")
        info[label] = (fmt_bytes(sum(r.nbytes for r in off)), slack.get(label, "-"), f"{gaps[0]} / {gaps[1]}",
                       str(gaps[2]))
        progs[label + ", fused"] = (vg, None)
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    rows = [[f"variant (min-cut {budget:g})", "offloaded", "slack out / back (x copy)", "kernels under copies (fwd / bwd)", "(fused)",
             "split x jit(v&g)", "(min-max)", "fused x jit(v&g)", "(min-max)"]]
    for label, (nb, sl, gaps, fgaps) in info.items():
        s = ratio_cells(times[label + ", split"], ref, None, dots)[:2]
        fz = ratio_cells(times[label + ", fused"], ref, None, dots)[:2]
        rows.append([label, nb, sl, gaps, fgaps, *s, *fz])
    offl = "; ".join(str(r) for r in planned.residuals if r.offloaded)
    return (f"## {model.label}  (max relative grad error {err:.1e}; device: {device})\n"
            f"planner's offloads: {offl}\nplanner's saved set is this plan's: {same}\n" + table(rows))


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "probe_offload_price: offloading each saved value alone, split and fused", probe, argv,
               budget_pct=100)


if __name__ == "__main__":
    main()
