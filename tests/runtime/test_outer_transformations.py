"""An ``aot_function`` called inside another transformation, on arrays it does not differentiate, behaves as a
``jit`` inside it: under ``jit`` its operations are staged (a callback runs at every call of the outer program), a
function that closes over the outer transformation's tracer is traced by JAX, and outputs that are inputs come
back as new arrays of JAX's dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxaot


def _close(got, want, atol=1e-6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=atol)


@pytest.mark.parametrize("transform", ["grad", "jit", "jit_grad", "vmap"])
def test_a_function_closing_over_the_outer_tracer_matches_jax(transform):
    k1, k2 = jax.random.split(jax.random.key(np.random.default_rng().integers(1 << 30)))
    x = jax.random.normal(k1, (5, 3))
    s = jax.random.normal(k2, (3,))

    def outer(aot):
        def loss(scale):
            body = lambda a: jnp.sum(jnp.tanh(a * scale) ** 2, axis=-1)  # noqa: E731
            return (jaxaot.aot_function(body) if aot else jax.jit(body))(x).sum()
        return loss

    wrap = {"grad": jax.grad, "jit": jax.jit, "jit_grad": lambda f: jax.jit(jax.grad(f)),
            "vmap": jax.vmap}[transform]
    arg = jnp.stack([s, 2 * s]) if transform == "vmap" else s
    _close(wrap(outer(True))(arg), wrap(outer(False))(arg))


@pytest.mark.parametrize("transform", ["grad", "jit", "vmap"])
def test_a_function_closing_over_the_outer_tracer_is_traced_once_per_call(transform):
    x = jax.random.normal(jax.random.key(np.random.default_rng().integers(1 << 30)), (4, 3))
    traces = []

    def loss(scale):
        def body(a):
            traces.append(1)
            return jnp.sum(jnp.sin(a * scale))
        return jaxaot.aot_function(body)(x)

    wrap = {"grad": jax.grad, "jit": jax.jit, "vmap": jax.vmap}[transform]
    arg = jnp.arange(2.0) + 1 if transform == "vmap" else jnp.float32(1.5)
    got = wrap(loss)(arg)
    assert len(traces) == 1
    want = {"grad": jax.grad, "jit": jax.jit, "vmap": jax.vmap}[transform](
        lambda s: jnp.sum(jnp.sin(x * s)))(arg)
    _close(got, want)


def test_a_call_on_arrays_under_jit_is_staged():
    x = jax.random.normal(jax.random.key(0), (3,))
    count = {"n": 0}

    def tick():
        count["n"] += 1
        return np.float32(count["n"])

    f = lambda a: a * io_callback(tick, jax.ShapeDtypeStruct((), jnp.float32))  # noqa: E731
    results = {}
    for name, fn in (("jit", jax.jit(f)), ("aot", jaxaot.aot_function(f))):
        count["n"] = 0
        step = jax.jit(lambda: fn(x))  # noqa: B023
        results[name] = [np.asarray(step()) for _ in range(3)]
    _close(results["aot"], results["jit"])
    assert count["n"] == 3


def test_eager_grad_around_a_call_on_arrays_runs_its_executable():
    x = jax.random.normal(jax.random.key(1), (4, 3))
    f = jaxaot.aot_function(lambda a: jnp.tanh(a) * 2.0)
    got = jax.grad(lambda s: jnp.sum(f(x) * s))(1.5)
    _close(got, jnp.sum(jnp.tanh(x) * 2.0))
    jax.grad(lambda s: jnp.sum(f(x) * s))(2.5)
    info = f.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_outputs_that_are_inputs_are_new_arrays_of_jax_s_dtypes():
    f = lambda a, b: (a, jnp.sum(b))  # noqa: E731
    aot = jaxaot.aot_function(f)
    for a in (np.ones(3), 1.5, np.float64(2.0), jnp.arange(3.0)):
        got, want = aot(a, jnp.ones(2))[0], jax.jit(f)(a, jnp.ones(2))[0]
        assert type(got) is type(want)
        assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)
    x = jnp.arange(3.0)
    out = aot(x, x)[0]
    jax.jit(lambda a: a + 1, donate_argnums=0)(x)  # the caller donates its input: the output stays
    np.testing.assert_array_equal(out, np.arange(3.0))


def test_an_auxiliary_output_that_is_an_input_is_an_array():
    w = jax.random.normal(jax.random.key(2), (3,))
    fn = lambda w, x: (jnp.sum(w * x), x)  # noqa: E731
    (_, aux), _ = jaxaot.value_and_grad(jaxaot.aot_function(fn), has_aux=True)(w, np.ones(3))
    (_, want), _ = jax.value_and_grad(jax.jit(fn), has_aux=True)(w, np.ones(3))
    assert isinstance(aux, jax.Array) and aux.dtype == want.dtype == jnp.float32


def test_under_jit_the_data_of_a_gradient_step_is_not_differentiated():
    """``jit(value_and_grad(f))`` differentiates the first argument only, as the eager call does: a byte budget
    that the eager step fits, the jitted step fits too, with JAX's values."""
    rng = np.random.default_rng()
    w = jnp.asarray(rng.normal(size=(64, 32)) * 0.01, jnp.float32)
    x = jnp.asarray(rng.normal(size=(128, 64)), jnp.float32)
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    budget = jaxaot.value_and_grad(jaxaot.aot_function(loss)).lower(w, x).compile().peak_bytes
    f = jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition(
        memory_budget=budget))
    want = jax.value_and_grad(loss)(w, x)
    atol = 1e-5  # float32 sums of 128 products of up to about 10, in another order (a GPU's kernels)
    _close(jaxaot.value_and_grad(f)(w, x), want, atol)
    _close(jax.jit(jax.value_and_grad(f))(w, x), want, atol)
    both = jax.jit(jax.value_and_grad(jaxaot.aot_function(loss), argnums=(0, 1)))(w, x)
    _close(both, jax.value_and_grad(loss, argnums=(0, 1))(w, x), atol)


def test_reverse_over_reverse_under_jit_matches_jax():
    rng = np.random.default_rng()
    w = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(5, 6)), jnp.float32)
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    g = jaxaot.aot_function(loss)
    outer = lambda fn: lambda w: jnp.sum(jax.grad(fn, argnums=1)(w, x) ** 2)  # noqa: E731
    want = jax.grad(outer(loss))(w)
    # second derivatives in float32, from programs XLA fuses differently: a few ulps of their sums apart
    np.testing.assert_allclose(jax.grad(outer(g))(w), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.grad(outer(g)))(w), want, rtol=1e-4, atol=1e-5)
