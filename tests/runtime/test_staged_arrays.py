"""Arrays, not tracers, met where operations are staged: a ``jax.jit`` over arrays its function closes over, and
``checkify`` of a gradient. The function's forward and backward then join the program being staged, as JAX's own
would, rather than run their executables at trace time: a callback runs at every call of the jitted step, and
checkify sees the checks and the NaNs, with every gradient entry point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxaot
from zoo import assert_trees_close

ENTRY_POINTS = {
    "jax.value_and_grad": lambda f: jax.value_and_grad(f),
    "fused": lambda f: jaxaot.value_and_grad(f),
    "split": lambda f: jaxaot.value_and_grad(f, fused=False),
    "jax.vjp": lambda f: (lambda w, x: (lambda out, pull: (out, pull(jnp.ones_like(out))[0]))(*jax.vjp(f, w, x))),
}


def _inputs():
    rng = np.random.default_rng()
    return jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_jitted_step_over_closed_over_arrays_runs_the_forward_s_callback_each_call(entry):
    calls = []

    def loss(w, x):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w, x = _inputs()
    step = jax.jit(lambda: ENTRY_POINTS[entry](jaxaot.aot_function(loss))(w, x))
    for _ in range(3):
        got = jax.block_until_ready(step())
    jax.effects_barrier()
    assert len(calls) == 3
    assert_trees_close(got, jax.value_and_grad(loss)(w, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("entry", ["jax.grad", "fused", "split"])
def test_checkify_of_a_gradient_sees_the_function_s_checks_and_nans(entry):
    grad = {"jax.grad": jax.grad, "fused": jaxaot.grad, "split": lambda f: jaxaot.grad(f, fused=False)}[entry]

    def checked(w, x):
        checkify.check(jnp.all(x > -100), "x too small")
        return jnp.sum(jnp.tanh(x @ w))

    def logged(w, x):
        return jnp.sum(jnp.log(x @ w - 1e3))  # NaN for any inputs of this size

    w, x = _inputs()
    err, _ = checkify.checkify(grad(jaxaot.aot_function(checked)))(w, x.at[0, 0].set(-1e3))
    assert "x too small" in err.get()
    err, _ = checkify.checkify(grad(jaxaot.aot_function(checked)))(w, x)
    assert err.get() is None
    want, _ = checkify.checkify(jax.grad(logged), errors=checkify.nan_checks)(w, x)
    got, _ = checkify.checkify(grad(jaxaot.aot_function(logged)), errors=checkify.nan_checks)(w, x)
    assert want.get() is not None and got.get() is not None and "log" in got.get()
