"""Probe: the fused step's backward in XLA's order or consume-first, at several budgets, on the GPU.

For each zoo model and min-cut budget, the fused step with ``order="xla"`` and
``"consume_first"`` (recomputed matmul operands used before their residuals are
read again, :mod:`jaxaot.runtime.ordering`), each compiled with XLA's
residual layouts and row-major ones and kept by :func:`jaxaot.runtime.fused.choose_layouts`
as the product does, against ``jit(value_and_grad)`` and ``jit(dots_saveable)``:
median step-time ratio over interleaved rounds, compiled peak as a ratio to
``dots_saveable``'s, and XLA's cost analysis of bytes accessed (is it a time proxy for
the order's re-reads?).

Usage: python benchmarks/probe_fused_order.py MODEL [MODEL ...] [--budgets 1,0.75] [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import jax

import jaxaot
from jaxaot.runtime.fused import choose_layouts, compiled_peak

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import _barrier, jax_references, measure, ratio_cells  # noqa: E402
from harness import report, table  # noqa: E402
from models import zoo  # noqa: E402


def chosen(f: Any, nums: Any, args: tuple, order: str) -> tuple[Any, Any, str]:
    auto = _barrier(f, nums, args, "all", "auto", order)
    if jax.default_backend() == "cpu":
        return (*auto, "auto")
    pinned = _barrier(f, nums, args, "all", "pinned", order)
    pick = choose_layouts(compiled_peak(auto[1]), compiled_peak(pinned[1]))
    return (*(pinned if pick == "pinned" else auto), pick)


def bytes_accessed(exe: Any) -> float | None:
    """XLA's cost analysis of the executable: bytes its kernels read and write (None if unreported)."""
    try:
        cost = exe.cost_analysis()
    except Exception:  # noqa: BLE001  (backends without cost analysis)
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    return float(cost.get("bytes accessed", 0)) or None if isinstance(cost, dict) else None


def probe(model: Any, budgets: list[float], rounds: int, iters: int) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = jax_references(model, sets[0])
    layouts = {}
    for b in budgets:
        pf = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=b)
        f = jaxaot.aot_function(model.loss, partition_fn=pf)
        for mode in ("xla", "consume_first"):
            step, exe, pick = chosen(f, model.argnums, sets[0], mode)
            progs[f"min-cut {b:g}, {mode}"] = (step, exe)
            layouts[f"min-cut {b:g}, {mode}"] = pick
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    base = bytes_accessed(progs["jit(value_and_grad)"][1])
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak", "layouts", "bytes accessed x jit(v&g)"]]
    for name, (_, exe) in progs.items():
        moved = bytes_accessed(exe)
        rows.append([name, *ratio_cells(times[name], ref, exe, dots), layouts.get(name, "-"),
                     f"{moved / base:.3f}" if moved and base else "-"])
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--budgets", default="1,0.75")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    models = zoo("small" if a.small else "gpu")
    budgets = [float(b) for b in a.budgets.split(",")]
    report("probe_fused_order: the fused step's backward in XLA's order or consume-first",
           (probe(models[m], budgets, a.rounds, a.iters) for m in a.models), a.out)


if __name__ == "__main__":
    main()
