"""Core benchmark: jaxaot's default partition against plain JAX's split and fused programs.

For an MLP and a transformer block it prints residual bytes and median step time
(forward + backward) of

* jaxaot (default partition): ``jaxaot.value_and_grad(aot_fn)``, i.e. the compiled
  forward then the compiled backward executable, differentiating the parameters;
* ``jax.fwd_and_bwd``: JAX's own split, compiled;
* ``jax.jit(jax.value_and_grad(f))``: the fused program (no residuals cross a boundary);

as ratios to ``jax.fwd_and_bwd``, measured in one run. Then it measures per-call
overhead on a tiny function: the inference path against ``jax.jit``, and eager
gradients (``jax.value_and_grad(aot_fn)`` and ``jaxaot.value_and_grad(aot_fn)``)
against eager ``jax.value_and_grad(jax.jit(f))``.

Usage (from the repository root): ``python -m benchmarks.bench_core [--small] [--out FILE]``
(``--small``: CPU-sized models, f32).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot._src.cli import demo_models as examples
from jaxaot._src.compare import time_rounds

from benchmarks.harness import fmt_bytes, header, median_time, table, tree_nbytes


def models(small: bool):
    key = jax.random.key(0)
    if small:
        mlp = examples.mlp_init(key, width=256, depth=4, batch=128)
        blk = examples.block_init(key, width=128, heads=4, dtype=jnp.float32)
        x = jax.random.normal(jax.random.key(1), (2, 128, 128), jnp.float32)
        return {
            "mlp (4x256, f32)": (examples.mlp_loss, mlp),
            "transformer block (2x128x128, f32)": (lambda p, x: examples.block_loss(p, x), (blk, x)),
        }
    mlp = examples.mlp_init(key, width=4096, depth=8, batch=1024, dtype=jnp.bfloat16)
    blk = examples.block_init(key, width=1024, heads=16, dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (8, 1024, 1024), jnp.bfloat16)
    return {
        "mlp (8x4096, batch 1024, bf16)": (examples.mlp_loss, mlp),
        "transformer block (8x1024x1024, bf16)": (examples.block_loss, (blk, x)),
    }


def check_close(a, b, name):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
        err = float(jnp.linalg.norm(x - y) / (jnp.linalg.norm(y) + 1e-30))
        if err > 2e-2:
            raise AssertionError(f"{name}: gradients differ from JAX's (relative error {err:.2e})")


def bench_model(name, loss, args):
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=(0,))
    one = jnp.ones((), jnp.float32)

    def jax_split():
        out, res = fwd(*args)
        return bwd(res, one)

    fused = jax.jit(jax.value_and_grad(loss))
    aot = jaxaot.aot_function(loss)
    aot_vg = jaxaot.value_and_grad(aot)  # runs aot's forward then backward executable
    low = aot_vg.lower(*args)

    def aot_split():
        return aot_vg(*args)

    check_close(aot_split()[1], fused(*args)[1], name)
    _, res = fwd(*args)
    t_jax = median_time(jax_split)
    t_fused = median_time(lambda: fused(*args))
    t_aot = median_time(aot_split)
    b_jax = tree_nbytes(res)
    rows = [
        ("jaxaot (default)", fmt_bytes(low.saved_bytes), f"{low.saved_bytes / b_jax:.2f}", f"{t_aot * 1e3:.3f}",
         f"{t_aot / t_jax:.2f}"),
        ("jax.fwd_and_bwd", fmt_bytes(b_jax), "1.00", f"{t_jax * 1e3:.3f}", "1.00"),
        ("jit(value_and_grad)", "-", "-", f"{t_fused * 1e3:.3f}", f"{t_fused / t_jax:.2f}"),
    ]
    return f"## {name}\n" + table([("program", "residuals", "x fwd_and_bwd", "step ms", "x fwd_and_bwd"), *rows])


def bench_overhead(rounds: int = 7):
    """Per-call overheads on a tiny function, each program timed in interleaved rounds (median [fastest..slowest
    round]): the inference call, a loaded artifact's call, and the eager gradients."""
    f = lambda x, y: jnp.sum(jnp.sin(x) * y)  # noqa: E731
    x, y = jnp.ones(16), jnp.ones(16)
    aot = jaxaot.aot_function(f)
    loaded = jaxaot.export.load(jaxaot.export.export(f, x, y))
    jf, exported = jax.jit(f), jax.export.export(jax.jit(f))(x, y)
    calls = time_rounds({"jax.jit(f)(x)": lambda: jf(x, y), "inference: aot_fn(x)": lambda: aot(x, y),
                         "loaded artifact: jaxaot.export.load(...)(x)": lambda: loaded(x, y),
                         "jax.export's Exported.call(x)": lambda: exported.call(x, y)}, rounds=rounds, calls=2000)
    vg_jit, vg_aot_jax, vg_aot = jax.value_and_grad(jax.jit(f)), jax.value_and_grad(aot), jaxaot.value_and_grad(aot)
    grads = time_rounds({"jaxaot.value_and_grad(aot_fn)": lambda: vg_aot(x, y),
                         "jax.value_and_grad(aot_fn)": lambda: vg_aot_jax(x, y),
                         "jax.value_and_grad(jax.jit(f))": lambda: vg_jit(x, y)}, rounds=rounds, calls=200)
    every = {**calls, **grads}
    med = {k: statistics.median(v) for k, v in every.items()}
    spread = lambda k: f"[{min(every[k]) * 1e6:.1f}..{max(every[k]) * 1e6:.1f}]"  # noqa: E731
    jit, vg = med["jax.jit(f)(x)"], med["jax.value_and_grad(jax.jit(f))"]
    goals = {"inference: aot_fn(x)": "<= 2x", "jaxaot.value_and_grad(aot_fn)": ">= 5x"}
    rows = [(k, f"{t * 1e6:.1f} {spread(k)}", f"{t / jit:.2f} x jax.jit" if k in calls else f"{vg / t:.1f}x faster",
             goals.get(k, "")) for k, t in med.items()]
    return (f"## per-call overhead, tiny function (16 floats; {rounds} interleaved rounds, median [fastest..slowest])\n"
            + table([("call", "us/call", "ratio", "goal"), *rows]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized models")
    ap.add_argument("--out", help="also write the report to this file")
    a = ap.parse_args(argv)
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    parts = [header("bench_core: jaxaot default partition vs plain JAX")]
    for name, (loss, args) in models(a.small).items():
        parts.append(bench_model(name, loss, args))
        print(parts[-1], flush=True)
    parts.append(bench_overhead())
    print(parts[-1])
    report = "\n\n".join(parts) + "\n"
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(report)
    return report


if __name__ == "__main__":
    main()
