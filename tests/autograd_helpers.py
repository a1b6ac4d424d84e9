"""Helpers shared by the compiled-autograd tests: random inputs and tree comparison."""

import jax
import jax.numpy as jnp
import numpy as np


def rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def close(a, b, tol=1e-5):
    """Leaves equal within ``tol`` (relative and absolute), and the same tree structure."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
