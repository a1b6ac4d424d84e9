"""Helpers shared by the compiled-autograd tests: random inputs, tree comparison, threads."""

import threading

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


def in_threads(step, n: int = 8, steps: int = 6) -> None:
    """Run ``step(thread, k)`` for ``k < steps`` in ``n`` threads started together; re-raise what any raised."""
    errors, barrier = [], threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait()
            for k in range(steps):
                step(i, k)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
