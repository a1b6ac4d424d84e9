"""The split of a joint graph: residual bookkeeping (sizes, printing) for every dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import assert_trees_close


def _dropout_loss(w, key, x):
    h = jnp.tanh(x @ w)
    keep = jax.random.bernoulli(key, 0.9, h.shape)
    return jnp.sum(jnp.where(keep, h / 0.9, 0.0) ** 2)


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_min_cut_saving_a_typed_prng_key_sizes_and_prints_it(budget):
    # Regression: Partition.saved_bytes, repr(residuals) and str(lower(...)) raised
    # "Cannot interpret 'key<fry>' as a data type" when a typed key was a residual.
    seed = np.random.default_rng().integers(1 << 30)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    w, x = jax.random.normal(k1, (8, 4)), jax.random.normal(k2, (5, 8))
    partition_fn = lambda joint: jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=budget)
    f = jaxaot.aot_function(_dropout_loss, partition_fn=partition_fn)
    low = f.lower(w, k3, x)
    keys = [r for r in low.saved if jax.dtypes.issubdtype(r.aval.dtype, jax.dtypes.prng_key)]
    assert keys, "the min-cut recomputes the dropout mask from the key: the key is saved"
    key_bytes = jax.random.key_data(k3).nbytes
    assert all(r.nbytes == key_bytes for r in keys)
    expected = sum(key_bytes if r in keys else int(np.prod(r.aval.shape)) * np.dtype(r.aval.dtype).itemsize
                   for r in low.saved)
    assert low.saved_bytes == expected
    assert "key<fry>" in low.details() and f"{low.saved_bytes} bytes saved" in str(low)
    out, res = f.forward(w, k3, x)
    assert repr(res) == f"Residuals({len(low.saved)} arrays, {low.saved_bytes} bytes)"
    # ... and the gradients are JAX's.
    dw, _, dx = f.backward(res, jnp.float32(1.0))
    ref = jax.grad(_dropout_loss, argnums=(0, 2))(w, k3, x)
    assert_trees_close((dw, dx), ref)
    assert_trees_close(out, _dropout_loss(w, k3, x))
    assert_trees_close(jax.grad(f, argnums=(0, 2))(w, k3, x), ref)
