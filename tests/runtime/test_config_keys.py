"""A program traced under one JAX configuration never runs under another, as under ``jit``.

``jax_enable_x64``, the default matmul precision and dtype and rank promotion change what tracing
makes of the same arguments; each is part of a call's signature, so a change compiles again (and
``cache_info()`` says which setting changed), on the full lookup and on the hot path of a loop alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot


def _loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) * jnp.arange(w.shape[1], dtype=float))


def _args(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (4, 3)), jax.random.normal(k2, (5, 4))


@pytest.mark.parametrize("fused", [True, False])
def test_x64_in_and_out_matches_jit_values_and_dtypes(fused):
    f = jaxaot.aot_function(_loss)
    vg = jaxaot.value_and_grad(f, argnums=(0, 1)) if fused else jax.value_and_grad(f, argnums=(0, 1))
    ref = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)))
    w, x = _args(0)
    for seed, x64 in enumerate([False, True, False, True]):
        w, x = _args(seed)
        with jax.enable_x64(x64):
            for _ in range(2):  # the second call takes the hot path where there is one
                got, want = vg(w, x), ref(w, x)
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                    assert a.dtype == b.dtype
                    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
            assert f(w, x).dtype == jax.jit(_loss)(w, x).dtype == (jnp.float64 if x64 else jnp.float32)


def test_rank_promotion_raise_is_honoured_after_allow():
    f = jaxaot.aot_function(lambda u, v: jnp.sum(u + v))
    u, v = jnp.ones(3), jnp.ones((2, 3))
    with jax.numpy_rank_promotion("allow"):
        assert float(f(u, v)) == 12.0
    with jax.numpy_rank_promotion("raise"), pytest.raises(ValueError, match="rank_promotion"):
        f(u, v)


def test_matmul_precision_compiles_again_and_says_why():
    f = jaxaot.aot_function(_loss)
    w, x = _args(1)
    f(w, x)
    f(w, x)
    with jax.default_matmul_precision("bfloat16"):
        f(w, x)
        f(w, x)
    f(w, x)
    entries = f.cache_info().entries
    assert [e.reason for e in entries] == ["first call", "JAX configuration changed: jax_default_matmul_precision"]


def test_the_reason_names_the_nearest_configuration():
    f = jaxaot.aot_function(_loss)
    w, x = _args(2)
    f(w, x)
    with jax.enable_x64(True):
        f(w, x)
    with jax.default_matmul_precision("bfloat16"):
        f(w, x)
    assert [e.reason for e in f.cache_info().entries][1:] == [
        "JAX configuration changed: jax_enable_x64", "JAX configuration changed: jax_default_matmul_precision"]
