"""Partitioner benchmark: jaxaot's min-cut against its default partition and plain JAX.

For each model of the zoo (a gelu MLP, one transformer block, a 12-layer
GPT-2-small-shaped model whose layers are stacked with ``lax.scan``, a ResNet
block with batch norm at batch 32 and, on the GPU, 256) it prints, side by side from one run:

* residual bytes (everything the forward hands the backward, inputs included),
* fwd+bwd step time: the median of single steps (each blocked on: latency), and
  "pipelined", steps dispatched back to back with one block at the end (how a
  training loop runs: the host's dispatch overlaps the device's work); the
  programs take turns over several rounds and each ratio is the median of the
  rounds' ratios, which cancels the drift of a shared machine,
* compiled peak memory (``memory_analysis()``; the larger of forward and
  backward for split programs),

each program cycling through ``INPUT_SETS`` input sets, as training steps see
new parameters (and new buffers) every step,

for jaxaot(min-cut) at memory_budget 1 and 0.95, jaxaot(default), ``jax.fwd_and_bwd``,
``jax.checkpoint(policy=dots_saveable)`` (split with ``fwd_and_bwd``) and the
fused ``jax.jit(jax.value_and_grad)``, with bytes as a ratio to
``jax.fwd_and_bwd`` and times as a ratio to the fused program.

Usage (from the repository root): ``python -m benchmarks.bench_partitioners [--small] [--out FILE] [--only NAME]``
(``--small``: CPU-sized models in f32; the default sizes are the GPU ones).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
from typing import Any, Callable

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot._src.cli import demo_models as examples

from benchmarks.harness import fmt_bytes, loop_time, median_time, peak_bytes, report, table, tree_nbytes


# --------------------------------------------------------------------------- resnet block
def resnet_init(key: jax.Array, *, channels: int, dtype: Any):
    ks = jax.random.split(key, 2)
    s = (9 * channels) ** -0.5
    conv = lambda k: (jax.random.normal(k, (3, 3, channels, channels)) * s).astype(dtype)  # noqa: E731
    bn = lambda: {"scale": jnp.ones(channels, dtype), "bias": jnp.zeros(channels, dtype)}  # noqa: E731
    return {"conv1": conv(ks[0]), "bn1": bn(), "conv2": conv(ks[1]), "bn2": bn()}


def _batch_norm(x, p):
    xf = x.astype(jnp.float32)
    mu = xf.mean((0, 1, 2))
    var = ((xf - mu) ** 2).mean((0, 1, 2))
    return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]).astype(x.dtype)


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def resnet_loss(p: Any, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(_batch_norm(_conv(x, p["conv1"]), p["bn1"]))
    h = _batch_norm(_conv(h, p["conv2"]), p["bn2"])
    return jnp.mean(jax.nn.relu(h + x).astype(jnp.float32) ** 2)


# --------------------------------------------------------------------------- zoo
# Sizes: (mlp width, depth, batch), (block batch, seq, width, heads), (gpt batch, seq, width, heads), resnet NHWC.
SIZES = {
    "small": dict(dtype=jnp.float32, mlp=(256, 4, 128), block=(2, 128, 128, 4), gpt=(2, 64, 64, 4),
                  resnet=((8, 16, 16, 32),)),
    "full": dict(dtype=jnp.bfloat16, mlp=(4096, 8, 1024), block=(8, 1024, 1024, 16), gpt=(8, 1024, 768, 12),
                 # batch 32: launch-bound on the GPU (0.4 ms); batch 256: a training batch for one H100.
                 resnet=((32, 56, 56, 64), (256, 56, 56, 64))),
}


def models(small: bool) -> dict[str, tuple[Callable, tuple]]:
    """name -> (loss, args) for the zoo, CPU-sized when ``small`` (the GPU sizes add a batch-256 ResNet)."""
    sz = SIZES["small" if small else "full"]
    dt, dname = sz["dtype"], jnp.dtype(sz["dtype"]).name
    key = jax.random.key(0)
    k1, k2 = jax.random.split(jax.random.key(1))
    width, depth, batch = sz["mlp"]
    bb, bt, bd, bh = sz["block"]
    gb, gt, gd, gh = sz["gpt"]
    zoo = {
        f"mlp-gelu ({depth}x{width}, batch {batch}, {dname})": (
            examples.mlp_loss, examples.mlp_init(key, width=width, depth=depth, batch=batch, dtype=dt)),
        f"transformer block ({bb}x{bt}x{bd}, {dname})": (
            lambda p, x: jnp.mean(examples.block_apply(p, x, bh).astype(jnp.float32) ** 2),
            (examples.block_init(key, width=bd, heads=bh, dtype=dt), jax.random.normal(k1, (bb, bt, bd), dt))),
        f"gpt 12 layers scanned ({gb}x{gt}x{gd}, {dname})": (
            lambda p, x: examples.gpt_loss(p, x, heads=gh),
            (examples.gpt_init(key, layers=12, width=gd, heads=gh, dtype=dt), jax.random.normal(k2, (gb, gt, gd), dt))),
    }
    for n, h, w, c in sz["resnet"]:
        zoo[f"resnet block + batch norm ({n}x{h}x{w}x{c}, {dname})"] = (
            resnet_loss, (resnet_init(key, channels=c, dtype=dt), jax.random.normal(k1, (n, h, w, c), dt)))
    return zoo


# --------------------------------------------------------------------------- methods
#: Input sets each program cycles through, step by step: a training step sees
#: new parameters every time (new buffers, which e.g. CUDA graphs must follow),
#: and one set would let caches and stable addresses flatter the programs.
INPUT_SETS = 3


def input_sets(args: tuple, n: int = INPUT_SETS) -> list[tuple]:
    """``args`` and ``n - 1`` perturbed copies (same shapes and dtypes, new buffers)."""
    sets = [args]
    for i in range(1, n):
        sets.append(jax.tree_util.tree_map(lambda a, i=i: a * (1 + 0.01 * i) if jnp.issubdtype(a.dtype, jnp.inexact)
                                           else a + 0, args))
    return sets


class Result:
    """One program of the comparison: ``run(args)`` is one fwd+bwd step on one input set."""

    def __init__(self, name: str, run: Callable[..., Any], sets: list[tuple], residual_bytes: int | None,
                 peak: int | None):
        self.name, self.run, self.residual_bytes, self.peak = name, run, residual_bytes, peak
        cycle = itertools.cycle(sets)
        self.step = lambda: run(*next(cycle))
        self.time: float | None = None
        self.pipelined: float | None = None
        self.time_ratio: float | None = None
        self.pipelined_ratio: float | None = None


def _max_peak(*compiled: Any) -> int | None:
    peaks = [p for p in (peak_bytes(c) for c in compiled) if p is not None]
    return max(peaks) if peaks else None


def jaxaot_method(name: str, loss: Callable, sets: list[tuple], partition_fn: Callable) -> Result:
    aot = jaxaot.aot_function(loss, partition_fn=partition_fn)
    low = aot.lower(*sets[0])
    one = jnp.ones((), jnp.float32)

    def run(*args):
        _, res = aot.forward(*args)
        return aot.backward(res, one)

    return Result(name, run, sets, low.saved_bytes, _max_peak(*(low.executables[k] for k in ("forward", "backward"))))


def split_method(name: str, loss: Callable, sets: list[tuple]) -> Result:
    args = sets[0]
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=tuple(range(len(args))))
    out, res = fwd(*args)
    ct = jnp.ones_like(out)

    def run(*args):
        _, r = fwd(*args)
        return bwd(r, ct)

    peak = _max_peak(fwd.lower(*args).compile(), bwd.lower(res, ct).compile())
    return Result(name, run, sets, tree_nbytes(res), peak)


def fused_method(loss: Callable, sets: list[tuple]) -> Result:
    fused = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(sets[0])))))
    return Result("jit(value_and_grad)", fused, sets, None, _max_peak(fused.lower(*sets[0]).compile()))


def methods(loss: Callable, args: tuple) -> list[Result]:
    ckpt = jax.checkpoint(loss, policy=jax.checkpoint_policies.dots_saveable)
    sets = input_sets(args)
    return [
        jaxaot_method("jaxaot (min-cut)", loss, sets, jaxaot.partition.min_cut_rematerialization_partition),
        jaxaot_method("jaxaot (min-cut, budget 0.95)", loss, sets,
                      functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.95)),
        jaxaot_method("jaxaot (default)", loss, sets, jaxaot.partition.default_partition),
        split_method("jax.fwd_and_bwd", loss, sets),
        split_method("checkpoint(dots_saveable)", ckpt, sets),
        fused_method(loss, sets),
    ]


def _grads(result: Result, args: tuple) -> list:
    out = result.run(*args)
    grads = out[1] if result.name == "jit(value_and_grad)" else out
    return [jnp.asarray(g, jnp.float32) for g in jax.tree_util.tree_leaves(grads)]


def check_grads(results: list[Result], name: str, args: tuple) -> None:
    ref = _grads(results[-1], args)
    for r in results[:-1]:
        for g, want in zip(_grads(r, args), ref):
            err = float(jnp.linalg.norm(g - want) / (jnp.linalg.norm(want) + 1e-30))
            if err > 2e-2:
                raise AssertionError(f"{name}: {r.name} gradients differ from the fused program's ({err:.2e})")


def time_interleaved(results: list[Result], *, rounds: int, iters: int) -> None:
    """Set each result's single-step and pipelined times, and their ratios to the last (fused) one.

    Programs take turns, round by round, so that drift of the machine (clocks,
    a noisy neighbour on a VM) hits every program alike; a ratio is the median
    over rounds of that round's ratio to the fused program.
    """
    single: dict[str, list[float]] = {r.name: [] for r in results}
    piped: dict[str, list[float]] = {r.name: [] for r in results}
    for r in results:
        median_time(r.step, warmup=3, iters=1)
    for _ in range(rounds):
        for r in results:
            single[r.name].append(median_time(r.step, warmup=0, iters=iters, min_seconds=0))
            # Back-to-back steps, one sync at the end: how a training loop runs (host work overlaps the GPU).
            piped[r.name].append(loop_time(r.step, n=max(iters, 10), repeats=1))
    fused = results[-1].name
    for r in results:
        r.time, r.pipelined = statistics.median(single[r.name]), statistics.median(piped[r.name])
        r.time_ratio = statistics.median(a / b for a, b in zip(single[r.name], single[fused]))
        r.pipelined_ratio = statistics.median(a / b for a, b in zip(piped[r.name], piped[fused]))


def bench_model(name: str, loss: Callable, args: tuple, *, iters: int, rounds: int) -> str:
    results = methods(loss, args)
    check_grads(results, name, args)
    time_interleaved(results, rounds=rounds, iters=iters)
    split = next(r for r in results if r.name == "jax.fwd_and_bwd")
    rows = []
    for r in results:
        ratio_b = "-" if r.residual_bytes is None else f"{r.residual_bytes / split.residual_bytes:.3f}"
        rows.append((r.name, fmt_bytes(r.residual_bytes), ratio_b, f"{r.time * 1e3:.3f}", f"{r.time_ratio:.3f}",
                     f"{r.pipelined * 1e3:.3f}", f"{r.pipelined_ratio:.3f}", fmt_bytes(r.peak)))
    head = ("program", "residuals", "x fwd_and_bwd", "step ms", "x fused", "pipelined ms", "x fused", "peak mem")
    return f"## {name}\n" + table([head, *rows])


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized models (f32)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--only", help="run only the models whose name contains this")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per program and round (median)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of interleaved timing (median of ratios)")
    a = ap.parse_args(argv)
    sections = (bench_model(name, loss, args, iters=a.iters, rounds=a.rounds)
                for name, (loss, args) in models(a.small).items() if not a.only or a.only in name)
    return report("bench_partitioners: min-cut vs default partition vs plain JAX", sections, a.out)

if __name__ == "__main__":
    main()
