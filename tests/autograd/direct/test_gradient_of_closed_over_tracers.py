"""``jaxaot.value_and_grad`` and ``jaxaot.grad`` of an ``aot_function`` closing over a tracer of an outer
``jax.jit``, ``jax.vmap`` or ``jax.grad``, called on arrays: nothing compiles, and the results equal
``jax.value_and_grad`` of the same closure (``has_aux``, tuple ``argnums``, pytree arguments, a static argument).
Its ``forward`` raises :class:`~jaxaot.errors.InvalidInputError`, as nothing is compiled to run."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError
from tests.zoo import assert_trees_close, key_stream

fresh_key = key_stream(9100)


def _normal(*shape):
    return jax.random.normal(fresh_key(), shape)


def _closure(w):
    def loss(p, x, scale):
        v = jnp.sum(jnp.sin(p["a"] * w) * x) + scale * jnp.sum(jnp.tanh(p["b"]) ** 2)
        return v, {"twice": 2 * v}
    return loss


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("argnums", [0, (0, 1), (1,)])
def test_value_and_grad_of_a_closure_matches_jax(transform, fused, argnums):
    p, x, scale = {"a": _normal(3), "b": _normal(2, 3)}, _normal(3), 1.5

    def run(aot):
        def inner(w):
            f = _closure(w)
            if not aot:
                return jax.value_and_grad(f, argnums=argnums, has_aux=True)(p, x, scale)
            A = jaxaot.aot_function(f, static_argnums=2)
            out = jaxaot.value_and_grad(A, argnums=argnums, has_aux=True, fused=fused)(p, x, scale)
            assert A.cache_info().misses == 0  # no programs kept that hold the outer trace's tracers
            return out
        return inner

    key = fresh_key()
    want = _outer_with(transform, run(False), key)
    assert_trees_close(_outer_with(transform, run(True), key), want)


def _outer_with(transform, inner, key):
    w = jax.random.normal(key, (2,) if transform == "vmap" else ())
    if transform == "jit":
        return jax.jit(inner)(w)
    if transform == "vmap":
        return jax.vmap(inner)(w)
    return jax.grad(lambda w: sum(jnp.sum(t) for t in jax.tree.leaves(inner(w))))(w)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
def test_grad_of_a_closure_matches_jax(transform):
    x, key = _normal(4), fresh_key()
    body = lambda w: lambda x: jnp.sum(jnp.sin(x * w))  # noqa: E731
    got = _outer_with(transform, lambda w: jaxaot.grad(jaxaot.aot_function(body(w)))(x), key)
    assert_trees_close(got, _outer_with(transform, lambda w: jax.grad(body(w))(x), key))


def test_value_and_grad_of_a_partial_over_a_tracer_matches_jax():
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    w, x = _normal(4, 3), _normal(5, 4)
    got = jax.jit(lambda x: jaxaot.value_and_grad(jaxaot.aot_function(functools.partial(loss, x=x)))(w))(x)
    assert_trees_close(got, jax.jit(lambda x: jax.value_and_grad(functools.partial(loss, x=x))(w))(x))


def test_forward_of_a_closure_raises_a_typed_error():
    x = _normal(3)

    def fb(w):
        A = jaxaot.aot_function(lambda x: jnp.sum(jnp.sin(x * w)))
        _, res = A.forward(x)
        return A.backward(res, jnp.float32(1.0))

    with pytest.raises(InvalidInputError, match="closes over a tracer"):
        jax.jit(fb)(_normal())
