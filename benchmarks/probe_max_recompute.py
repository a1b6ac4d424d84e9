"""Probe: the fused min-cut step when max/min reductions are recomputable (classed cheap).

The cost model classes a reduction whose output is far smaller than its input
expensive: recomputing it is a full extra pass. XLA's GPU block-level fusions,
though, recompute a row's max inside the kernel that reads the row anyway
(``jit(dots_saveable)``'s softmax backward does: it keeps only the row sums). For each zoo
model, the fused step at min-cut budget 1 (row-major residuals, sliced residuals, XLA's
order and consume-first) with the cost model as it is and with ``reduce_max``/``reduce_min``/
``argmax``/``argmin`` cheap: median time ratio to ``jit(value_and_grad)`` over interleaved
rounds, compiled peak as a ratio to ``dots_saveable``'s, and the plan's saved bytes.

Usage: python benchmarks/probe_max_recompute.py MODEL [MODEL ...] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import jax

import jaxaot

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import jax_references, measure, probe_main, ratio_cells  # noqa: E402
from harness import fmt_bytes, table  # noqa: E402
from probe_fused_peak import min_cut_reductions_cheap  # noqa: E402
from probe_residual_slices import variant  # noqa: E402

_ORDER_FREE = frozenset({"reduce_max", "reduce_min", "argmax", "argmin"})
min_cut_max_cheap = functools.partial(min_cut_reductions_cheap, names=_ORDER_FREE)


def probe(model: Any, rounds: int, iters: int) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = dict(jax_references(model, sets[0]))
    saved = {}
    for tag, pf in (("as is", functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=1.0)),
                    ("max cheap", min_cut_max_cheap)):
        f = jaxaot.aot_function(model.loss, partition_fn=pf)
        saved[tag] = f.lower(*sets[0]).saved_bytes
        for order in ("xla", "consume_first"):
            progs[f"min-cut 1, {tag}, {order}"] = variant(f, model.argnums, sets[0], order, True)
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak", "saved"]]
    for name, (_, exe) in progs.items():
        tag = next((t for t in saved if f", {t}," in name), None)
        rows.append([name, *ratio_cells(times[name], ref, exe, dots), fmt_bytes(saved[tag]) if tag else "-"])
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "probe_max_recompute: the fused min-cut step with max/min reductions recomputable",
               probe, argv)


if __name__ == "__main__":
    main()
