"""Persistent compile cache benchmark: cold vs warm start of a GPT-shaped model.

Measures the time from ``jaxaot.aot_function(...)`` to the first gradient
(``jax.grad``, blocked on; with ``--step value_and_grad``, ``jaxaot.value_and_grad``'s
fused step, whose variants and fused-or-split choice an accelerator weighs over the calls
after the first, which the process then makes until the choice is kept, as training would)
in a fresh process, with an empty cache (cold) and with the cache that process filled (warm). Every run is its own subprocess;
the parameters are built (and blocked on) and jaxaot's runtime, which loads on
first use, is imported before the clock starts, as ``jax.jit`` is with jax. Also shows
where the time goes (trace, joint, partition, forward/backward compile — a
warm "compile" is loading the serialized executable) and the whole process's
wall time (Python and JAX imports included).

The peer is ``jax.jit(jax.grad(loss))`` (``jax.jit(jax.value_and_grad(loss))``) with JAX's own persistent compilation
cache in the same folder (``jit`` rows); each jaxaot row's last column is its
first gradient over ``jit``'s in the same cache state. ``min_cut_bytes`` plans
a byte budget halfway between the compiled peaks of the min-cut's fraction 0
and fraction 1 plans (found once, in a process of its own, before the runs).

Usage (from the repository root): ``python -m benchmarks.bench_cache [--small] [--repeats N] [--step S] [--out FILE]``
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
PARTITIONERS = ("jit", "default", "min_cut", "min_cut_bytes")


# --------------------------------------------------------------------------- child
def _model(size: str):
    """``(loss, params, x)`` of the GPT at ``size``, its arrays built and blocked on."""
    import jax
    import jax.numpy as jnp

    from jaxaot._src.cli import demo_models as examples

    sz = SIZES[size]
    dtype = jnp.dtype(sz["dtype"])
    params = examples.gpt_init(jax.random.key(0), layers=12, width=sz["width"], heads=sz["heads"], dtype=dtype)
    x = jax.random.normal(jax.random.key(1), (sz["batch"], sz["seq"], sz["width"]), dtype)
    jax.block_until_ready((params, x))
    return functools.partial(examples.gpt_loss, heads=sz["heads"]), params, x


def middle_budget(size: str) -> int:
    """Bytes halfway between the compiled peaks of the min-cut's fraction 0 and fraction 1 plans."""
    import jaxaot
    from jaxaot._src.partition.budget import fused_step, program_peak

    loss, params, x = _model(size)
    joint = jaxaot.partition.trace_joint(loss, params, x)
    top, bottom = (program_peak(fused_step(jaxaot.partition.min_cut_rematerialization_partition(
        joint, memory_budget=b), joint), joint.in_avals, exact=True) for b in (1.0, 0.0))
    return (top + bottom) // 2


def child(size: str, partitioner: str, budget: int | None = None, step: str = "grad") -> dict:
    """One process: build the model, then time aot_function (or ``jit``) -> first gradient (``step``: ``"grad"``,
    ``jax.grad``'s split programs, or ``"value_and_grad"``, ``jaxaot.value_and_grad``'s fused step)."""
    import jax
    import jax.numpy as jnp

    import jaxaot
    from jaxaot._src.compile import stats

    loss, params, x = _model(size)
    cache_dir = os.environ.get("JAXAOT_CACHE_DIR")
    if partitioner == "jit":
        if cache_dir is not None:  # JAX's own persistent cache, every compile kept
            jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir, "jax"))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        t = time.perf_counter()
        grads = jax.block_until_ready(jax.jit(getattr(jax, step)(loss))(params, x))
        seconds = time.perf_counter() - t
        times: dict = {}
    else:
        partition_fn = {
            "default": jaxaot.partition.default_partition,
            "min_cut": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5),
            "min_cut_bytes": functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
                                               memory_budget=budget),
        }[partitioner]
        from benchmarks.harness import weighing

        aot_function = jaxaot.aot_function  # imports the runtime (the whole process's time counts it)
        t = time.perf_counter()
        f = aot_function(loss, partition_fn=partition_fn)
        run = (jax.grad if step == "grad" else jaxaot.value_and_grad)(f)
        grads = jax.block_until_ready(run(params, x))
        seconds = time.perf_counter() - t
        while weighing(f) and time.perf_counter() - t < 300:
            jax.block_until_ready(run(params, x))  # as training goes on: the calls that follow choose, and it is kept
        times = dict(f.lookup((params, x), {}).programs.times)
    phase = lambda prefix: sum(v for k, v in times.items() if k.startswith(prefix))  # noqa: E731
    return {
        "first_grad_s": seconds,
        "trace_s": phase("trace") + phase("joint"),
        "partition_s": phase("partition"),
        "compile_fwd_s": phase("compile_forward") + phase("compile_fused"),  # the fused step counts as forward
        "compile_bwd_s": phase("compile_backward"),
        "stats": stats().__dict__,
        "checksum": float(sum(jnp.sum(g.astype(jnp.float32)) for g in jax.tree_util.tree_leaves(grads))),
    }


# --------------------------------------------------------------------------- parent
def run_child(size: str, partitioner: str, cache_dir: str | None, budget: int | None = None,
              step: str = "grad") -> dict:
    env = dict(os.environ)
    env.pop("JAXAOT_CACHE_DIR", None)
    if cache_dir is not None:
        env["JAXAOT_CACHE_DIR"] = cache_dir
    t = time.perf_counter()
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cache", "--child", size, partitioner,
                           "--budget", str(budget), "--step", step], env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


MODES = ("off", "cold", "warm")


def measure(size: str, partitioners: list[str], repeats: int, budget: int | None, step: str = "grad"
            ) -> tuple[dict[str, dict[str, list[dict]]], dict[str, str]]:
    """Per partitioner, per mode, the runs (the partitioners round robin within each repeat, so that ``jit``
    and jaxaot meet the same machine load), and per partitioner that failed, why."""
    runs: dict[str, dict[str, list[dict]]] = {p: {m: [] for m in MODES} for p in partitioners}
    failed: dict[str, str] = {}
    for _ in range(repeats):
        for p in partitioners:
            if p in failed:
                continue
            cache_dir = tempfile.mkdtemp(prefix="jaxaot-bench-cache-")
            try:
                runs[p]["off"].append(run_child(size, p, None, budget, step))
                runs[p]["cold"].append(run_child(size, p, cache_dir, budget, step))
                runs[p]["warm"].append(run_child(size, p, cache_dir, budget, step))
            except RuntimeError as err:  # one partitioner failing must not lose the others' numbers
                failed[p] = str(err)
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
    for p, rs in runs.items():
        # Cached executables must compute what fresh ones do; GPU reductions are not
        # bitwise deterministic across processes, so compare with a tolerance.
        checks = [r["checksum"] for mode in rs.values() for r in mode]
        if p not in failed and max(checks) - min(checks) > 1e-3 * max(abs(c) for c in checks):
            failed[p] = f"RuntimeError: gradients differ between runs: {checks}"
    return {p: rs for p, rs in runs.items() if p not in failed}, failed


def rows(partitioner: str, runs: dict[str, list[dict]], jit: dict[str, list[dict]] | None) -> list[list[str]]:
    med = lambda mode, k, rs=runs: statistics.median(r[k] for r in rs[mode])  # noqa: E731
    cold = med("cold", "first_grad_s")
    out = []
    for mode in MODES:
        st = runs[mode][-1]["stats"]
        hits = f"{st['partition_hits']}/{st['executable_hits']}" if mode != "off" and partitioner != "jit" else "-"
        spread = f"{min(r['first_grad_s'] for r in runs[mode]):.3f}-{max(r['first_grad_s'] for r in runs[mode]):.3f}"
        vs_jit = f"{med(mode, 'first_grad_s') / med(mode, 'first_grad_s', jit):.2f}x" if jit else "-"
        out.append([
            f"{partitioner} / {mode}",
            f"{med(mode, 'first_grad_s'):.3f}",
            spread,
            f"{cold / med(mode, 'first_grad_s'):.1f}x",
            f"{med(mode, 'trace_s'):.3f}",
            f"{med(mode, 'partition_s'):.3f}",
            f"{med(mode, 'compile_fwd_s'):.3f}",
            f"{med(mode, 'compile_bwd_s'):.3f}",
            hits,
            f"{med(mode, 'process_s'):.2f}",
            vs_jit,
        ])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CPU-sized model (12 layers, 2x64x64, f32)")
    ap.add_argument("--repeats", type=int, default=3, help="processes per mode (medians are reported)")
    ap.add_argument("--partitioners", default=",".join(PARTITIONERS))
    ap.add_argument("--step", choices=("grad", "value_and_grad"), default="grad",
                    help="jax.grad's split programs, or jaxaot.value_and_grad's fused step (jit: value_and_grad)")
    ap.add_argument("--out", help="write the report here too (default: benchmarks/results/cache_<device>.txt; "
                    "cache_fused_<device>.txt for --step value_and_grad)")
    ap.add_argument("--child", nargs=2, metavar=("SIZE", "PARTITIONER"), help=argparse.SUPPRESS)
    ap.add_argument("--budget", help=argparse.SUPPRESS)
    ap.add_argument("--middle-budget", metavar="SIZE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, budget=None if args.budget in (None, "None") else int(args.budget),
                               step=args.step)))
        return
    if args.middle_budget:
        print(middle_budget(args.middle_budget))
        return

    from benchmarks.harness import header, result_path, table

    size = "small" if args.small else "full"
    sz = SIZES[size]
    step_name = "jax.grad" if args.step == "grad" else "jaxaot.value_and_grad (jit: jax.value_and_grad)"
    partitioners = args.partitioners.split(",")
    budget = None
    if "min_cut_bytes" in partitioners:
        root = str(pathlib.Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        env.pop("JAXAOT_CACHE_DIR", None)
        found = subprocess.run([sys.executable, "-m", "benchmarks.bench_cache", "--middle-budget", size], env=env,
                               capture_output=True, text=True, timeout=1800, check=True)
        budget = int(found.stdout.strip().splitlines()[-1])
    report = [header("bench_cache: persistent compile cache, cold vs warm start").rstrip(),
              f"# command: python -m benchmarks.bench_cache {' '.join(sys.argv[1:])}",
              f"# model: examples.gpt_loss, 12 layers scanned, {sz['batch']}x{sz['seq']}x{sz['width']} "
              f"{sz['dtype']}, {sz['heads']} heads; min_cut uses memory_budget=0.5"
              + (f", min_cut_bytes memory_budget={budget} bytes" if budget is not None else ""),
              f"# each number: median of {args.repeats} fresh processes (spread: min-max), the partitioners round "
              f"robin. first grad = aot_function(...) (or jax.jit) -> first {step_name} result (blocked on); "
              "speedup = cold / this; x jit = this / jit's first grad in the same cache state",
              "# off = cache disabled; cold = empty cache; warm = the cache cold filled (jit: JAX's own "
              "persistent compilation cache); hits = partition/executable cache hits; process = whole subprocess "
              "wall time incl. imports",
              ""]
    all_rows = [["partitioner / cache", "first grad s", "spread", "speedup", "trace+joint s", "partition s",
                 "fwd compile s", "bwd compile s", "hits", "process s", "x jit"]]
    runs, failed = measure(size, partitioners, args.repeats, budget, args.step)
    failures = []
    for partitioner in partitioners:
        if partitioner in failed:
            lines = failed[partitioner].strip().splitlines()
            last = next((ln for ln in reversed(lines) if re.match(r"\w+(Error|Exception)\b", ln)), lines[-1])
            failures.append(f"# {partitioner}: FAILED: {last}")
            all_rows.append([f"{partitioner} / -", "failed", *["-"] * 9])
        else:
            all_rows += rows(partitioner, runs[partitioner], runs.get("jit"))
    report.append(table(all_rows))
    report += failures
    text = "\n".join(report) + "\n"
    print(text)
    out = args.out or result_path("cache" if args.step == "grad" else "cache_fused")
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out).write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
