"""Small Flax models (nnx and linen) for the aot_module tests: a CNN with
BatchNorm and Dropout, a one-block causal transformer with Dropout, and a
Linear -> BatchNorm -> Dropout ``Block`` with a call counter; plus the state
comparisons the tests share."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx

VOCAB, SEQ, WIDTH = 16, 8, 16
# Float32 against float32 computed in another order (split vs fused programs). On GPUs the
# reductions of BatchNorm statistics run in a different order in each program, and the
# kernel gradient through BatchNorm is a difference of nearly equal terms: 0.3% apart in
# its smallest entries on an H100. A wrong gradient is off by far more.
TOL = dict(rtol=1e-5, atol=1e-6) if jax.default_backend() == "cpu" else dict(rtol=1e-2, atol=1e-5)


# --------------------------------------------------------------------------- nnx
class NnxCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 4, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.head = nnx.Linear(4 * 4 * 4, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.conv(x)))
        x = nnx.avg_pool(self.drop(x), (2, 2), strides=(2, 2))
        return self.head(x.reshape(x.shape[0], -1))


class NnxTransformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (SEQ, WIDTH)))
        self.ln1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        # No attention biases: the key bias has an exactly zero gradient that Adam
        # would turn into rounding-noise updates (same for conv bias before BatchNorm).
        self.attn = nnx.MultiHeadAttention(
            2, WIDTH, decode=False, dropout_rate=0.1, deterministic=False, use_bias=False, rngs=rngs
        )
        self.ln2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos[...]
        x = x + self.attn(self.ln1(x), mask=nnx.make_causal_mask(tokens))
        x = x + self.drop(self.down(nnx.gelu(self.up(self.ln2(x)))))
        return self.out(x)


def nnx_model(name: str, seed: int = 0) -> nnx.Module:
    cls = {"cnn": NnxCNN, "transformer": NnxTransformer}[name]
    return cls(nnx.Rngs(params=seed, dropout=seed + 1))


class Block(nnx.Module):
    """Linear -> BatchNorm -> Dropout, plus a user Variable counting calls."""

    def __init__(self, seed: int = 0):
        rngs = nnx.Rngs(params=seed, dropout=seed + 1)
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        return self.drop(self.bn(self.lin(x)))


X = jnp.arange(12.0).reshape(4, 3) / 10


def block_loss(m, x):
    return (m(x) ** 2).mean()


# --------------------------------------------------------------------------- linen
class LinenCNN(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(4, (3, 3), use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        x = nn.avg_pool(nn.Dropout(0.25, deterministic=not train)(x), (2, 2), strides=(2, 2))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class LinenTransformer(nn.Module):
    @nn.compact
    def __call__(self, tokens, train: bool):
        pos = self.param("pos", nn.initializers.normal(0.02), (SEQ, WIDTH))
        x = nn.Embed(VOCAB, WIDTH)(tokens) + pos
        h = nn.SelfAttention(num_heads=2, dropout_rate=0.1, deterministic=not train, use_bias=False)(
            nn.LayerNorm()(x), mask=nn.make_causal_mask(tokens)
        )
        x = x + h
        h = nn.Dense(WIDTH)(nn.gelu(nn.Dense(2 * WIDTH)(nn.LayerNorm()(x))))
        x = x + nn.Dropout(0.1, deterministic=not train)(h)
        return nn.Dense(VOCAB)(x)


def linen_model(name: str) -> nn.Module:
    return {"cnn": LinenCNN, "transformer": LinenTransformer}[name]()


# --------------------------------------------------------------------------- data
def batch(name: str, step: int) -> tuple[jax.Array, jax.Array]:
    """A deterministic (inputs, labels) batch for ``step``."""
    key = jax.random.fold_in(jax.random.key(1234), step)
    if name == "cnn":
        kx, ky = jax.random.split(key)
        return jax.random.normal(kx, (8, 8, 8, 1)), jax.random.randint(ky, (8,), 0, 10)
    tokens = jax.random.randint(key, (4, SEQ + 1), 0, VOCAB)
    return tokens[:, :-1], tokens[:, 1:]


def xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# --------------------------------------------------------------------------- comparisons
def keyless(tree):
    """``tree`` with typed PRNG keys replaced by their raw data, for comparisons."""

    def f(x):
        if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree.map(f, tree)


def assert_states_equal(a, b, **tol):
    chex.assert_trees_all_close(keyless(a), keyless(b), **(tol or TOL))


class StatsAndParam(nnx.Module):
    """Batch statistics and a Param (a running mean kept as a Param) both written."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(3, 4, use_bias=False, rngs=rngs)  # a bias before BatchNorm gets a zero gradient
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.shift = nnx.Param(jnp.zeros(4))

    def __call__(self, x):
        h = self.bn(self.l1(x))
        self.shift[...] = 0.8 * self.shift[...] + 0.2 * jnp.mean(h ** 2, axis=0)
        return jnp.sum(jnp.tanh(h - self.shift[...]))


#: What a loss may return in its aux of a :class:`StatsAndParam` argument, by name.
AUX_PICKS = {
    "batch statistic": lambda m: m.bn.mean,
    "parameter": lambda m: m.shift,
    "the module": lambda m: m,
    "a submodule": lambda m: m.l1,
    "a dict of Variables": lambda m: {"var": m.bn.var, "kernel": m.l1.kernel},
}


def same_objects(aux, own) -> list:
    """Per Variable or module of ``aux``, whether it is the object in that place of ``own``."""
    node = lambda x: isinstance(x, (nnx.Variable, nnx.Module))  # noqa: E731
    return jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: a is b, aux, own, is_leaf=node))
