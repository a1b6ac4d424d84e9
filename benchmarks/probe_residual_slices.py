"""Probe: the fused min-cut step with sliced residuals passing the barrier whole or as their slices.

For each zoo model, the fused step at min-cut budget 1 (row-major residuals, as the product
keeps on these blocks) in XLA's backward order and consume-first, with ``slices=False`` (the
fused QKV projection's output passes the barrier whole) and ``slices=True``
(:mod:`jaxaot.runtime.residual_slices`), against ``jit(value_and_grad)`` and ``jit(dots_saveable)``:
median step-time ratio over interleaved rounds, and compiled peak as a ratio to ``dots_saveable``'s.

Usage: python benchmarks/probe_residual_slices.py MODEL [MODEL ...] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import sys
from typing import Any

import jax

import jaxaot
from jaxaot import _compat as C
from jaxaot.runtime.fused import fused_program

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import PARTITIONS, jax_references, measure, probe_main, ratio_cells  # noqa: E402
from harness import table  # noqa: E402


def variant(f: Any, nums: Any, args: tuple, order: str, slices: bool) -> tuple[Any, Any]:
    nums = (nums,) if isinstance(nums, int) else tuple(nums)
    programs, leaves, _ = f.lookup(args, {})
    mask = [i in nums for i, a in enumerate(args) for _ in jax.tree.leaves(a)]
    closed = fused_program(programs.training(tuple(mask)), barrier="all", layouts="pinned", order=order,
                           slices=slices)
    exe = jax.jit(lambda *xs: C.eval_closed(closed, *xs)).lower(*leaves).compile()
    return (lambda *a: exe(*jax.tree.leaves(a))), exe


def probe(model: Any, rounds: int, iters: int) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = dict(jax_references(model, sets[0]))
    f = jaxaot.aot_function(model.loss, partition_fn=PARTITIONS["min-cut 1"])
    for order in ("xla", "consume_first"):
        for slices in (False, True):
            progs[f"min-cut 1, {order}, {'slices' if slices else 'whole'}"] = variant(
                f, model.argnums, sets[0], order, slices)
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak"]]
    rows += [[name, *ratio_cells(times[name], ref, exe, dots)] for name, (_, exe) in progs.items()]
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "probe_residual_slices: sliced residuals through the fused step's barrier, whole or as slices",
               probe, argv)


if __name__ == "__main__":
    main()
