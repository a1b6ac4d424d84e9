"""Probe: what should decide the fused step's residual layouts and backward order?

For each zoo model, the fused step of the default partition and of the min-cut at
budget 1, compiled with XLA's residual layouts (``auto``) and pinned row-major, and
for the min-cut also in the consume-first backward order: median step-time ratio to
``jit(value_and_grad)`` over interleaved rounds, compiled peak as a ratio to
``dots_saveable``'s, and static readings of the optimized HLO that a rule could use
without running the step: kernels launched, transposes and copies among them, and
XLA's estimate of bytes accessed. ``jit(value_and_grad)`` compiled a second time
measures how far two compiles of one program differ. The last columns mark the variant the product's
peak-only rules (:func:`~jaxaot.runtime.fused.choose_layouts`,
:func:`~jaxaot.runtime.fused.choose_order`) keep.

Usage: python benchmarks/probe_layout_choice.py MODEL [MODEL ...] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import re
import sys
from typing import Any

import jax

import jaxaot
from jaxaot.runtime import ordering
from jaxaot.runtime.fused import choose_layouts, choose_order, compiled_peak

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import PARTITIONS, _barrier, jax_references, measure, probe_main, ratio_cells  # noqa: E402
from harness import table  # noqa: E402
from probe_fused_order import bytes_accessed  # noqa: E402

#: Entry-computation instructions that are not kernels.
_NOT_KERNELS = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast", "opt-barrier")


def kernel_census(hlo: str) -> dict[str, int]:
    """Kernels of the optimized HLO's entry computation: all, and those whose name or op is a
    transpose or a copy (XLA names a fusion after its root)."""
    entry = hlo[hlo.rfind("ENTRY "):]
    out = {"kernels": 0, "transposes": 0, "copies": 0}
    for line in entry.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = .*? ([\w-]+)\(", line)
        if not m or m.group(2) in _NOT_KERNELS:
            continue
        name, op = m.group(1), m.group(2)
        out["kernels"] += 1
        out["transposes"] += "transpose" in name or op == "transpose"
        out["copies"] += "copy" in name or op == "copy"
    return out


def variants(model: Any, args: tuple) -> dict[str, tuple[Any, Any]]:
    nums = model.argnums
    progs = dict(jax_references(model, args))
    again = jax.jit(jax.value_and_grad(lambda *a: model.loss(*a), argnums=nums))  # a second compile: the noise floor
    progs["jit(value_and_grad), compiled again"] = (again, again.lower(*args).compile())
    chosen = {}
    for part in ("default", "min-cut 1"):
        f = jaxaot.aot_function(model.loss, partition_fn=PARTITIONS[part])
        barrier = "recomputed" if part == "default" else "all"
        training = f.lookup(args, {}).programs
        orders = ["xla"]
        if part != "default":
            mask_nums = (nums,) if isinstance(nums, int) else tuple(nums)
            mask = tuple(i in mask_nums for i, a in enumerate(args) for _ in jax.tree.leaves(a))
            tp = training.training(mask).partition
            if tp.recomputed and ordering.ordered_eqns(tp.backward, len(tp.cotangent_outputs)):
                orders.append("consume_first")
        peaks = {}
        for order in orders:
            for layouts in ("auto", "pinned"):
                name = f"{part}, {layouts}, {order}"
                progs[name] = _barrier(f, nums, args, barrier, layouts, order)
                peaks[(layouts, order)] = compiled_peak(progs[name][1])
        lay = choose_layouts(peaks[("auto", "xla")], peaks[("pinned", "xla")])
        order = "xla"
        if ("auto", "consume_first") in peaks:
            order = choose_order(peaks[(lay, "xla")], peaks[(lay, "consume_first")])
        chosen[f"{part}, {lay}, {order}"] = True
    return progs, chosen


def probe(model: Any, rounds: int, iters: int) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs, chosen = variants(model, sets[0])
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    base = bytes_accessed(progs["jit(value_and_grad)"][1])
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak", "kernels", "transposes", "copies",
             "bytes acc. x jit", "product keeps"]]
    for name, (_, exe) in progs.items():
        c = kernel_census(exe.as_text())
        moved = bytes_accessed(exe)
        rows.append([name, *ratio_cells(times[name], ref, exe, dots), c["kernels"], c["transposes"], c["copies"],
                     f"{moved / base:.3f}" if moved and base else "-", "<-" if name in chosen else ""])
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "probe_layout_choice: residual layouts and backward order of the fused step, "
               "and what predicts them", probe, argv)


if __name__ == "__main__":
    main()
