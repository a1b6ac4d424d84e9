"""Probe: where measured per-op costs and FLOP counts decide the min-cut's knapsack differently.

Below ``memory_budget=1`` the min-cut recomputes expensive values (matmuls,
convolutions, large reductions) cheapest-per-saved-byte first. Per zoo model
this probe

* times every knapsack item once (``MeasuredCosts``, less an empty kernel's time; the first-time cost of
  profiling, and the cost of reading the table back, are reported);
* lists the items in measured order beside their FLOP order, with each one's
  effective rate (FLOPs / measured seconds), so dtype, shape and algorithm
  effects show;
* plans every budget of a 0.05-step sweep with FLOP costs and with measured
  costs, and reports the budgets whose saved sets differ, with both byte counts
  (step times for those plans come from ``bench_planner.py``).

Usage: python benchmarks/probe_op_costs.py [--small] [--only NAME] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import jax
import numpy as np
from scipy.stats import spearmanr

import jaxaot
from jaxaot.partition import cost_model, min_cut
from jaxaot.partition.measured_costs import MeasuredCosts
from jaxaot.partition.op_costs import FlopCosts

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import models as zoo_models  # noqa: E402
from harness import fmt_bytes, report, table  # noqa: E402

SWEEP = tuple(round(b, 2) for b in np.arange(0.0, 1.0001, 0.05))


def _items(graph: min_cut.FlowGraph) -> np.ndarray:
    _, candidates = min_cut._candidates(graph, recompute_loops=False)
    return candidates


def probe(name: str, model, cache_dir: str) -> str:
    joint = jaxaot.trace_joint(model.loss, *model.make_args(jax.random.key(0)))
    path = f"{cache_dir}/{name}.json"
    t0 = time.perf_counter()
    measured = MeasuredCosts(path=path)
    graph = min_cut.build_flow_graph(joint, costs=measured)
    items = _items(graph)
    seconds = graph.recompute_seconds(items)
    profile_s = time.perf_counter() - t0
    fallback = measured.fallback  # FLOP rates (DeviceModel.measure, once per process): not the table's cost
    t0 = time.perf_counter()
    again = MeasuredCosts(path=path, fallback=fallback)
    for i in items:
        again.seconds(graph.producers[i])
    reread_s = time.perf_counter() - t0
    assert again.measured == 0, "the table read back should time nothing"
    flops = np.array([cost_model.flops(graph.producers[i]) for i in items])
    nbytes = graph.nbytes[items]
    by_flops = list(min_cut._ordered(min_cut.build_flow_graph(joint, costs=FlopCosts()), items)[0])
    by_measured = list(min_cut._ordered(graph, items)[0])
    rows = [("#", "FLOP #", "eqn", "output", "MFLOP", "bytes", "measured us", "TFLOP/s", "us/MB")]
    for rank, i in enumerate(by_measured[:14]):
        eqn, k = graph.producers[i], list(items).index(i)
        out = eqn.outvars[0].aval
        rows.append((rank, by_flops.index(i), eqn.primitive.name, f"{out.dtype}{list(out.shape)}",
                     f"{flops[k] / 1e6:.1f}", fmt_bytes(nbytes[k]), f"{seconds[k] * 1e6:.1f}",
                     f"{flops[k] / seconds[k] / 1e12:.1f}", f"{seconds[k] * 1e6 / max(nbytes[k] / 1e6, 1e-9):.2f}"))
    rho = spearmanr([by_flops.index(i) for i in by_measured], range(len(by_measured)))[0] if len(items) > 2 else 1.0
    diffs = [("budget", "saved (FLOPs)", "saved (measured)", "same set")]
    differ = 0
    for b in SWEEP:
        plans = [jaxaot.min_cut_rematerialization_partition(joint, memory_budget=float(b), op_costs=c)
                 for c in ("flops", measured)]
        sets = [sorted(map(str, (r.aval for r in p.residuals))) for p in plans]
        same = sets[0] == sets[1] and plans[0].saved_bytes == plans[1].saved_bytes
        differ += not same
        if not same:
            diffs.append((b, fmt_bytes(plans[0].saved_bytes), fmt_bytes(plans[1].saved_bytes), "no"))
    head = (f"## {name}: {model.label}\n{len(items)} knapsack items, {len(set(map(str, seconds)))} distinct times "
            f"(an empty kernel's {measured.empty_kernel_seconds * 1e6:.1f} us subtracted); "
            f"profiling {profile_s:.1f} s (first time), reading the table back and pricing every item {reread_s * 1e3:.0f} ms; "
            f"Spearman rank correlation of the two orders {rho:.3f}; "
            f"{differ} of {len(SWEEP)} sweep budgets plan differently\n")
    return head + table(rows) + ("\n\n" + table(diffs) if differ else "")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--only", help="run only the models whose name contains this")
    ap.add_argument("--out", help="also write the report to this file")
    a = ap.parse_args(argv)
    zoo = zoo_models.zoo("small" if a.small else "gpu")
    cache_dir = tempfile.mkdtemp()
    sections = (probe(n, m, cache_dir) for n, m in zoo.items() if not a.only or a.only in n)
    return report("probe_op_costs: measured per-op costs against FLOP counts in the min-cut's knapsack", sections,
                  a.out)


if __name__ == "__main__":
    main()
