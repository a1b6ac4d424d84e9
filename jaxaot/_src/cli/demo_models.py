"""Small reference models used by ``jaxaot demo``, the benchmarks and the notebooks.

Plain JAX: a parameter pytree, an ``init`` and a ``loss``. Nothing here is
needed to use jaxaot.

Example:
    >>> import jax, jaxaot
    >>> from jaxaot._src.cli import demo_models as examples
    >>> params, batch = examples.mlp_init(jax.random.key(0), width=16, depth=2, batch=4)
    >>> float(examples.mlp_loss(params, batch)) > 0
    True
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def mlp_init(key: jax.Array, *, width: int = 256, depth: int = 4, batch: int = 64, dtype: Any = jnp.float32):
    """Parameters and a (x, y) batch for a gelu MLP regression."""
    keys = jax.random.split(key, depth + 2)
    params = [
        {"w": jax.random.normal(k, (width, width), dtype) / jnp.sqrt(width).astype(dtype), "b": jnp.zeros(width, dtype)}
        for k in keys[:depth]
    ]
    x = jax.random.normal(keys[-2], (batch, width), dtype)
    y = jax.random.normal(keys[-1], (batch, width), dtype)
    return params, (x, y)


def mlp_loss(params: Any, batch: Any) -> jax.Array:
    """Mean squared error of the MLP on ``batch = (x, y)``."""
    x, y = batch
    for layer in params:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return jnp.mean((x - y).astype(jnp.float32) ** 2)


def mlp_example_args() -> tuple[Any, Any]:
    """Small example arguments of :func:`mlp_loss`: ``(params, (x, y))``, width 16, 2 layers, batch 4.

    What ``jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --args jaxaot._src.cli.demo_models:mlp_example_args``
    traces with.
    """
    return mlp_init(jax.random.key(0), width=16, depth=2, batch=4)


def tanh_loss(w: jax.Array, x: jax.Array) -> jax.Array:
    """``mean(tanh(x @ w) ** 2)``: the README's Quickstart loss, two plain array arguments."""
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _layer_norm(x, scale, bias):
    xf = x.astype(jnp.float32)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    return (((xf - mu) * jax.lax.rsqrt(var + 1e-5)) * scale + bias).astype(x.dtype)


def block_init(key: jax.Array, *, width: int = 1024, heads: int = 16, dtype: Any = jnp.bfloat16):
    """Parameters of one pre-LN transformer block (attention + 4x gelu MLP)."""
    ks = jax.random.split(key, 4)
    s = 1.0 / jnp.sqrt(width)
    return {
        "ln1": {"scale": jnp.ones(width, dtype), "bias": jnp.zeros(width, dtype)},
        "qkv": (jax.random.normal(ks[0], (width, 3 * width)) * s).astype(dtype),
        "proj": (jax.random.normal(ks[1], (width, width)) * s).astype(dtype),
        "ln2": {"scale": jnp.ones(width, dtype), "bias": jnp.zeros(width, dtype)},
        "fc1": (jax.random.normal(ks[2], (width, 4 * width)) * s).astype(dtype),
        "fc2": (jax.random.normal(ks[3], (4 * width, width)) * s / 2).astype(dtype),
    }


def block_apply(p: Any, x: jax.Array, heads: int = 16) -> jax.Array:
    b, t, d = x.shape
    h = _layer_norm(x, p["ln1"]["scale"], p["ln1"]["bias"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, heads, d // heads) for a in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads).astype(x.dtype)
    mask = jnp.tril(jnp.ones((t, t), bool))
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
    o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d)
    x = x + o @ p["proj"]
    h = _layer_norm(x, p["ln2"]["scale"], p["ln2"]["bias"])
    return x + jax.nn.gelu(h @ p["fc1"]) @ p["fc2"]


def block_loss(p: Any, x: jax.Array) -> jax.Array:
    return jnp.mean(block_apply(p, x).astype(jnp.float32) ** 2)


def gpt_init(key: jax.Array, *, layers: int = 12, width: int = 768, heads: int = 12, dtype: Any = jnp.bfloat16):
    """A stack of ``layers`` blocks with leading layer axis (for ``lax.scan``)."""
    keys = jax.random.split(key, layers)
    blocks = [block_init(k, width=width, heads=heads, dtype=dtype) for k in keys]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *blocks)


def gpt_loss(stacked: Any, x: jax.Array, heads: int = 12) -> jax.Array:
    def layer(h, p):
        return block_apply(p, h, heads), None

    h, _ = jax.lax.scan(layer, x, stacked)
    return jnp.mean(h.astype(jnp.float32) ** 2)
