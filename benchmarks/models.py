"""The model zoo of the planner benchmark and of ``tests/partition/test_zoo_budgets.py``.

Plain JAX, public APIs only. Each model is a :class:`Model`: a ``loss(params,
*batch)`` returning a float32 scalar and a ``make_args(key)`` drawing fresh
random parameters and a fresh batch, at one of three sizes:

* ``"tiny"``: a few hundred parameters, for the CPU tests (float32, except the
  models that are bf16 by design);
* ``"small"``: CPU benchmark sizes (float32, the bf16 models stay bf16);
* ``"gpu"``: one H100's training-sized shapes, all bf16 (the 16-head GPT-2 block,
  ``issue_block``, is batch 8, seq 1024, width 1024).

Models: a Llama block (RMSNorm, rotary embeddings, causal grouped-query
attention, SwiGLU), GPT-2 blocks with float32 softmax and loss on bf16
activations (2, 8 and 16 heads), a top-2
mixture-of-experts MLP with static-shaped one-hot dispatch, a ViT block, a
ConvNet with train-mode batch norm, a GRU by ``lax.scan``, the 12-layer GPT
stacked with ``lax.scan`` and the pre-LN transformer block of
:mod:`jaxaot._src.cli.demo_models` (the last two reused from there).

Example:
    >>> import jax
    >>> m = zoo("tiny")["llama_block"]
    >>> float(m.loss(*m.make_args(jax.random.key(0)))) > 0
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src.cli import demo_models as demo

SIZES = ("tiny", "small", "gpu")


@dataclasses.dataclass(frozen=True)
class Model:
    """One zoo entry.

    Attributes:
      name: short identifier (``--only`` matches it).
      label: name with shapes and dtype, for reports.
      loss: ``loss(params, *batch) -> float32 scalar``.
      make_args: ``make_args(key) -> (params, *batch)``, fresh random values per key.
      argnums: the positional arguments to differentiate (the floating ones;
        integer labels are not differentiated).
      dtype: the activation dtype.
      per_layer: ``per_layer(wrap) -> loss``: the same loss with each layer passed through ``wrap``
        (the ``lax.scan``'s step, each stage, or the block beneath the loss head), as users place
        ``jax.checkpoint(layer, policy=...)``: ``per_layer(functools.partial(jax.checkpoint,
        policy=...))``. None where the model has no layer to wrap.
    """

    name: str
    label: str
    loss: Callable[..., jax.Array]
    make_args: Callable[[jax.Array], tuple]
    argnums: tuple[int, ...]
    dtype: Any
    per_layer: Callable[[Callable], Callable[..., jax.Array]] | None = None

    def __iter__(self):
        """Unpacks as ``(loss, make_args)``, the shape of ``tests/zoo.py``'s entries."""
        return iter((self.loss, self.make_args))


# --------------------------------------------------------------------------- helpers
def mean_square(y: jax.Array) -> jax.Array:
    """``mean(y**2)`` in float32: the loss head of the blocks without a vocabulary."""
    return jnp.mean(y.astype(jnp.float32) ** 2)


def _same(f: Callable) -> Callable:
    return f


class Draw:
    """Random arrays drawn by numpy from a generator seeded with a JAX key.

    A fresh key gives fresh values, as ``jax.random`` would, without an XLA
    compile per shape and dtype (on a 2-core CPU those compiles cost more than
    the tests that use the arrays).
    """

    def __init__(self, key: jax.Array):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        self.rng = np.random.default_rng([int(v) for v in np.asarray(key).ravel()])

    def normal(self, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> jax.Array:
        """Normal values times ``scale``, in ``dtype``."""
        return jnp.asarray((self.rng.standard_normal(shape, np.float32) * np.float32(scale)).astype(dtype))

    def dense(self, shape: tuple[int, ...], dtype: Any, fan_in: int | None = None, scale: float = 1.0) -> jax.Array:
        """Weights scaled by ``scale / sqrt(fan_in)`` (fan_in: the first axis by default)."""
        fan_in = shape[0] if fan_in is None else fan_in
        return self.normal(shape, dtype, scale / math.sqrt(fan_in))

    def near_one(self, n: int | tuple[int, ...], dtype: Any) -> jax.Array:
        """Norm scales near 1, random so that their gradients are not all alike."""
        return jnp.asarray((1.0 + 0.1 * self.rng.standard_normal(n, np.float32)).astype(dtype))

    def small(self, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        """Biases and embeddings: small random values."""
        return self.normal(shape, dtype, 0.1)

    def labels(self, shape: tuple[int, ...], classes: int) -> jax.Array:
        """Integer labels in ``[0, classes)``."""
        return jnp.asarray(self.rng.integers(0, classes, shape, dtype=np.int32))

    def like(self, shapes: Any) -> Any:
        """Parameters shaped like ``shapes`` (a pytree of ``jax.ShapeDtypeStruct``, e.g. an
        ``eval_shape`` of :mod:`jaxaot._src.cli.demo_models`' inits): leaves named ``scale`` near 1,
        ``bias`` small, matrices (stacked or not) scaled by ``1/sqrt(shape[-2])``."""

        def leaf(path, s):
            name = jax.tree_util.keystr(path)
            if name.endswith("['scale']"):
                return self.near_one(s.shape, s.dtype)
            if name.endswith("['bias']") or len(s.shape) < 2:
                return self.small(s.shape, s.dtype)
            return self.dense(s.shape, s.dtype, fan_in=s.shape[-2])

        return jax.tree_util.tree_map_with_path(leaf, shapes)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMSNorm, statistics in float32, result in ``x.dtype``."""
    xf = x.astype(jnp.float32)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm, statistics in at least float32 (float64 stays float64), result in ``x.dtype``."""
    wide = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(wide)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    y = (xf - mu) * lax.rsqrt(var + eps) * scale.astype(wide) + bias.astype(wide)
    return y.astype(x.dtype)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy, computed in float32 whatever the logits' dtype."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = True) -> jax.Array:
    """Multi-head attention ``(b, t, h, d)`` -> ``(b, t, h, d)``, softmax in float32."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.asarray(math.sqrt(q.shape[-1]), q.dtype)
    if causal:
        t = q.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, jnp.finfo(s.dtype).min)
    a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", a, v)


# --------------------------------------------------------------------------- Llama block
def rotary(x: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding of ``x: (b, t, heads, d)`` (d even), rotating halves."""
    t, d = x.shape[1], x.shape[-1]
    freqs = base ** (-jnp.arange(0, d // 2, dtype=jnp.float32) / (d // 2))
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]  # (t, d/2)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def llama_block_loss(p: dict, x: jax.Array, *, q_heads: int, kv_heads: int, wrap: Callable = _same) -> jax.Array:
    """One Llama block (RMSNorm, rotary, causal GQA, SwiGLU) passed through ``wrap``; loss ``mean(y**2)``
    in float32."""
    block = wrap(lambda p, x: llama_block_apply(p, x, q_heads=q_heads, kv_heads=kv_heads))
    return mean_square(block(p, x))


def llama_block_apply(p: dict, x: jax.Array, *, q_heads: int, kv_heads: int) -> jax.Array:
    """One Llama block: RMSNorm, rotary, causal grouped-query attention, SwiGLU."""
    b, t, d = x.shape
    hd = d // q_heads
    g = q_heads // kv_heads
    h = rms_norm(x, p["attn_norm"])
    q = rotary((h @ p["wq"]).reshape(b, t, q_heads, hd))
    k = rotary((h @ p["wk"]).reshape(b, t, kv_heads, hd))
    v = (h @ p["wv"]).reshape(b, t, kv_heads, hd)
    q = q.reshape(b, t, kv_heads, g, hd)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q, k) / jnp.asarray(math.sqrt(hd), x.dtype)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, jnp.finfo(s.dtype).min)
    a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", a, v).reshape(b, t, d)
    x = x + o @ p["wo"]
    h = rms_norm(x, p["mlp_norm"])
    return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def llama_block(batch: int, seq: int, width: int, hidden: int, q_heads: int, kv_heads: int, dtype: Any) -> Model:
    """:func:`llama_block_loss` on ``(batch, seq, width)`` activations, SwiGLU width ``hidden``."""
    hd = width // q_heads

    def make_args(key):
        r = Draw(key)
        p = {
            "attn_norm": r.near_one(width, dtype),
            "wq": r.dense((width, q_heads * hd), dtype),
            "wk": r.dense((width, kv_heads * hd), dtype),
            "wv": r.dense((width, kv_heads * hd), dtype),
            "wo": r.dense((q_heads * hd, width), dtype),
            "mlp_norm": r.near_one(width, dtype),
            "w_gate": r.dense((width, hidden), dtype),
            "w_up": r.dense((width, hidden), dtype),
            "w_down": r.dense((hidden, width), dtype, scale=0.5),
        }
        return p, r.normal((batch, seq, width), dtype)

    def per_layer(wrap):
        return lambda p, x: llama_block_loss(p, x, q_heads=q_heads, kv_heads=kv_heads, wrap=wrap)

    label = f"llama block GQA {q_heads}q/{kv_heads}kv ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("llama_block", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- GPT-2 block
def gpt2_block_apply(p: dict, x: jax.Array, heads: int) -> jax.Array:
    """A GPT-2 block: pre-LN, biased projections, causal attention with a float32 softmax, gelu MLP."""
    b, t, d = x.shape
    h = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    q, k, v = jnp.split(h @ p["attn_w"] + p["attn_b"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, heads, d // heads) for a in (q, k, v))
    o = causal_attention(q, k, v).reshape(b, t, d)
    x = x + o @ p["proj_w"] + p["proj_b"]
    h = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    h = jax.nn.gelu(h @ p["fc_w"] + p["fc_b"], approximate=True)
    return x + h @ p["out_w"] + p["out_b"]


def gpt2_block_loss(p: dict, x: jax.Array, labels: jax.Array | None = None, *, heads: int,
                    wrap: Callable = _same) -> jax.Array:
    """The block (passed through ``wrap``), then (with labels) a final LN, a vocabulary head and float32
    cross-entropy; without labels ``mean(y**2)`` in float32."""
    y = wrap(lambda p, x: gpt2_block_apply(p, x, heads))(p, x)
    if labels is None:
        return mean_square(y)
    y = layer_norm(y, p["lnf_scale"], p["lnf_bias"])
    return cross_entropy(y @ p["head"], labels)


def gpt2_block(batch: int, seq: int, width: int, heads: int, vocab: int | None, dtype: Any,
               name: str | None = None) -> Model:
    """:func:`gpt2_block_loss`; ``vocab=None``: the block alone, loss ``mean(y**2)`` in float32."""
    def make_args(key):
        r = Draw(key)
        p = {
            "ln1_scale": r.near_one(width, dtype), "ln1_bias": r.small((width,), dtype),
            "attn_w": r.dense((width, 3 * width), dtype), "attn_b": r.small((3 * width,), dtype),
            "proj_w": r.dense((width, width), dtype), "proj_b": r.small((width,), dtype),
            "ln2_scale": r.near_one(width, dtype), "ln2_bias": r.small((width,), dtype),
            "fc_w": r.dense((width, 4 * width), dtype), "fc_b": r.small((4 * width,), dtype),
            "out_w": r.dense((4 * width, width), dtype, scale=0.5), "out_b": r.small((width,), dtype),
        }
        x = r.normal((batch, seq, width), dtype)
        if vocab is None:
            return p, x
        p.update(lnf_scale=r.near_one(width, dtype), lnf_bias=r.small((width,), dtype),
                 head=r.dense((width, vocab), dtype))
        return p, x, r.labels((batch, seq), vocab)

    def per_layer(wrap):
        if vocab is None:
            return lambda p, x: gpt2_block_loss(p, x, heads=heads, wrap=wrap)
        return lambda p, x, labels: gpt2_block_loss(p, x, labels, heads=heads, wrap=wrap)

    head = "mse loss" if vocab is None else f"vocab {vocab} f32 cross-entropy"
    label = f"gpt-2 block {heads} heads, {head} ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model(name or f"gpt2_block_{heads}h", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- top-2 MoE
def moe_mlp_loss(p: dict, x: jax.Array, *, group: int, capacity: int, aux_weight: float = 0.01,
                 wrap: Callable = _same) -> jax.Array:
    """Top-2 mixture-of-experts MLP, GShard-style one-hot dispatch with a fixed expert capacity.

    Tokens are split into groups of ``group``; in each, every token picks two
    experts from a float32 router softmax (gates renormalised over the two)
    and a token past an expert's ``capacity`` (per group) is dropped for that
    expert. Dispatch and combine are one-hot ``einsum``s, so every shape is
    static. Loss: ``mean((x + moe(rmsnorm(x)))**2)`` plus the load-balancing term; ``wrap`` wraps the
    layer (all but the loss).
    """
    y, aux = wrap(lambda p, x: _moe_layer(p, x, group, capacity))(p, x)
    return jnp.mean(y.astype(jnp.float32) ** 2) + aux_weight * aux


def _moe_layer(p: dict, x: jax.Array, group: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """``(x + moe(rmsnorm(x)), the load-balancing term)``."""
    b, t, d = x.shape
    n_exp = p["router"].shape[-1]
    tok = rms_norm(x, p["norm"]).reshape(b * t // group, group, d)  # (G, S, d)
    probs = jax.nn.softmax((tok @ p["router"]).astype(jnp.float32), axis=-1)  # (G, S, E)
    gate_vals, idx = lax.top_k(probs, 2)
    gate_vals = gate_vals / gate_vals.sum(-1, keepdims=True)
    masks = jax.nn.one_hot(idx, n_exp, dtype=jnp.int32)  # (G, S, 2, E)
    first, second = masks[:, :, 0], masks[:, :, 1]
    pos1 = jnp.cumsum(first, axis=1) - first  # slot of each token in its first expert
    pos2 = jnp.cumsum(second, axis=1) - second + first.sum(1, keepdims=True)  # after all first choices
    combine = jnp.zeros((*tok.shape[:2], n_exp, capacity), jnp.float32)
    for mask, pos, gate in ((first, pos1, gate_vals[..., 0]), (second, pos2, gate_vals[..., 1])):
        slot = (pos * mask).sum(-1)  # (G, S)
        keep = slot < capacity
        onehot = jax.nn.one_hot(jnp.where(keep, slot, capacity), capacity, dtype=jnp.float32)  # dropped: all zero
        combine = combine + (gate[..., None] * mask.astype(jnp.float32))[..., None] * onehot[:, :, None, :]
    dispatch = (combine > 0).astype(x.dtype)  # (G, S, E, C)
    expert_in = jnp.einsum("gsec,gsd->gecd", dispatch, tok)
    h = jax.nn.gelu(jnp.einsum("gecd,edf->gecf", expert_in, p["w1"]))
    expert_out = jnp.einsum("gecf,efd->gecd", h, p["w2"])
    y = jnp.einsum("gsec,gecd->gsd", combine.astype(x.dtype), expert_out).reshape(b, t, d)
    aux = n_exp * jnp.sum(probs.mean((0, 1)) * first.astype(jnp.float32).mean((0, 1)))
    return x + y, aux


def moe_mlp(batch: int, seq: int, width: int, hidden: int, experts: int, group: int, dtype: Any,
            capacity_factor: float = 1.25) -> Model:
    """:func:`moe_mlp_loss` with ``experts`` experts of width ``hidden``, token groups of ``group``,
    capacity ``capacity_factor * 2 * group / experts`` per group."""
    assert (batch * seq) % group == 0, (batch, seq, group)
    capacity = max(1, int(math.ceil(capacity_factor * 2 * group / experts)))

    def make_args(key):
        r = Draw(key)
        p = {
            "norm": r.near_one(width, dtype),
            "router": r.dense((width, experts), dtype),
            "w1": r.dense((experts, width, hidden), dtype, fan_in=width),
            "w2": r.dense((experts, hidden, width), dtype, fan_in=hidden, scale=0.5),
        }
        return p, r.normal((batch, seq, width), dtype)

    def per_layer(wrap):
        return lambda p, x: moe_mlp_loss(p, x, group=group, capacity=capacity, wrap=wrap)

    label = (f"moe top-2 of {experts} experts, groups of {group}, capacity {capacity} ({batch}x{seq}x{width}, "
             f"{jnp.dtype(dtype).name})")
    return Model("moe_top2", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- ViT block
def vit_block_loss(p: dict, images: jax.Array, labels: jax.Array, *, patch: int, heads: int,
                   wrap: Callable = _same) -> jax.Array:
    """Patch embedding (reshape + dense), class token, one pre-LN block with a gelu MLP (passed through
    ``wrap``), head, cross-entropy."""
    b, hh, ww, c = images.shape
    d = p["patch_w"].shape[-1]
    x = images.reshape(b, hh // patch, patch, ww // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, (hh // patch) * (ww // patch), patch * patch * c) @ p["patch_w"] + p["patch_b"]
    x = jnp.concatenate([jnp.broadcast_to(p["cls"], (b, 1, d)), x], axis=1) + p["pos"]
    x = wrap(lambda p, x: _vit_block(p, x, heads))(p, x)
    cls = layer_norm(x[:, 0], p["lnf_scale"], p["lnf_bias"])
    return cross_entropy(cls @ p["head"], labels)


def _vit_block(p: dict, x: jax.Array, heads: int) -> jax.Array:
    """The ViT's pre-LN block: non-causal attention, a gelu MLP."""
    b, t, d = x.shape
    h = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
    q, k, v = (a.reshape(b, t, heads, d // heads) for a in jnp.split(h @ p["qkv"], 3, axis=-1))
    x = x + causal_attention(q, k, v, causal=False).reshape(b, t, d) @ p["proj"]
    h = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + jax.nn.gelu(h @ p["fc1"] + p["fc1_b"]) @ p["fc2"]


def vit_block(batch: int, image: int, channels: int, patch: int, width: int, heads: int, classes: int,
              dtype: Any) -> Model:
    """:func:`vit_block_loss` on ``(batch, image, image, channels)`` images, ``classes`` labels."""
    tokens = (image // patch) ** 2 + 1

    def make_args(key):
        r = Draw(key)
        p = {
            "patch_w": r.dense((patch * patch * channels, width), dtype),
            "patch_b": r.small((width,), dtype),
            "cls": r.small((1, 1, width), dtype),
            "pos": r.small((tokens, width), dtype),
            "ln1_scale": r.near_one(width, dtype), "ln1_bias": r.small((width,), dtype),
            "qkv": r.dense((width, 3 * width), dtype),
            "proj": r.dense((width, width), dtype),
            "ln2_scale": r.near_one(width, dtype), "ln2_bias": r.small((width,), dtype),
            "fc1": r.dense((width, 4 * width), dtype), "fc1_b": r.small((4 * width,), dtype),
            "fc2": r.dense((4 * width, width), dtype, scale=0.5),
            "lnf_scale": r.near_one(width, dtype), "lnf_bias": r.small((width,), dtype),
            "head": r.dense((width, classes), dtype),
        }
        images = r.normal((batch, image, image, channels), dtype)
        return p, images, r.labels((batch,), classes)

    def per_layer(wrap):
        return lambda p, images, labels: vit_block_loss(p, images, labels, patch=patch, heads=heads, wrap=wrap)

    label = (f"vit block, {tokens} tokens of {patch}x{patch} patches ({batch}x{image}x{image}x{channels}, "
             f"width {width}, {jnp.dtype(dtype).name})")
    return Model("vit_block", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- ConvNet + batch norm
def _conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def batch_norm_train(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Batch norm in training mode: this batch's statistics over N, H, W, in float32."""
    xf = x.astype(jnp.float32)
    mu = xf.mean((0, 1, 2))
    var = ((xf - mu) ** 2).mean((0, 1, 2))
    return ((xf - mu) * lax.rsqrt(var + eps) * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def convnet_bn_loss(p: dict, images: jax.Array, labels: jax.Array, wrap: Callable = _same) -> jax.Array:
    """Three 3x3 conv + batch norm + relu stages (the second strided; each passed through ``wrap``), global
    average pool, dense, cross-entropy."""
    x = images
    for i, stride in enumerate((1, 2, 1)):
        stage = wrap(lambda w, scale, bias, x, stride=stride: jax.nn.relu(
            batch_norm_train(_conv(x, w, stride), scale, bias)))
        x = stage(p[f"conv{i}"], p[f"bn{i}_scale"], p[f"bn{i}_bias"], x)
    pooled = x.astype(jnp.float32).mean((1, 2)).astype(x.dtype)
    return cross_entropy(pooled @ p["head"], labels)


def convnet_bn(batch: int, image: int, channels: int, width: int, classes: int, dtype: Any) -> Model:
    """:func:`convnet_bn_loss`, channels ``width``, ``2*width``, ``2*width``."""
    chans = (channels, width, 2 * width, 2 * width)

    def make_args(key):
        r = Draw(key)
        p = {}
        for i in range(3):
            p[f"conv{i}"] = r.dense((3, 3, chans[i], chans[i + 1]), dtype, fan_in=9 * chans[i])
            p[f"bn{i}_scale"] = r.near_one(chans[i + 1], dtype)
            p[f"bn{i}_bias"] = r.small((chans[i + 1],), dtype)
        p["head"] = r.dense((chans[-1], classes), dtype)
        images = r.normal((batch, image, image, channels), dtype)
        return p, images, r.labels((batch,), classes)

    def per_layer(wrap):
        return lambda p, images, labels: convnet_bn_loss(p, images, labels, wrap=wrap)

    label = f"convnet + batch norm ({batch}x{image}x{image}x{channels}, width {width}, {jnp.dtype(dtype).name})"
    return Model("convnet_bn", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- GRU by lax.scan
def gru_scan_loss(p: dict, xs: jax.Array, targets: jax.Array, wrap: Callable = _same) -> jax.Array:
    """A GRU over ``xs: (time, batch, features)`` by ``lax.scan`` (its step passed through ``wrap``), a
    readout per step, float32 MSE."""
    hidden = p["wh"].shape[0]

    def step(h, x):
        gx = x @ p["wx"] + p["b"]
        gh = h @ p["wh"]
        z = jax.nn.sigmoid(gx[:, :hidden] + gh[:, :hidden])
        r = jax.nn.sigmoid(gx[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
        c = jnp.tanh(gx[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        h = (1 - z) * h + z * c
        return h, h @ p["out"]

    h0 = jnp.zeros((xs.shape[1], hidden), xs.dtype)
    _, ys = lax.scan(wrap(step), h0, xs)
    return jnp.mean((ys.astype(jnp.float32) - targets.astype(jnp.float32)) ** 2)


def gru_scan(steps: int, batch: int, features: int, hidden: int, dtype: Any) -> Model:
    """:func:`gru_scan_loss` over ``steps`` steps of ``(batch, features)`` inputs."""
    def make_args(key):
        r = Draw(key)
        p = {
            "wx": r.dense((features, 3 * hidden), dtype),
            "wh": r.dense((hidden, 3 * hidden), dtype),
            "b": r.small((3 * hidden,), dtype),
            "out": r.dense((hidden, features), dtype),
        }
        xs = r.normal((steps, batch, features), dtype)
        return p, xs, r.normal((steps, batch, features), dtype)

    def per_layer(wrap):
        return lambda p, xs, targets: gru_scan_loss(p, xs, targets, wrap=wrap)

    label = f"gru by lax.scan ({steps} steps, batch {batch}, {features}->{hidden}, {jnp.dtype(dtype).name})"
    return Model("gru_scan", label, per_layer(_same), make_args, (0, 1, 2), dtype, per_layer)


# --------------------------------------------------------------------------- reused from demo_models
def gpt_scanned(batch: int, seq: int, width: int, heads: int, dtype: Any, layers: int = 12) -> Model:
    """The 12-layer GPT of :mod:`jaxaot._src.cli.demo_models`, layers stacked with ``lax.scan``
    (parameters shaped by ``demo.gpt_init``, drawn by :class:`Draw`)."""

    def make_args(key):
        r = Draw(key)
        shapes = jax.eval_shape(lambda: demo.gpt_init(jax.random.key(0), layers=layers, width=width, heads=heads,
                                                      dtype=dtype))
        return r.like(shapes), r.normal((batch, seq, width), dtype)

    def loss(p, x):
        return demo.gpt_loss(p, x, heads=heads)

    def per_layer(wrap):  # demo.gpt_loss with its scan's step wrapped
        def wrapped(p, x):
            step = wrap(lambda h, q: (demo.block_apply(q, h, heads), None))
            h, _ = lax.scan(step, x, p)
            return mean_square(h)
        return wrapped

    label = f"gpt {layers} layers scanned ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("gpt_scanned", label, loss, make_args, (0, 1), dtype, per_layer)


def transformer_block(batch: int, seq: int, width: int, heads: int, dtype: Any) -> Model:
    """The pre-LN block of :mod:`jaxaot._src.cli.demo_models` (bench_partitioners' "transformer block")."""

    def make_args(key):
        r = Draw(key)
        shapes = jax.eval_shape(lambda: demo.block_init(jax.random.key(0), width=width, heads=heads, dtype=dtype))
        return r.like(shapes), r.normal((batch, seq, width), dtype)

    def per_layer(wrap):
        return lambda p, x: mean_square(wrap(lambda p, x: demo.block_apply(p, x, heads))(p, x))

    label = f"transformer block ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("transformer_block", label, per_layer(_same), make_args, (0, 1), dtype, per_layer)


# --------------------------------------------------------------------------- the zoo
def zoo(size: str = "tiny") -> dict[str, Model]:
    """Every model at ``size`` (``"tiny"``, ``"small"`` or ``"gpu"``), by name.

    ``tiny`` and ``small`` are float32 except the GPT-2 blocks, which are bf16
    by design (float32 softmax and loss on bf16 activations); ``gpu`` is bf16
    throughout.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    bf16 = jnp.bfloat16
    f = jnp.float32 if size != "gpu" else bf16
    if size == "tiny":
        models = [
            llama_block(2, 8, 16, 40, 4, 2, f),
            gpt2_block(2, 8, 16, 2, 32, bf16),
            gpt2_block(2, 8, 16, 8, 32, bf16),
            gpt2_block(2, 8, 16, 4, None, bf16, name="issue_block"),
            moe_mlp(2, 8, 16, 32, 4, 8, f),
            vit_block(2, 8, 3, 4, 16, 2, 10, f),
            convnet_bn(4, 8, 3, 4, 10, f),
            gru_scan(6, 2, 8, 16, f),
            gpt_scanned(2, 8, 16, 2, f),
            transformer_block(2, 8, 16, 2, f),
        ]
    elif size == "small":
        models = [
            llama_block(2, 128, 128, 352, 4, 2, f),
            gpt2_block(2, 128, 128, 2, 512, bf16),
            gpt2_block(2, 128, 128, 8, 512, bf16),
            gpt2_block(2, 128, 128, 4, None, bf16, name="issue_block"),
            moe_mlp(2, 64, 128, 256, 8, 64, f),
            vit_block(4, 32, 3, 4, 128, 4, 10, f),
            convnet_bn(8, 32, 3, 16, 10, f),
            gru_scan(64, 16, 64, 128, f),
            gpt_scanned(2, 64, 64, 4, f),
            transformer_block(2, 128, 128, 4, f),
        ]
    else:
        models = [
            llama_block(8, 1024, 1024, 2816, 8, 2, bf16),
            gpt2_block(8, 1024, 1024, 2, 8192, bf16),
            gpt2_block(8, 1024, 1024, 8, 8192, bf16),
            # The 16-head block: batch 8, seq 1024, width 1024, bf16.
            gpt2_block(8, 1024, 1024, 16, None, bf16, name="issue_block"),
            moe_mlp(8, 1024, 1024, 2048, 8, 1024, bf16),
            vit_block(64, 224, 3, 16, 768, 12, 1000, bf16),
            convnet_bn(128, 64, 3, 64, 1000, bf16),
            gru_scan(256, 64, 512, 1024, bf16),
            gpt_scanned(8, 1024, 768, 12, bf16),
            transformer_block(8, 1024, 1024, 16, bf16),
        ]
    return {m.name: m for m in models}
