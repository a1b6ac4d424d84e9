"""Probe: where a fused min-cut step's peak memory and time come from, on the GPU.

For each zoo model, the fused step at min-cut budget 1 in several variants, against
``jit(value_and_grad)`` and ``jit(value_and_grad(checkpoint(dots_saveable)))``:

* ``barrier all`` / ``recomputed`` / ``none``: which residuals pass ``optimization_barrier``;
* ``reductions recomputable``: the cost model's large-reduction rule off, so the
  min-cut recomputes softmax/norm statistics from their saved inputs, as the
  ``dots_saveable`` policy does (does saving them raise the backward's peak?);
* ``row-major residuals``: every residual pinned to the layout it has between two
  executables (XLA otherwise picks layouts for the whole step, and transposes);
* the split executables (``fused=False``): time, and each executable's peak.

Prints peak bytes (XLA's memory analysis), temporaries, and median step time over
interleaved rounds as a ratio to ``jit(value_and_grad)``.

Usage: python benchmarks/probe_fused_peak.py MODEL [MODEL ...] [--rounds 9]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from typing import Any

import jax

import jaxaot
from jaxaot.partition import cost_model

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import _barrier, jax_references, measure, ratio_cells  # noqa: E402
from harness import fmt_bytes, report, table  # noqa: E402
from models import zoo  # noqa: E402


#: The reductions the cost model may class expensive (a large one is a full extra pass).
REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod argmax argmin".split())


@contextlib.contextmanager
def reductions_cheap(names: frozenset = REDUCTIONS):
    """While it is open, the cost model classes the reductions ``names`` cheap (recomputable)."""
    real = cost_model.classify

    def classify(eqn):
        return cost_model.Recompute.CHEAP if eqn.primitive.name in names else real(eqn)

    cost_model.classify = classify
    try:
        yield
    finally:
        cost_model.classify = real


def min_cut_reductions_cheap(joint: Any, names: frozenset = REDUCTIONS) -> Any:
    """The min-cut at budget 1 with the reductions ``names`` recomputable."""
    with reductions_cheap(names):
        return jaxaot.min_cut_rematerialization_partition(joint, memory_budget=1.0)


def programs(model: Any, args: tuple, full: bool = True) -> dict[str, tuple[Any, Any]]:
    loss, nums = model.loss, model.argnums
    out = jax_references(model, args)
    mc = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=1.0)
    for barrier in ("all", "recomputed", "none") if full else ("all", "none"):
        out[f"min-cut 1, barrier {barrier}"] = _barrier(jaxaot.aot_function(loss, partition_fn=mc), nums, args,
                                                       barrier)
    out["min-cut 1, barrier all, row-major residuals"] = _barrier(
        jaxaot.aot_function(loss, partition_fn=mc), nums, args, "all", layouts="pinned")
    out["default partition, recomputed (the default)"] = _barrier(jaxaot.aot_function(loss), nums, args, "recomputed")
    out["default partition, recomputed, row-major residuals"] = _barrier(
        jaxaot.aot_function(loss), nums, args, "recomputed", layouts="pinned")
    cheap = jaxaot.aot_function(loss, partition_fn=min_cut_reductions_cheap)
    out["min-cut 1, reductions recomputable"] = _barrier(cheap, nums, args, "all")
    if full:
        out["min-cut 1, reductions recomputable, recomputed"] = _barrier(cheap, nums, args, "recomputed")
    f = jaxaot.aot_function(loss, partition_fn=mc)
    split = jaxaot.value_and_grad(f, argnums=nums, fused=False)
    split(*args)
    out["split min-cut 1"] = (split, None)
    exes = f.lookup(args, {}).programs.executables
    for name, exe in exes.items():
        out[f"  split executable {name}"] = (None, exe)
    for name, low in (("min-cut 1", f), ("reductions recomputable", cheap)):
        print(f"# {name}: saves {low.lower(*args).saved_bytes / 2**20:.1f} MiB")
    return out


def probe(model: Any, rounds: int, iters: int, full: bool = True) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    progs = programs(model, sets[0], full)
    err, times, ref, dots = measure(progs, model, sets, rounds, iters)
    rows = [["program", "x jit(v&g)", "(min-max)", "peak", "x dots peak", "temporaries"]]
    for name, (_, exe) in progs.items():
        temp = exe.memory_analysis().temp_size_in_bytes if exe is not None else None
        rows.append([name, *ratio_cells(times.get(name), ref, exe, dots), fmt_bytes(temp)])
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--brief", action="store_true", help="leave out the barrier-on-recomputed variants")
    a = ap.parse_args(argv)
    models = zoo("small" if a.small else "gpu")
    report("probe_fused_peak: fused min-cut variants, peak and time",
           (probe(models[m], a.rounds, a.iters, not a.brief) for m in a.models), a.out)


if __name__ == "__main__":
    main()
