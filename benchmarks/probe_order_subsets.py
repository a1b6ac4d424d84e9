"""Probe: which consume-first matmuls make the fused step's peak, and what ordering each costs.

The consume-first backward order (:mod:`jaxaot.runtime.ordering`) sequences every
matmul that reads a recomputed operand; on the Llama block that is nine matmuls and
it cost 3-7% of the step, for a peak 16% lower. This probe, at min-cut budget 1 with
the residual layouts the product chose, compiles the step with each ordered matmul
alone consume-first (compiled peak only, with its recomputed operand's shape), and
times, in interleaved rounds against ``jit(value_and_grad)`` and ``jit(dots_saveable)``:
XLA's order, every matmul consume-first, and only the matmuls reading the largest
recomputed operand (all that tie) consume-first (``consume_largest``), plus the default
partition.
``PROBE_LAYOUTS`` (a comma-separated list of ``auto`` and ``pinned``) times
the three orders in those residual layouts instead of the chosen ones; ``PROBE_SINGLES=0``
skips the one-matmul rows; with ``PROBE_HLO_DIR`` set, each timed step's optimized HLO is
written there.

Usage: python benchmarks/probe_order_subsets.py MODEL [MODEL ...] [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import os
import sys
from typing import Any
from unittest import mock

import jax

import jaxaot
from jaxaot import _compat as C
from jaxaot._pytrees import nbytes
from jaxaot.runtime import ordering
from jaxaot.runtime.fused import compiled_peak

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import (PARTITIONS, _barrier, chosen_text, jax_references, measure, probe_main,  # noqa: E402
                         ratio_cells)
from harness import fmt_bytes, table  # noqa: E402


def _only(keep: Any) -> Any:
    """A stand-in for :func:`jaxaot.runtime.ordering.ordered_eqns` that keeps the eqns ``keep`` picks
    from ``(backward, {id(eqn): residuals})``."""
    original = ordering.ordered_eqns

    def ordered(backward: Any, num: int) -> dict:
        return keep(backward, num, original(backward, num))

    return mock.patch.object(ordering, "ordered_eqns", ordered)


def _largest(backward: Any, num: int, every: dict) -> dict:
    """The ordered eqns whose recomputed operands are the largest in bytes."""
    producer, reached = ordering._walk(C.jaxpr_of(backward), num)
    size = {id(e): sum(nbytes(v.aval) for v in ordering._reads(e) if id(v) in producer)
            for e in reached if id(e) in every}
    return {k: v for k, v in every.items() if size and size[k] == max(size.values())}


def _singles(f: Any, nums: Any, args: tuple, layouts: str) -> list[list[str]]:
    """One row per ordered matmul: its recomputed operands and the peak with it alone consume-first."""
    programs, _, _ = f.lookup(args, {})
    nums_t = (nums,) if isinstance(nums, int) else tuple(nums)
    mask = tuple(i in nums_t for i, a in enumerate(args) for _ in jax.tree.leaves(a))
    part = programs.training(mask).partition
    n = len(part.cotangent_outputs)
    every = ordering.ordered_eqns(part.backward, n)
    producer, reached = ordering._walk(C.jaxpr_of(part.backward), n)
    rows = []
    for eqn in [e for e in reached if id(e) in every]:
        with _only(lambda b, n, ev, k=id(eqn): {i: r for i, r in ev.items() if i == k}):
            _, exe = _barrier(f, nums, args, "all", layouts, "consume_first")
        rec = [str(v.aval) for v in ordering._reads(eqn) if id(v) in producer]
        rows.append([f"alone: {eqn.primitive.name} reading {', '.join(rec)}", "-", "-",
                     fmt_bytes(compiled_peak(exe)), "-"])
    return rows


def probe(model: Any, rounds: int, iters: int) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = dict(jax_references(model, sets[0]))
    progs["jit(value_and_grad), compiled again"] = (jax.jit(jax.value_and_grad(model.loss, argnums=model.argnums)),
                                                   None)
    default = jaxaot.aot_function(model.loss)
    progs["default partition"] = (jaxaot.value_and_grad(default, argnums=model.argnums), None)
    f = jaxaot.aot_function(model.loss, partition_fn=PARTITIONS["min-cut 1"])
    vg = jaxaot.value_and_grad(f, argnums=model.argnums)
    vg(*sets[0])
    (chosen,) = [e for n, e in f.lookup(sets[0], {}).programs.executables.items() if n.startswith("fused")]
    progs["min-cut 1 as chosen"] = (vg, chosen)
    for layouts in os.environ.get("PROBE_LAYOUTS", chosen.layouts).split(","):
        for order in ("xla", "consume_first"):
            progs[f"min-cut 1, {order}, {layouts}"] = _barrier(f, model.argnums, sets[0], "all", layouts, order)
        with _only(_largest):
            progs[f"min-cut 1, consume_largest, {layouts}"] = _barrier(f, model.argnums, sets[0], "all", layouts,
                                                                       "consume_first")
    if os.environ.get("PROBE_HLO_DIR"):
        for name, (_, exe) in progs.items():
            if exe is not None:
                tag = "".join(c if c.isalnum() else "_" for c in f"{model.name}_{name}")
                with open(os.path.join(os.environ["PROBE_HLO_DIR"], f"{tag}.hlo.txt"), "w") as fh:
                    fh.write(exe.as_text())
    singles = _singles(f, model.argnums, sets[0], chosen.layouts) if os.environ.get("PROBE_SINGLES") != "0" else []
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak"]]
    rows += [[name, *ratio_cells(times.get(name), ref, exe, dots)] for name, (_, exe) in progs.items()]
    rows += singles
    kept = chosen_text(chosen)
    return f"## {model.label}  (max relative grad error {err:.1e}; chosen: {kept})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    probe_main(__doc__, "probe_order_subsets: the consume-first matmuls, one at a time and the largest",
               probe, argv)


if __name__ == "__main__":
    main()
