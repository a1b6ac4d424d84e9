"""compiled_grad on Flax nnx modules (dropout and batch norm), against nnx.grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import compiled_autograd

nnx = pytest.importorskip("flax.nnx")


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))


def loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_nnx_model_with_dropout_and_batch_norm_matches_nnx_grad():
    compiled_autograd.reset()
    rng = np.random.default_rng(0)
    ours, ref = Net(nnx.Rngs(0, dropout=1)), Net(nnx.Rngs(0, dropout=1))
    g = jaxaot.nnx_compiled_grad(loss)
    for _ in range(2):  # the same dropout masks on both sides: both advance the same RNG counters
        x = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
        y = jnp.asarray(rng.standard_normal((8, 2)), jnp.float32)
        got, want = g(ours, x, y), nnx.grad(loss)(ref, x, y)
        assert isinstance(got, nnx.State)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        # batch statistics and RNG counters were written back, as nnx.grad does
        for a, b in zip(jax.tree_util.tree_leaves(nnx.state(ours)), jax.tree_util.tree_leaves(nnx.state(ref))):
            np.testing.assert_allclose(np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key)
                                                  else a),
                                       np.asarray(jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key)
                                                  else b), rtol=1e-4, atol=1e-5)
    assert compiled_autograd.stats().compiles == 1


def test_param_hooks_name_nnx_paths():
    model = Net(nnx.Rngs(0, dropout=1))
    model.eval()
    x, y = jnp.ones((4, 6)), jnp.zeros((4, 2))
    got = jaxaot.compiled_grad(loss, param_hooks={"l2/kernel": lambda p, g: g * 0})(model, x, y)
    want = nnx.grad(loss)(model, x, y)
    assert float(jnp.abs(got["l2"]["kernel"][...]).max()) == 0.0
    np.testing.assert_allclose(np.asarray(got["l1"]["kernel"][...]), np.asarray(want["l1"]["kernel"][...]),
                               rtol=1e-5, atol=1e-6)
