"""Loops whose tangents nobody reads: no stack is used, so no bound or overflow error; JAX's results.

A float carry the body changes but the loss never reads, next to an integer counter
or a carry the body returns unchanged, is what ``lax.while_loop`` differentiates
(the unused tangent is dropped, a forwarded one passes through); a ``max_steps``
bound far below the trip count changes nothing there, while a read tangent still
raises :class:`~jaxaot.errors.LoopOverflowError`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src.loops import differentiable, reraise_overflow
from jaxaot._src.loops.wrappers import while_loop
from jaxaot.errors import LoopOverflowError

_SEED = int(np.random.SeedSequence().entropy % 2**31)


def _count(loop, n, **o):
    """The loss reads the integer counter only."""
    return lambda x: x * loop(lambda c: c[1] < n, lambda c: (c[0] * 1.1, c[1] + 1), (x, 0), **o)[1]


def _passthrough(loop, n, **o):
    """The loss reads a carry the body returns unchanged, times the counter."""
    return lambda x: jnp.sin(loop(lambda c: c[1] < n, lambda c: (c[0] * 1.1, c[1] + 1, c[2]), (x, 0, x), **o)[2])


@pytest.mark.parametrize("make", [_count, _passthrough], ids=["counter", "passthrough"])
@pytest.mark.parametrize("options", [dict(max_steps=2), dict()], ids=["max_steps", "no_options"])
def test_unread_tangents_need_no_stack(make, options):
    rng = np.random.default_rng(_SEED)
    x, n = float(rng.uniform(0.5, 2.0)), int(rng.integers(5, 12))
    ref_v, ref_g = jax.value_and_grad(make(lax.while_loop, n))(x)
    for fn in (jax.value_and_grad(make(while_loop, n, **options)),
               jax.jit(jax.value_and_grad(make(while_loop, n, **options))),
               jax.value_and_grad(differentiable(make(lax.while_loop, n), **options))):
        with reraise_overflow():
            v, g = fn(x)
        np.testing.assert_allclose(v, ref_v, rtol=1e-6, err_msg=f"seed {_SEED}")
        np.testing.assert_allclose(g, ref_g, rtol=1e-6, err_msg=f"seed {_SEED}")


def test_a_read_tangent_still_raises_on_overflow():
    rng = np.random.default_rng(_SEED)
    x, n = float(rng.uniform(0.5, 2.0)), int(rng.integers(5, 12))

    def f(x):
        c = while_loop(lambda c: c[1] < n, lambda c: (c[0] * 1.1, c[1] + 1), (x, 0), max_steps=2)
        return c[0] * c[1]

    with pytest.raises(LoopOverflowError, match="max_steps=2"):
        jax.grad(f)(x)
    with pytest.raises(LoopOverflowError, match="max_steps=2"), reraise_overflow():
        jax.jit(jax.grad(f))(x)
    v, g = jax.jit(jax.value_and_grad(f))(x)  # a bare jit: the forward's value, a NaN gradient
    np.testing.assert_allclose(v, x * 1.1 ** n * n, rtol=1e-5)
    assert np.isnan(g)
