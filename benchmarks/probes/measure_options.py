"""Which XLA options make a planner's measuring compile cheaper and keep the compiled peak, on this backend.

For each option set (each in a fresh process, so no autotuning result of another set is reused),
it compiles the fused step of the min-cut plan at budget 0 (``fused_step``, the program a byte
budget's search measures) and ``jit(value_and_grad)`` of each model, and prints the compile's
seconds and the compiled peak; the table gives each set's seconds and peak against the defaults'.
A set is usable by ``MEASURE_OPTIONS`` only where every peak equals the default's (or lies a few
bytes above it, never below).

Usage (from the repository root)::

    python -m benchmarks.probes.measure_options [--size gpu] [--models llama_scanned postln_relu_block]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SETS = {
    "default": {},
    "autotune 0": {"xla_gpu_autotune_level": 0},
    "backend opt 0": {"xla_backend_optimization_level": 0},
    "autotune 0 + backend opt 0": {"xla_gpu_autotune_level": 0, "xla_backend_optimization_level": 0},
    "+ no expensive LLVM passes": {"xla_gpu_autotune_level": 0, "xla_backend_optimization_level": 0,
                                   "xla_llvm_disable_expensive_passes": True},
    "both at once (threads)": {},  # the defaults, a model's two programs compiled in two threads (the pair's wall time)
}


def child(label: str, size: str, models: list[str]) -> None:
    import jax  # noqa: PLC0415 - each set in its own process
    import jaxaot  # noqa: PLC0415
    from jaxaot._src import compat as C  # noqa: PLC0415
    from jaxaot._src.partition import compiled_peak  # noqa: PLC0415
    from jaxaot._src.partition.budget.step_peak import fused_step  # noqa: PLC0415
    from benchmarks.bench_budget import all_models  # noqa: PLC0415

    options = SETS[label]
    for name in models:
        model = all_models(size)[name]
        args = model.make_args(jax.random.key(0))
        joint = jaxaot.partition.trace_joint(model.loss, *args)
        closed = fused_step(jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.0), joint)
        programs = {"fused step, budget 0": jax.jit(lambda *a: C.eval_closed(closed, *a), keep_unused=True)
                    .lower(*joint.in_avals),
                    "jit(value_and_grad)": jax.jit(jax.value_and_grad(model.loss, argnums=model.argnums)).lower(*args)}
        if label == "both at once (threads)":
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
            t = time.perf_counter()
            with ThreadPoolExecutor(len(programs)) as pool:
                exes = list(pool.map(lambda lw: lw.compile(), programs.values()))
            wall = time.perf_counter() - t
            for what, exe in zip(programs, exes):
                print(json.dumps({"model": name, "program": what, "seconds": wall, "peak": compiled_peak(exe)}),
                      flush=True)
            continue
        for what, lowered in programs.items():
            t = time.perf_counter()
            try:
                exe = lowered.compile(compiler_options=options) if options else lowered.compile()
                peak = compiled_peak(exe)
            except Exception as err:  # noqa: BLE001 - an option this XLA does not know
                print(json.dumps({"model": name, "program": what, "error": str(err).splitlines()[0][:200]}), flush=True)
                continue
            print(json.dumps({"model": name, "program": what, "seconds": time.perf_counter() - t, "peak": peak}),
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--models", nargs="*", default=["llama_scanned", "postln_relu_block"])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.size, a.models)
        return
    results = {}
    for label in SETS:
        cmd = [sys.executable, "-m", "benchmarks.probes.measure_options", "--child", label, "--size", a.size,
               "--models", *a.models]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
        rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode:
            print(f"# {label}: exit {r.returncode}: {r.stderr[-800:]}", flush=True)
        results[label] = {(x["model"], x["program"]): x for x in rows}
    base = results["default"]
    print(f"{'options':30s} {'model':20s} {'program':22s} {'compile s':>9s} {'x default':>9s} {'peak B':>12s} {'- default':>10s}")
    for label, rows in results.items():
        for key, x in rows.items():
            if "error" in x:
                print(f"{label:30s} {key[0]:20s} {key[1]:22s} error: {x['error']}")
                continue
            b = base.get(key, {})
            ratio = x["seconds"] / b["seconds"] if b.get("seconds") else float("nan")
            delta = x["peak"] - b["peak"] if b.get("peak") is not None and x["peak"] is not None else None
            print(f"{label:30s} {key[0]:20s} {key[1]:22s} {x['seconds']:9.2f} {ratio:9.2f} {x['peak']!s:>12s} {delta!s:>10s}")


if __name__ == "__main__":
    main()
