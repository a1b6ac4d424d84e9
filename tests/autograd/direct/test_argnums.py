"""``jaxaot.value_and_grad`` / ``jaxaot.grad`` of an ``aot_function`` pick arguments as ``jax.value_and_grad`` does:
negative ``argnums`` from the end, ``holomorphic`` and ``allow_int`` as JAX's, and an out-of-range ``argnums`` a
typed error naming the range."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError, InvalidValueError


def _loss(w, b, x):
    return jnp.sum(jnp.tanh(x @ w + b) ** 2)


def _args(seed):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return jax.random.normal(k1, (3, 2)), jax.random.normal(k2, (2,)), jax.random.normal(k3, (4, 3))


def _close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("argnums", [-1, -3, (0, -1), (-2, 2), (-1, 0)])
def test_negative_argnums_match_jax(argnums, fused):
    f = jaxaot.aot_function(_loss)
    vg = jaxaot.value_and_grad(f, argnums=argnums, fused=fused)
    g = jaxaot.grad(f, argnums=argnums, fused=fused)
    for seed in range(3):  # later calls run the signature's hot path
        args = _args(seed)
        _close(vg(*args), jax.value_and_grad(_loss, argnums=argnums)(*args))
        _close(g(*args), jax.grad(_loss, argnums=argnums)(*args))


@pytest.mark.parametrize("argnums", [3, -4, (0, 3)])
def test_out_of_range_argnums_is_a_typed_error_naming_the_range(argnums):
    """A position past the arguments is JAX's ``TypeError``, one below minus their number JAX's ``ValueError``."""
    error = InvalidValueError if argnums == -4 else InvalidInputError
    vg = jaxaot.value_and_grad(jaxaot.aot_function(_loss), argnums=argnums)
    with pytest.raises(error, match=r"out of range: .* got 3 positional argument\(s\). Pass argnums "
                                    r"from -3 to 2"):
        vg(*_args(0))
    with pytest.raises(error, match="out of range"):
        jax.jit(vg)(*_args(0))  # traced: the same error, before JAX's own
    with pytest.raises(TypeError if error is InvalidInputError else ValueError):
        jax.value_and_grad(_loss, argnums=argnums)(*_args(0))


def test_holomorphic_and_allow_int_are_jax_s():
    f = jaxaot.aot_function(lambda z: jnp.sum(jnp.sin(z) * z))
    z = jax.random.normal(jax.random.key(1), (3,)) + 1j * jax.random.normal(jax.random.key(2), (3,))
    _close(jaxaot.value_and_grad(f, holomorphic=True)(z),
           jax.value_and_grad(lambda z: jnp.sum(jnp.sin(z) * z), holomorphic=True)(z))
    _close(jaxaot.grad(f, holomorphic=True)(z), jax.grad(lambda z: jnp.sum(jnp.sin(z) * z), holomorphic=True)(z))
    h = jaxaot.aot_function(lambda w, n: jnp.sum(w * n))
    w, n = jnp.arange(3.0), jnp.arange(3)
    got = jaxaot.grad(h, argnums=(0, 1), allow_int=True)(w, n)
    want = jax.grad(lambda w, n: jnp.sum(w * n), argnums=(0, 1), allow_int=True)(w, n)
    np.testing.assert_allclose(got[0], want[0])
    assert got[1].dtype == want[1].dtype == jax.dtypes.float0
    with pytest.raises(InvalidInputError, match="holomorphic of value_and_grad must be True or False"):
        jaxaot.value_and_grad(f, holomorphic="yes")
    # The stages of an aot_function's gradient: jit's of this one, whose compiled stage returns what it returns.
    _close(jaxaot.value_and_grad(f, holomorphic=True).lower(z).compile()(z),
           jax.value_and_grad(lambda z: jnp.sum(jnp.sin(z) * z), holomorphic=True)(z))
    _close(jaxaot.grad(f, holomorphic=True).lower(z).compile()(z),
           jax.grad(lambda z: jnp.sum(jnp.sin(z) * z), holomorphic=True)(z))
    staged = jaxaot.grad(h, argnums=(0, 1), allow_int=True).lower(w, n).compile()(w, n)
    np.testing.assert_allclose(staged[0], want[0])
    assert staged[1].dtype == jax.dtypes.float0
