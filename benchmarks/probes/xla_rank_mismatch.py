"""A standalone reproducer of an XLA GPU compile failure, and whether jaxaot's programs meet it.

``jax.jit(jax.value_and_grad(block))`` of a small pre-norm transformer block
(parameter-free norms, 4-head attention, gelu MLP) at input shape (2, 8, 16)
fails to compile on NVIDIA GPUs with jax 0.11.2 (H100 and H200) with
``INVALID_ARGUMENT: Shapes must be equal rank, but are f32[16] and f32[2,8]``,
in the JVP of the norm's division. The same program compiles on the CPU.

Part one needs nothing but JAX: it compiles the block's gradient at several
shapes and matmul precisions and prints which compile, so the report upstream
can name the smallest failing case. Part two (``--jaxaot``) compiles jaxaot's
programs of the same block (split forward and backward, the fused step, byte
and fraction budgets) and prints, for each, "ok" or the typed error jaxaot
raises.

Usage (from the repository root): ``python -m benchmarks.probes.xla_rank_mismatch [--jaxaot]``
"""

from __future__ import annotations

import argparse
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np


def block(p, x, heads=4):
    """The block: the mean square of its output."""

    def norm(h):
        h = h - h.mean(-1, keepdims=True)
        return h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-5)

    b, t, d = x.shape
    q, k, v = jnp.split(norm(x) @ p["qkv"], 3, axis=-1)
    split = lambda z: z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    s = jnp.einsum("bhqd,bhkd->bhqk", split(q), split(k)) / np.sqrt(d // heads)
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), split(v)).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + a @ p["out"]
    x = x + jax.nn.gelu(norm(x) @ p["up"]) @ p["down"]
    return jnp.mean(x ** 2)


def norm_only(p, x):
    """The norm alone, to narrow the failure down."""
    h = x - x.mean(-1, keepdims=True)
    return jnp.mean((h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-5)) @ p["up"])


def args(batch, seq, width, seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    p = {"qkv": jax.random.normal(ks[0], (width, 3 * width)) / np.sqrt(width),
         "out": jax.random.normal(ks[1], (width, width)) / np.sqrt(width),
         "up": jax.random.normal(ks[2], (width, 4 * width)) / np.sqrt(width),
         "down": jax.random.normal(ks[3], (4 * width, width)) / np.sqrt(4 * width)}
    return p, jax.random.normal(ks[4], (batch, seq, width))


def outcome(thunk) -> str:
    try:
        jax.block_until_ready(thunk())
        return "ok"
    except Exception as e:  # noqa: BLE001  (the probe reports whatever fails)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:150]}"


def plain_jax() -> None:
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    for (name, fn), shape, precision in itertools.product(
            [("block", block), ("norm_only", norm_only)], [(2, 8, 16), (2, 8, 32), (4, 64, 128), (1, 8, 16)],
            ["default", "highest"]):
        with jax.default_matmul_precision(precision):
            got = outcome(lambda: jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))(*args(*shape)))
        print(f"{name:10s} {str(shape):14s} precision={precision:8s} {got}")


def jaxaot_programs() -> None:
    import jaxaot

    a = args(2, 8, 16)
    argnums = (0, 1)
    budgets = {"default": None, "min_cut": 1.0, "budget 0.5": 0.5, "budget 0": 0.0, "budget 64KiB": "64KiB"}
    for precision in ("default", "highest"):
        for name, budget in budgets.items():
            pf = (jaxaot.partition.default_partition if budget is None
                  else functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget))
            with jax.default_matmul_precision(precision):
                f = jaxaot.aot_function(block, partition_fn=pf)
                fused = outcome(lambda: jaxaot.value_and_grad(f, argnums=argnums)(*a))
                split = outcome(lambda: jaxaot.value_and_grad(f, argnums=argnums, fused=False)(*a))
            print(f"jaxaot {name:12s} precision={precision:8s} fused: {fused} | split: {split}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jaxaot", action="store_true", help="also compile jaxaot's programs of the block")
    opts = ap.parse_args()
    plain_jax()
    if opts.jaxaot:
        jaxaot_programs()


if __name__ == "__main__":
    main()
