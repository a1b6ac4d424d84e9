"""Probe: the optimized HLO of a model's fused and split steps, to see what XLA does differently.

For each zoo model it compiles ``jit(value_and_grad)``, ``jit(value_and_grad(checkpoint(dots_saveable)))``,
the fused min-cut step (budget 1, every residual behind the barrier), the same with the
cost model's large-reduction rule off, and the split min-cut forward and backward; it writes each
optimized HLO to ``OUTDIR/<model>_<program>.hlo.txt`` and prints a kernel census per program:
fusions by kind, GEMM/cuDNN custom calls, copies and transposes outside fusions, and the largest
buffers XLA's memory analysis reports.

Usage: python benchmarks/probe_fused_hlo.py OUTDIR MODEL [MODEL ...]
"""

from __future__ import annotations

import collections
import functools
import pathlib
import re
import sys
from typing import Any

import jax

import jaxaot
from jaxaot import _compat as C
from jaxaot.runtime.fused import fused_program

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_fused import jax_references  # noqa: E402
from harness import fmt_bytes, peak_bytes  # noqa: E402
from models import zoo  # noqa: E402
from probe_fused_peak import min_cut_reductions_cheap  # noqa: E402


def census(hlo: str) -> str:
    """Counts of the entry computation's kernels by kind."""
    entry = hlo[hlo.rfind("ENTRY "):]
    kinds: collections.Counter = collections.Counter()
    for line in entry.splitlines():
        m = re.search(r"= \S+ (\w[\w-]*)\(", line)
        if not m:
            continue
        op = m.group(1)
        if op == "fusion":
            k = re.search(r"kind=(\w+)", line)
            op = f"fusion:{k.group(1) if k else '?'}"
        elif op == "custom-call":
            t = re.search(r'custom_call_target="([^"]+)"', line)
            op = f"custom-call:{t.group(1) if t else '?'}"
        kinds[op] += 1
    keep = {k: v for k, v in kinds.items() if k not in ("parameter", "get-tuple-element", "tuple", "constant",
                                                       "bitcast")}
    return ", ".join(f"{k} {v}" for k, v in sorted(keep.items(), key=lambda kv: -kv[1]))


def compiled_programs(model: Any, args: tuple) -> dict[str, Any]:
    loss, nums = model.loss, model.argnums
    refs = jax_references(model, args)
    out = {"jit_vg": refs["jit(value_and_grad)"][1], "jit_dots": refs["jit(dots_saveable)"][1]}
    mask_nums = (nums,) if isinstance(nums, int) else tuple(nums)
    mc = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=1.0)
    for name, pf in (("fused_mincut", mc), ("fused_mincut_reductions_cheap", min_cut_reductions_cheap)):
        f = jaxaot.aot_function(loss, partition_fn=pf)
        programs, leaves, _ = f.lookup(args, {})
        mask = [i in mask_nums for i, a in enumerate(args) for _ in jax.tree.leaves(a)]
        closed = fused_program(programs.training(tuple(mask)), barrier="all")
        out[name] = jax.jit(lambda *xs, closed=closed: C.eval_closed(closed, *xs)).lower(*leaves).compile()
    f = jaxaot.aot_function(loss, partition_fn=mc)
    jaxaot.value_and_grad(f, argnums=nums, fused=False)(*args)
    for name, exe in f.lookup(args, {}).programs.executables.items():
        out["split_" + name.split("[")[0]] = exe.executable
    return out


def main(argv: list[str]) -> None:
    outdir = pathlib.Path(argv[0])
    outdir.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        model = zoo("gpu")[name]
        args = model.make_args(jax.random.key(0))
        print(f"## {model.label}")
        for prog, exe in compiled_programs(model, args).items():
            hlo = exe.as_text()
            (outdir / f"{name}_{prog}.hlo.txt").write_text(hlo)
            ma = exe.memory_analysis()
            print(f"{prog:32s} peak {fmt_bytes(peak_bytes(exe)):>10s}  temp {fmt_bytes(ma.temp_size_in_bytes):>10s}"
                  f"  {census(hlo)}")


if __name__ == "__main__":
    main(sys.argv[1:])
