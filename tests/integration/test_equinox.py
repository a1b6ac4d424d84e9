"""Equinox's ``while_loop(kind="lax")`` under ``jaxaot.loops.differentiable`` against its
``kind="checkpointed"`` gradients (its own reverse mode), with a closed-over array and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqxi = pytest.importorskip("equinox.internal", reason="equinox is not installed (pip install -e '.[integration]')")

import jaxaot  # noqa: E402

pytestmark = pytest.mark.slow  # compiles Equinox's checkpointed loop and its gradient: 12 s on 2 cores

_SEED = int(np.random.SeedSequence().entropy % 2**31)


def _decay(w, x, kind):
    def body(c):
        return c[0] + 1, c[1] + 0.1 * jnp.tanh(c[1] @ w)

    return jnp.sum(eqxi.while_loop(lambda c: jnp.sum(c[1] ** 2) < 20.0, body, (0, x), kind=kind, max_steps=200,
                                   checkpoints=8 if kind == "checkpointed" else None)[1] ** 2)


def test_lax_kind_under_differentiable_equals_checkpointed_kind():
    rng = np.random.default_rng(_SEED)
    w = jnp.asarray(rng.normal(size=(3, 3)) * 0.5 + np.eye(3), jnp.float32)
    xs = jnp.asarray(rng.uniform(0.2, 1.0, (4, 3)), jnp.float32)
    ref = jax.vmap(jax.grad(lambda w, x: _decay(w, x, "checkpointed"), argnums=(0, 1)), in_axes=(None, 0))(w, xs)
    f = jaxaot.loops.differentiable(lambda w, x: _decay(w, x, "lax"), max_steps=200)
    got = jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(None, 0)))(w, xs)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=1e-6, err_msg=f"seed {_SEED}")
