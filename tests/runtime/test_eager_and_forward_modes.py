"""Under ``jax.disable_jit()`` jaxaot's callables run the function's Python op by op, as ``jit``'s do: a debugger,
``print`` and NumPy conversions see concrete values, and gradients are JAX's own. ``forward`` and ``backward``
still run the compiled programs, as a ``Compiled`` stage does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot


def _args(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (4, 3)), jax.random.normal(k2, (5, 4))


def _close(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_every_entry_point_runs_the_python_op_by_op():
    seen = []

    def loss(w, x):
        h = jnp.tanh(x @ w)
        seen.append(type(h))
        return jnp.sum(h ** 2)

    f = jaxaot.aot_function(loss)
    w, x = _args(0)
    with jax.disable_jit():
        want = jax.value_and_grad(loss)(w, x)
        n = len(seen)
        _close(f(w, x), want[0])
        assert seen[-1] is type(w)  # a concrete array: op by op, as under jit
        _close(jaxaot.value_and_grad(f)(w, x), want)
        _close(jaxaot.grad(f)(w, x), want[1])
        _close(jax.grad(f)(w, x), want[1])
        _close(jaxaot.compiled_value_and_grad(loss)(w, x), want)
        assert len(seen) == n + 5  # each ran the Python
    assert f.cache_info().entries == ()  # nothing traced or compiled for it


@pytest.mark.parametrize("replay", [True, False])
def test_compiled_autograd_after_disable_jit_records_again(replay):
    loss = lambda w, x: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for seed in range(4):
        args = _args(seed)
        with jax.disable_jit(seed % 2 == 1):
            _close(vg(*args), jax.value_and_grad(loss)(*args))


def test_forward_and_backward_run_the_compiled_programs():
    f = jaxaot.aot_function(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2))
    w, x = _args(1)
    with jax.disable_jit():
        out, res = f.forward(w, x)
        dw, dx = f.backward(res, jnp.float32(1.0))
    want = jax.value_and_grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2), argnums=(0, 1))(w, x)
    _close((out, (dw, dx)), want)
    assert [e.reason for e in f.cache_info().entries] == ["first call"]


def test_forward_mode_evaluates_the_program_and_linearize_is_jax_s():
    fn = lambda w: jnp.sum(jnp.tanh(w) ** 2)  # noqa: E731
    f = jaxaot.aot_function(fn)
    w, t = _args(2)[0], _args(3)[0]
    _close(jax.jvp(f, (w,), (t,)), jax.jvp(fn, (w,), (t,)))
    _close(jax.hessian(f)(w[0]), jax.hessian(fn)(w[0]))
    y, lin = jax.linearize(f, w)
    _close(y, fn(w))

    @jax.custom_vjp
    def own(w):  # JAX's own behaviour for any custom_vjp: the linear function cannot be applied
        return fn(w)

    own.defvjp(lambda w: (fn(w), w), lambda w, g: (g * jax.grad(fn)(w),))
    _, own_lin = jax.linearize(own, w)
    with pytest.raises(TypeError, match="custom_vjp") as jax_error:
        own_lin(t)
    with pytest.raises(TypeError, match="custom_vjp") as ours:
        lin(t)
    assert type(ours.value) is type(jax_error.value)
