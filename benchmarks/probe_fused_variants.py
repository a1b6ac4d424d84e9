"""Probe: every variant the fused min-cut step weighs, timed and with its compiled peak.

``fused_exe`` chooses among variants of one plan by compiled peak alone (layouts,
backward order, barrier, reductions derived again: :mod:`jaxaot.runtime.fused`). For each
zoo model, at min-cut budget 1 with the residual layouts the product chose, this compiles
XLA's order and consume-first behind the barrier, the step without the barrier, and both
orders with order-free reductions derived again, and times them against
``jit(value_and_grad)`` and ``jit(dots_saveable)`` in interleaved rounds: median step-time
ratio (min-max), compiled peak and its ratio to ``dots_saveable``'s. The row "chosen" is
``jaxaot.value_and_grad``'s own step, with what it kept. With ``--offload`` the plan is the
min-cut at budget 1 with ``offload=True`` (its offloaded residuals travel to host memory), and
the plan without offloading is timed too. ``--budget_pct P`` takes the min-cut at budget P/100
instead of 1; the split executables of the plan are timed beside the fused variants.

Usage: python benchmarks/probe_fused_variants.py MODEL [MODEL ...] [--offload] [--budget_pct 100] [--rounds 9]
[--out FILE]
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import jax

import jaxaot

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import _barrier, chosen_text, jax_references, measure, probe_main, ratio_cells  # noqa: E402
from harness import table  # noqa: E402

#: (label, barrier, order, rederive)
VARIANTS = (("barrier, XLA's order", "all", "xla", False),
            ("barrier, consume-first", "all", "consume_first", False),
            ("no barrier", "none", "xla", False),
            ("barrier, XLA's order, derived again", "all", "xla", True),
            ("barrier, consume-first, derived again", "all", "consume_first", True))


def probe(model: Any, rounds: int, iters: int, offload: bool = False, budget_pct: int = 100) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = dict(jax_references(model, sets[0]))
    budget = budget_pct / 100
    pf = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=budget, offload=offload)
    if offload:
        plain = jaxaot.aot_function(model.loss, partition_fn=functools.partial(
            jaxaot.min_cut_rematerialization_partition, memory_budget=budget))
        progs["no offload (fused)"] = (jaxaot.value_and_grad(plain, argnums=model.argnums), None)
        progs["no offload, split"] = (jaxaot.value_and_grad(plain, argnums=model.argnums, fused=False), None)
    f = jaxaot.aot_function(model.loss, partition_fn=pf)
    progs["split"] = (jaxaot.value_and_grad(f, argnums=model.argnums, fused=False), None)
    vg = jaxaot.value_and_grad(f, argnums=model.argnums)
    vg(*sets[0])
    (chosen,) = [e for n, e in f.lookup(sets[0], {}).programs.executables.items() if n.startswith("fused")]
    progs["chosen"] = (vg, chosen)
    for label, barrier, order, rederive in VARIANTS:
        progs[label] = _barrier(f, model.argnums, sets[0], barrier, chosen.layouts, order, rederive)
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    kept = chosen_text(chosen)
    if offload:
        part = f.lookup(sets[0], {}).programs.training().partition
        kept += f"; offloaded: {[str(r) for r in part.residuals if r.offloaded]}"
    rows = [[f"min-cut {budget:g} step", "x jit(v&g)", "(min-max)", "peak", "x dots peak"]]
    rows += [[name, *ratio_cells(times[name], ref, exe, dots)] for name, (_, exe) in progs.items()]
    return f"## {model.label}  (max relative grad error {err:.1e}; chosen: {kept})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    offload = "--offload" in argv
    probe_main(__doc__, "probe_fused_variants: the fused min-cut step's variants, timed, with their peaks",
               functools.partial(probe, offload=offload), [a for a in argv if a != "--offload"], budget_pct=100)


if __name__ == "__main__":
    main()
