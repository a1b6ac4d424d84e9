"""Persistent compile cache benchmark: cold vs warm start of a GPT-shaped model.

Measures the time from ``jaxaot.aot_function(...)`` to the first gradient
(``jax.grad``, blocked on) in a fresh process, with an empty cache (cold) and
with the cache that process filled (warm). Every run is its own subprocess;
the parameters are built (and blocked on) before the clock starts. Also shows
where the time goes (trace, joint, partition, forward/backward compile — a
warm "compile" is loading the serialized executable) and the whole process's
wall time (Python and JAX imports included).

Usage (from the repository root): ``python -m benchmarks.bench_cache [--small] [--repeats N] [--out FILE]``
(``--small``: the CPU-sized model of bench_partitioners, 12 layers 2x64x64 f32;
default: 12 layers 8x1024x768 bf16, the GPU size). The target: a warm start 10x faster than a cold one.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {"small": dict(batch=2, seq=64, width=64, heads=4, dtype="float32"),
         "full": dict(batch=8, seq=1024, width=768, heads=12, dtype="bfloat16")}
PARTITIONERS = ("default", "min_cut")


# --------------------------------------------------------------------------- child
def child(size: str, partitioner: str) -> dict:
    """One process: build the model, then time aot_function -> first gradient."""
    import jax
    import jax.numpy as jnp

    import jaxaot
    from jaxaot._src.cli import demo_models as examples
    from jaxaot._src.compile import stats

    sz = SIZES[size]
    dtype = jnp.dtype(sz["dtype"])
    params = examples.gpt_init(jax.random.key(0), layers=12, width=sz["width"], heads=sz["heads"], dtype=dtype)
    x = jax.random.normal(jax.random.key(1), (sz["batch"], sz["seq"], sz["width"]), dtype)
    jax.block_until_ready((params, x))
    loss = functools.partial(examples.gpt_loss, heads=sz["heads"])
    partition_fn = {"default": jaxaot.partition.default_partition,
                    "min_cut": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5)}
    t = time.perf_counter()
    f = jaxaot.aot_function(loss, partition_fn=partition_fn[partitioner])
    grads = jax.block_until_ready(jax.grad(f)(params, x))
    seconds = time.perf_counter() - t
    times = dict(f.lookup((params, x), {}).programs.times)
    phase = lambda prefix: sum(v for k, v in times.items() if k.startswith(prefix))  # noqa: E731
    return {
        "first_grad_s": seconds,
        "trace_s": phase("trace") + phase("joint"),
        "partition_s": phase("partition"),
        "compile_fwd_s": phase("compile_forward"),
        "compile_bwd_s": phase("compile_backward"),
        "stats": stats().__dict__,
        "checksum": float(sum(jnp.sum(g.astype(jnp.float32)) for g in jax.tree_util.tree_leaves(grads))),
    }


# --------------------------------------------------------------------------- parent
def run_child(size: str, partitioner: str, cache_dir: str | None) -> dict:
    env = dict(os.environ)
    env.pop("JAXAOT_CACHE_DIR", None)
    if cache_dir is not None:
        env["JAXAOT_CACHE_DIR"] = cache_dir
    t = time.perf_counter()
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cache", "--child", size, partitioner], env=env,
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def measure(size: str, partitioner: str, repeats: int) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"off": [], "cold": [], "warm": []}
    for _ in range(repeats):
        runs["off"].append(run_child(size, partitioner, None))
        cache_dir = tempfile.mkdtemp(prefix="jaxaot-bench-cache-")
        try:
            runs["cold"].append(run_child(size, partitioner, cache_dir))
            runs["warm"].append(run_child(size, partitioner, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    # Cached executables must compute what fresh ones do; GPU reductions are not
    # bitwise deterministic across processes, so compare with a tolerance.
    checks = [r["checksum"] for rs in runs.values() for r in rs]
    if max(checks) - min(checks) > 1e-3 * max(abs(c) for c in checks):
        raise RuntimeError(f"gradients differ between runs: {checks}")
    return runs


def rows(partitioner: str, runs: dict[str, list[dict]]) -> list[list[str]]:
    med = lambda mode, k: statistics.median(r[k] for r in runs[mode])  # noqa: E731
    cold = med("cold", "first_grad_s")
    out = []
    for mode in ("off", "cold", "warm"):
        st = runs[mode][-1]["stats"]
        hits = f"{st['partition_hits']}/{st['executable_hits']}" if mode != "off" else "-"
        out.append([
            f"{partitioner} / {mode}",
            f"{med(mode, 'first_grad_s'):.3f}",
            f"{cold / med(mode, 'first_grad_s'):.1f}x",
            f"{med(mode, 'trace_s'):.3f}",
            f"{med(mode, 'partition_s'):.3f}",
            f"{med(mode, 'compile_fwd_s'):.3f}",
            f"{med(mode, 'compile_bwd_s'):.3f}",
            hits,
            f"{med(mode, 'process_s'):.2f}",
        ])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CPU-sized model (12 layers, 2x64x64, f32)")
    ap.add_argument("--repeats", type=int, default=3, help="processes per mode (medians are reported)")
    ap.add_argument("--partitioners", default=",".join(PARTITIONERS))
    ap.add_argument("--out", help="write the report here too (default: benchmarks/results/cache_<device>.txt)")
    ap.add_argument("--child", nargs=2, metavar=("SIZE", "PARTITIONER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return

    from benchmarks.harness import header, result_path, table

    size = "small" if args.small else "full"
    sz = SIZES[size]
    report = [header("bench_cache: persistent compile cache, cold vs warm start").rstrip(),
              f"# command: python -m benchmarks.bench_cache {' '.join(sys.argv[1:])}",
              f"# model: examples.gpt_loss, 12 layers scanned, {sz['batch']}x{sz['seq']}x{sz['width']} "
              f"{sz['dtype']}, {sz['heads']} heads; min_cut uses memory_budget=0.5",
              f"# each number: median of {args.repeats} fresh processes. first grad = aot_function(...) -> "
              "first jax.grad result (blocked on); speedup = cold / this",
              "# off = cache disabled; cold = empty cache; warm = the cache cold filled; "
              "hits = partition/executable cache hits; process = whole subprocess wall time incl. imports",
              ""]
    all_rows = [["partitioner / cache", "first grad s", "speedup", "trace+joint s", "partition s",
                 "fwd compile s", "bwd compile s", "hits", "process s"]]
    failures = []
    for partitioner in args.partitioners.split(","):
        try:
            all_rows += rows(partitioner, measure(size, partitioner, args.repeats))
        except RuntimeError as err:  # one partitioner failing must not lose the others' numbers
            lines = str(err).strip().splitlines()
            last = next((ln for ln in reversed(lines) if re.match(r"\w+(Error|Exception)\b", ln)), lines[-1])
            failures.append(f"# {partitioner}: FAILED: {last}")
            all_rows.append([f"{partitioner} / -", "failed", *["-"] * 7])
    report.append(table(all_rows))
    report += failures
    text = "\n".join(report) + "\n"
    print(text)
    out = args.out or result_path("cache")
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out).write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
