"""Diagnostic: where the split step's time goes, against the fused program.

Not a benchmark of record: it explains bench_partitioners' step-time column.
For the ResNet block it times, interleaved round by round so that the VM's
drift hits every variant alike:

* the fused ``jit(value_and_grad)`` and the min-cut forward/backward pair, each
  compiled with several XLA option sets (command buffers / CUDA graphs);
* the pair called through ``aot.forward``/``aot.backward`` and called raw;
* host dispatch time per step (the loop's time before its final block).

For the GPT and the transformer block it times min-cut at memory budgets 1 and
0.99 (the latter recomputes only the attention scores).

Usage: ``python benchmarks/probe_split_overhead.py [--small] [--out FILE]``
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot import _compat as C
from jaxaot import min_cut, partition as P

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_partitioners as B  # noqa: E402
from harness import fmt_bytes, header, table  # noqa: E402

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


def split_step(joint, saved_vars, args, opts):
    part = P.split_joint(joint, saved_vars)
    leaves = jax.tree_util.tree_leaves(args)
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    fwd = compile_closed(part.forward, avals, opts)
    outs = fwd(*leaves)
    ct = jnp.ones_like(outs[0])
    bwd_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in
                 [ct] + [leaves[i] for i in part.saved_inputs] + [outs[j] for j in part.saved_outputs]]
    bwd = compile_closed(part.backward, bwd_avals, opts)

    def step():
        o = fwd(*leaves)
        return bwd(ct, *[leaves[i] for i in part.saved_inputs], *[o[j] for j in part.saved_outputs])

    return step, part, count_kernels(fwd) + count_kernels(bwd)


def materialized_extras(joint) -> list:
    """Forward values read by a matmul/conv in both the forward and the backward."""
    jaxpr = C.jaxpr_of(joint.jaxpr)
    heavy = {"dot_general", "conv_general_dilated"}
    fwd_reads, bwd_reads = set(), set()
    prims = set(jaxpr.invars[: joint.num_primals])
    for e, k in zip(jaxpr.eqns, P.classify_eqns(joint)):
        if e.primitive.name not in heavy:
            continue
        vs = {v for v in e.invars if not C.is_literal(v)} - prims
        (fwd_reads if k is P.EqnKind.FORWARD else bwd_reads).update(vs)
    return sorted(fwd_reads & bwd_reads, key=str)


def tiny_extras(joint, saved) -> list:
    """Recomputed forward values under 1/1024 of the largest forward value's bytes."""
    part = P.split_joint(joint, saved)
    jaxpr = C.jaxpr_of(joint.jaxpr)
    kinds = P.classify_eqns(joint)
    sizes = [P.aval_nbytes(v.aval) for e, k in zip(jaxpr.eqns, kinds) if k is P.EqnKind.FORWARD for v in e.outvars]
    limit = max(sizes) / 1024
    recomputed = set(map(id, part.recomputed._eqns))
    return [v for e in jaxpr.eqns if id(e) in recomputed for v in e.outvars if P.aval_nbytes(v.aval) < limit]


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
    joint = jaxaot.trace_joint(loss, *args)
    saved = min_cut.choose_saved_values(joint)
    extras = materialized_extras(joint)
    steps, kernels, saved_b = {}, {}, {}
    for oname, opts in OPTION_SETS.items():
        try:
            fused = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile(compiler_options=opts or None)
        except Exception as e:  # an option this jaxlib lacks
            print(f"skip {oname}: {e}"[:200])
            continue
        steps[f"fused [{oname}]"] = functools.partial(fused, *args)
        if oname == "default":
            fused_default = fused
        kernels[f"fused [{oname}]"] = count_kernels(fused)
        for pname, sv in (("min-cut", saved), ("min-cut+tiny", list(saved) + tiny_extras(joint, saved))):
            s, part, k = split_step(joint, sv, args, opts)
            steps[f"{pname} raw [{oname}]"] = s
            kernels[f"{pname} raw [{oname}]"] = k
            saved_b[f"{pname} raw [{oname}]"] = part.saved_bytes
    aot = jaxaot.aot_function(loss, partition_fn=jaxaot.min_cut_rematerialization_partition)
    one = jnp.ones((), jnp.float32)

    def via_runtime():
        _, res = aot.forward(*args)
        return aot.backward(res, one)

    steps["min-cut via aot.forward/backward [default]"] = via_runtime
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
        import cProfile, io, pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            via_runtime()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        pathlib.Path(dump, "resnet_runtime_profile.txt").write_text(buf.getvalue())
    single = one_step_times(steps, rounds=15)
    pipe, host = pipelined_times(steps, rounds=5)
    ref_s, ref_p = single["fused [default]"], pipe["fused [default]"]
    rows = [("variant", "kernels", "saved", "single ms", "x fused", "pipelined ms", "x fused", "host ms/step")]
    for k in steps:
        rows.append((k, kernels.get(k, "-"), fmt_bytes(saved_b.get(k)), f"{single[k]*1e3:.3f}",
                     f"{single[k]/ref_s:.3f}", f"{pipe[k]*1e3:.3f}", f"{pipe[k]/ref_p:.3f}", f"{host[k]*1e3:.3f}"))
    extras_s = ", ".join(f"{v.aval.str_short()}" for v in extras)
    return f"## {name}\nmaterialized extras: {extras_s}\n" + table(rows)


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
    ap.add_argument("--dump", help="write the ResNet programs' HLO and a runtime profile here")
    a = ap.parse_args(argv)
    parts = [header("probe_split_overhead: where the split step's time goes")]
    print(parts[0], flush=True)
    for which in a.only.split(","):
        parts.append(resnet_probe(a.small, a.dump) if which == "resnet" else budget_probe(a.small, which))
        print(parts[-1] + "\n", flush=True)
    report = "\n\n".join(parts) + "\n"
    if a.out:
        pathlib.Path(a.out).write_text(report)
    return report


if __name__ == "__main__":
    main()
