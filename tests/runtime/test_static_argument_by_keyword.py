"""A static position passed by keyword is that static argument, as ``jax.jit`` infers ``static_argnames`` from
``static_argnums``: the call, ``jaxaot.value_and_grad``, ``jax.grad`` and ``forward``/``backward`` equal JAX's,
and the keyword form keys its own programs, as ``jax.jit``'s cache does."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from tests.zoo import assert_trees_close, key_stream

fresh_key = key_stream(9200)


def f(x, n, y):
    return jnp.sum(x ** n * jnp.sin(y))


@pytest.mark.parametrize("n", [2, 3])
def test_keyword_static_matches_jit(n):
    x, y = (jax.random.normal(fresh_key(), (4,)) for _ in range(2))
    jit, aot = jax.jit(f, static_argnums=1), jaxaot.aot_function(f, static_argnums=1)
    assert_trees_close(aot(x, n=n, y=y), jit(x, n=n, y=y))
    assert_trees_close(aot(y=y, n=n, x=x), jit(y=y, n=n, x=x))
    assert_trees_close(jaxaot.value_and_grad(aot)(x, n=n, y=y), jax.value_and_grad(jit)(x, n=n, y=y))
    assert_trees_close(jaxaot.value_and_grad(aot, fused=False)(x, n=n, y=y), jax.value_and_grad(jit)(x, n=n, y=y))
    assert_trees_close(jax.grad(aot)(x, n=n, y=y), jax.grad(jit)(x, n=n, y=y))
    assert_trees_close(jax.jit(lambda x: aot(x, n=n, y=y))(x), jit(x, n=n, y=y))
    out, res = aot.forward(x, n=n, y=y)
    want, vjp = jax.vjp(lambda x, y: f(x, n, y), x, y)
    assert_trees_close(out, want)
    (dx,), grads = aot.backward(res, jnp.float32(1.0))
    assert_trees_close((dx, grads["y"]), vjp(jnp.float32(1.0)))


def test_keyword_static_keys_programs_as_jit_does():
    x, y = (jax.random.normal(fresh_key(), (3,)) for _ in range(2))
    g = lambda x, n, y: f(x, n, y)  # noqa: E731 - its own function: jax.jit's cache is shared per function
    jit, aot = jax.jit(g, static_argnums=1), jaxaot.aot_function(g, static_argnums=1)
    calls = (lambda g: g(x, 2, y=y), lambda g: g(x, n=2, y=y), lambda g: g(x, n=2, y=y), lambda g: g(x, n=3, y=y))
    for call in calls:
        assert_trees_close(call(aot), call(jit))
    assert (aot.cache_info().misses, aot.cache_info().hits) == (jit._cache_size(), 1) == (3, 1)
    reason = aot.cache_info().entries[1].reason
    assert reason.startswith("static argument `n` is now passed by keyword (was by position)"), reason


def test_the_reason_compares_with_the_same_value_passed_the_other_way():
    """Of two compiled values, the one equal to the new call's (passed the other way) is the nearer: the reason
    names the keyword, not a value change."""
    x = jax.random.normal(fresh_key(), (3,))
    g = lambda x, n: jnp.sum(x * n)  # noqa: E731
    aot = jaxaot.aot_function(g, static_argnums=1)
    for call in (lambda: aot(x, 3), lambda: aot(x, 4), lambda: aot(x=x, n=3)):
        call()
    reason = aot.cache_info().entries[-1].reason
    assert reason.startswith("static argument `n` is now passed by keyword (was by position)"), reason
    assert_trees_close(aot(x=x, n=3), g(x, 3))


def test_a_module_call_s_static_argument_is_named_passed_or_left_out():
    """A module method's static argument by position is named by its parameter; one left out for its default
    says so (``not static``), not an internal name."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x, train=True):
            y = self.lin(x)
            return y if train else -y

    model = Block(nnx.Rngs(int(np.random.randint(1 << 16))))
    m = jaxaot.nn.aot_module(model)
    x = jax.random.normal(fresh_key(), (2, 4))
    outs = [m(x, train=False), m(x, True), m(x)]
    assert_trees_close(outs, [model(x, train=False), model(x, True), model(x)])
    reasons = [e.reason for e in m.cache_info().entries]
    assert "train (arg[1]): not static → True" in reasons[1], reasons
    assert reasons[2] == "train (arg[1]): True → not static", reasons


def test_keyword_static_compiled_stage_runs_the_dynamic_arguments():
    x, y = (jax.random.normal(fresh_key(), (3,)) for _ in range(2))
    compiled = jaxaot.aot_function(f, static_argnums=1).lower(x, n=3, y=y).compile()
    want = jax.jit(f, static_argnums=1).lower(x, n=3, y=y).compile()(x, y=y)
    assert_trees_close(compiled(x, y=y), want)


def test_a_static_argument_left_out_without_a_default_is_python_s_error_as_under_jit():
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'n'"):
        jax.jit(f, static_argnums=1)(jnp.ones(3), y=jnp.ones(3))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'n'"):
        jaxaot.aot_function(f, static_argnums=1)(jnp.ones(3), y=jnp.ones(3))


def _defaulted(x, n=2, *, y):
    return jnp.sum(jnp.sin(x * y) ** n)


def test_a_static_argument_left_at_its_default_runs_it_as_under_jit():
    """Left out, the default runs and keys its own programs; passed, the value passed does (``train=False``)."""
    x, y = (jax.random.normal(fresh_key(), (4,)) for _ in range(2))
    jit, aot = jax.jit(_defaulted, static_argnums=1), jaxaot.aot_function(_defaulted, static_argnums=1)
    for args in ((x,), (x, 3), (x,), (x, 2)):
        assert_trees_close(aot(*args, y=y), jit(*args, y=y))
        assert_trees_close(jaxaot.value_and_grad(aot)(*args, y=y), jax.value_and_grad(jit)(*args, y=y))
        assert_trees_close(jax.grad(aot)(*args, y=y), jax.grad(jit)(*args, y=y))
    assert aot.cache_info().misses == 3  # the default, 3, and 2 passed (keyed apart from the default, as jit does)


class _Scaled:
    """An object whose methods are compiled, as ``jax.jit`` compiles methods."""

    def __init__(self, scale):
        self.scale = scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, _Scaled) and other.scale == self.scale

    @functools.partial(jaxaot.aot_function, static_argnums=0)
    def loss(self, x):
        return jnp.sum(jnp.sin(x) * self.scale)

    @functools.partial(jax.jit, static_argnums=0)
    def jitted(self, x):
        return jnp.sum(jnp.sin(x) * self.scale)


def test_an_aot_function_is_a_method_bound_to_its_instance_as_jax_jit_is():
    obj = _Scaled(float(np.random.default_rng().uniform(1, 3)))
    x = jnp.asarray(np.random.default_rng().normal(size=4), jnp.float32)
    np.testing.assert_allclose(obj.loss(x), obj.jitted(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(obj.loss)(x), jax.grad(obj.jitted)(x), rtol=1e-6)
    np.testing.assert_allclose(jaxaot.grad(obj.loss)(x), jax.grad(obj.jitted)(x), rtol=1e-6)
    assert _Scaled.loss.__qualname__ == "_Scaled.loss" and _Scaled.loss.__module__ == __name__
    assert _Scaled.__dict__["loss"].__get__(None, _Scaled) is _Scaled.loss  # looked up on the class: itself
