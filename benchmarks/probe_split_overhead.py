"""Diagnostic: where the split step's time goes, against the fused program.

Not a benchmark of record: it explains bench_partitioners' step-time column.
For the ResNet block it times, interleaved round by round so that the VM's
drift hits every variant alike:

* the fused ``jit(value_and_grad)`` and the min-cut forward/backward pair, each
  compiled with several XLA option sets (command buffers / CUDA graphs), the
  pair both called raw and through ``aot.forward``/``aot.backward``;
* each step on the next of three input sets, as in training (new buffers);
* host dispatch time per step (the loop's time before its final block).

For the GPT and the transformer block it times min-cut at memory budgets 1 and
0.99 (the latter recomputes only the attention scores).

Usage: ``python benchmarks/probe_split_overhead.py [--small] [--out FILE]``
"""

from __future__ import annotations

import argparse
import functools
import itertools
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot import _compat as C
from jaxaot.partition import min_cut
from jaxaot.partition import split as P

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_partitioners as B  # noqa: E402
from harness import fmt_bytes, report, table  # noqa: E402

OPTION_SETS = {
    "default": {},
    "graphs_all": {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN",
                   "xla_gpu_graph_min_graph_size": 1},
    "no_cmdbuf": {"xla_gpu_enable_command_buffer": ""},
}


def compile_closed(closed, avals, opts):
    fn = jax.jit(lambda *a: C.eval_closed(closed, *a), keep_unused=True)
    return fn.lower(*avals).compile(compiler_options=opts or None)


def count_kernels(compiled) -> int:
    txt = compiled.as_text()
    entry = txt[txt.find("ENTRY"):]
    ops = ("fusion(", "custom-call(", "convolution(", "copy(", "dot(", "reduce(")
    return sum(1 for line in entry.splitlines() if " = " in line and any(o in line for o in ops))


def split_step(joint, saved_vars, sets, opts):
    """A step of the pair compiled with ``opts``, cycling through the input sets."""
    part = P.split_joint(joint, saved_vars)
    leaves_sets = [jax.tree_util.tree_leaves(a) for a in sets]
    leaves = leaves_sets[0]
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    fwd = compile_closed(part.forward, avals, opts)
    outs = fwd(*leaves)
    ct = jnp.ones_like(outs[0])
    bwd_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in
                 [ct] + [leaves[i] for i in part.saved_inputs] + [outs[j] for j in part.saved_outputs]]
    bwd = compile_closed(part.backward, bwd_avals, opts)
    cycle = itertools.cycle(leaves_sets)

    def step():
        lv = next(cycle)
        o = fwd(*lv)
        return bwd(ct, *[lv[i] for i in part.saved_inputs], *[o[j] for j in part.saved_outputs])

    return step, part, count_kernels(fwd) + count_kernels(bwd)


def one_step_times(steps: dict, rounds: int, per_round: int = 5) -> dict:
    """Median over rounds of the per-round median single-step time (blocked each call)."""
    for s in steps.values():
        for _ in range(3):
            jax.block_until_ready(s())
    acc = {k: [] for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            ts = []
            for _ in range(per_round):
                t = time.perf_counter()
                jax.block_until_ready(s())
                ts.append(time.perf_counter() - t)
            acc[k].append(statistics.median(ts))
    return {k: statistics.median(v) for k, v in acc.items()}


def pipelined_times(steps: dict, rounds: int, n: int = 50) -> tuple[dict, dict]:
    """(min over rounds of per-step time for n back-to-back steps, host dispatch time per step)."""
    best = {k: float("inf") for k in steps}
    host = {k: float("inf") for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            jax.block_until_ready(s())
            t = time.perf_counter()
            for _ in range(n):
                r = s()
            t1 = time.perf_counter()
            jax.block_until_ready(r)
            t2 = time.perf_counter()
            best[k] = min(best[k], (t2 - t) / n)
            host[k] = min(host[k], (t1 - t) / n)
    return best, host


def resnet_probe(small: bool, dump: str | None = None) -> str:
    name, (loss, args) = [(k, v) for k, v in B.models(small).items() if "resnet" in k][0]
    sets = B.input_sets(args)
    joint = jaxaot.trace_joint(loss, *args)
    saved = min_cut.choose_saved_values(joint)
    steps, kernels, saved_b = {}, {}, {}
    one = jnp.ones((), jnp.float32)
    for oname, opts in OPTION_SETS.items():
        try:
            fused = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile(compiler_options=opts or None)
        except Exception as e:  # an option this jaxlib lacks
            print(f"skip {oname}: {e}"[:200])
            continue
        cyc = itertools.cycle(sets)
        steps[f"fused [{oname}]"] = lambda fused=fused, cyc=cyc: fused(*next(cyc))
        kernels[f"fused [{oname}]"] = count_kernels(fused)
        s, part, k = split_step(joint, saved, sets, opts)
        steps[f"min-cut raw [{oname}]"] = s
        kernels[f"min-cut raw [{oname}]"] = k
        saved_b[f"min-cut raw [{oname}]"] = part.saved_bytes
        compiler = lambda closed, avals, opts=opts, **_: compile_closed(closed, avals, opts)  # noqa: E731
        aot = jaxaot.aot_function(loss, fw_compiler=compiler,
                                  partition_fn=jaxaot.min_cut_rematerialization_partition)
        cyc2 = itertools.cycle(sets)

        def via_runtime(aot=aot, cyc2=cyc2):
            _, res = aot.forward(*next(cyc2))
            return aot.backward(res, one)

        steps[f"min-cut via aot [{oname}]"] = via_runtime
        if oname == "default":
            fused_default, aot_default = fused, aot
    aot = aot_default
    _, res0 = aot.forward(*args)
    low = aot.lower(*args)
    fe, be = low.executables["forward"], low.executables["backward"]
    leaves = jax.tree_util.tree_leaves(args)
    steps["fwd only via aot"] = lambda: aot.forward(*args)
    steps["fwd only raw"] = lambda: fe(*leaves)
    steps["bwd only via aot"] = lambda: aot.backward(res0, one)
    steps["bwd only raw"] = lambda: be(one, *res0.arrays)
    if dump:
        pathlib.Path(dump).mkdir(parents=True, exist_ok=True)
        for nm, exe in (("fused", fused_default), ("forward", fe), ("backward", be)):
            pathlib.Path(dump, f"resnet_{nm}.hlo.txt").write_text(exe.as_text())
    single = one_step_times(steps, rounds=15)
    pipe, host = pipelined_times(steps, rounds=5)
    ref_s, ref_p = single["fused [default]"], pipe["fused [default]"]
    rows = [("variant", "kernels", "saved", "single ms", "x fused", "pipelined ms", "x fused", "host ms/step")]
    for k in steps:
        rows.append((k, kernels.get(k, "-"), fmt_bytes(saved_b.get(k)), f"{single[k]*1e3:.3f}",
                     f"{single[k]/ref_s:.3f}", f"{pipe[k]*1e3:.3f}", f"{pipe[k]/ref_p:.3f}", f"{host[k]*1e3:.3f}"))
    return f"## {name} (each step on the next of {len(sets)} input sets)\n" + table(rows)


def budget_probe(small: bool, which: str) -> str:
    name, (loss, args) = [(k, v) for k, v in B.models(small).items() if which in k][0]
    results = []
    sets = B.input_sets(args)
    for budget in (1.0, 0.99):
        r = B.jaxaot_method(f"min-cut {budget}", loss, sets,
                            functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=budget))
        results.append(r)
    split = B.split_method("jax.fwd_and_bwd", loss, sets)
    fused = B.fused_method(loss, sets)
    steps = {r.name: r.step for r in [*results, split, fused]}
    single = one_step_times(steps, rounds=7, per_round=3)
    pipe, _ = pipelined_times(steps, rounds=3, n=10)
    rows = [("variant", "residuals", "x fwd_and_bwd", "single ms", "x fused", "pipelined ms", "x fused")]
    for r in [*results, split, fused]:
        rb = "-" if r.residual_bytes is None else f"{r.residual_bytes / split.residual_bytes:.3f}"
        rows.append((r.name, fmt_bytes(r.residual_bytes), rb, f"{single[r.name]*1e3:.3f}",
                     f"{single[r.name]/single[fused.name]:.3f}", f"{pipe[r.name]*1e3:.3f}",
                     f"{pipe[r.name]/pipe[fused.name]:.3f}"))
    return f"## {name}\n" + table(rows)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--only", default="resnet,gpt,block")
    ap.add_argument("--dump", help="write the ResNet programs' optimized HLO here")
    a = ap.parse_args(argv)
    sections = (resnet_probe(a.small, a.dump) if which == "resnet" else budget_probe(a.small, which)
                for which in a.only.split(","))
    return report("probe_split_overhead: where the split step's time goes", sections, a.out)

if __name__ == "__main__":
    main()
