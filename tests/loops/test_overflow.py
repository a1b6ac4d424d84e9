"""The overflow check of bounded stacks: an error or NaN, never silent; and how export recognises it."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import LoopOverflowError
from jaxaot._src.loops.wrappers import while_loop, while_loop_stack_output
from jaxaot._src.loops import overflow
from jaxaot._src.loops.overflow import overflow_check, raise_if_overflowed, reraise_overflow


def _checks(closed):
    """Each check's max_steps, once: a check is a cond whose true branch holds its callback."""
    found, inside = [], set()
    for eqn in C.iter_eqns(closed):
        check = overflow_check(eqn) if id(eqn) not in inside else None
        if check is not None:
            found.append(check[0])
            if str(eqn.primitive) == "cond":
                inside.add(id(eqn.params["branches"][1].jaxpr.eqns[0]))
    return found


def test_raise_if_overflowed_names_max_steps():
    raise_if_overflowed(False, 7)
    with pytest.raises(LoopOverflowError, match="max_steps=7.*checkpoints=k"):
        raise_if_overflowed(jnp.bool_(True), 7)
    with pytest.raises(LoopOverflowError, match="max_steps=3 .*the rows of while_loop_stack_output"):
        while_loop_stack_output(lambda c: c < 9, lambda c: c + 1, 0, max_steps=3)


def test_reverse_mode_and_stack_output_checks_are_recognised():
    f = lambda x: while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (0, x), max_steps=5)[1]  # noqa: E731
    assert _checks(jax.make_jaxpr(jax.grad(f))(1.0)) == [5]
    assert _checks(jax.make_jaxpr(f)(1.0)) == []  # the forward alone checks nothing
    g = lambda x: while_loop_stack_output(lambda c: c < 3.0, lambda c: c + x, 0.0, max_steps=4)  # noqa: E731
    assert _checks(jax.make_jaxpr(g)(1.0)) == [4]


def test_the_host_is_called_only_when_the_loop_overflows(monkeypatch):
    calls = []
    monkeypatch.setattr(overflow, "record_overflow", lambda flag, max_steps: calls.append(max_steps))

    def f(x, n):
        return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), (0, x), max_steps=5)[1]

    g = jax.jit(jax.grad(f))
    np.testing.assert_allclose(g(1.1, 3), jax.grad(lambda x: x ** 4)(1.1), rtol=1e-6)
    jax.effects_barrier()
    assert calls == []  # three steps of five: no host round trip
    assert np.isnan(g(1.1, 9))
    jax.effects_barrier()
    assert calls == [5]


def test_under_vmap_only_the_lane_that_overflows_is_nan_and_the_overflow_is_raised():
    def f(x, n):
        return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), (0, x), max_steps=5)[1]

    g = jax.jit(jax.vmap(jax.grad(f)))
    xs = jax.random.uniform(jax.random.key(3), (3,), minval=0.5, maxval=1.5)
    with reraise_overflow():
        ok = g(xs, jnp.array([1, 3, 4]))
    np.testing.assert_allclose(ok, [(n + 1) * x ** n for x, n in zip(xs.tolist(), (1, 3, 4))], rtol=1e-5)
    bad = g(xs, jnp.array([1, 9, 4]))  # a bare jit: the overflowing lane is NaN, the others are right
    assert np.isnan(bad[1]) and np.allclose(bad[::2], ok[::2])
    with pytest.raises(LoopOverflowError, match="max_steps=5"):
        with reraise_overflow():
            g(xs, jnp.array([1, 9, 4]))


def test_other_callbacks_are_not_overflow_checks():
    def f(x):
        jax.debug.callback(lambda v: None, x)
        jax.debug.print("{}", x)
        return x * 2

    closed = jax.make_jaxpr(f)(1.0)
    assert [str(e.primitive) for e in C.iter_eqns(closed) if C.is_host_callback(e)]
    assert _checks(closed) == []


def _grow(x):
    return jax.lax.while_loop(lambda s: s < 10.0, lambda s: s * 1.5, x)  # 6 iterations from 1.0


@pytest.fixture
def quiet(capfd, caplog):
    """Fails the test if anything was printed or logged (JAX logs a callback's exception)."""
    caplog.set_level(logging.DEBUG)
    yield
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("mode", [dict(max_steps=2), dict(max_steps=4, checkpoints=4), dict(max_steps=4, checkpoints=2)])
def test_overflow_raises_a_loop_overflow_error_and_prints_nothing(mode, quiet):
    limit = mode["max_steps"]
    with jaxaot.loops.patch_while_loop(**mode):
        with pytest.raises(LoopOverflowError, match=f"max_steps={limit}"):  # eager: raised in Python
            jax.grad(_grow)(1.0)
        with pytest.raises(LoopOverflowError, match=f"max_steps={limit}"):
            jax.grad(jaxaot.aot_function(_grow))(1.0)
        with pytest.raises(LoopOverflowError, match=f"max_steps={limit}"):
            jaxaot.value_and_grad(jaxaot.aot_function(_grow))(1.0)
        with pytest.raises(LoopOverflowError, match=f"max_steps={limit}"), reraise_overflow():
            jax.jit(jax.grad(_grow))(1.0)


@pytest.mark.parametrize("mode", [dict(max_steps=2), dict(max_steps=4, checkpoints=4), dict(max_steps=4, checkpoints=2)])
def test_compiled_overflow_poisons_values_and_gradients_with_nan(mode, quiet):
    # Under jit the overflow is found at run time, on every platform the same way: the
    # check's callback records it (it never raises, so no platform's callback-error
    # handling is involved), the gradients are NaN, and the runtime's scope raises. A bare
    # jit, outside any scope, gets the NaN. With max_steps alone the forward runs on past
    # the bound, so the outputs are the forward's; with checkpoints the float ones are NaN.
    def f(x):
        return jaxaot.loops.while_loop(lambda s: s[0] < 10.0, lambda s: (s[0] * x, s[1] + 1, s[2] * 2.0), (x, 0, x), **mode)

    value_and_grad = jax.jit(jax.value_and_grad(lambda x: f(x)[0] + f(x)[2], has_aux=False))
    value, grad = value_and_grad(1.5)
    forward = jax.jit(f)(1.5)
    assert np.isnan(grad)
    vjp_out = jax.jit(lambda x: jax.vjp(f, x))(1.5)[0]
    if "checkpoints" in mode:
        assert np.isnan(value) and np.isnan(vjp_out[0]) and np.isnan(vjp_out[2])
        assert int(vjp_out[1]) == mode["max_steps"]
    else:
        np.testing.assert_allclose(value, forward[0] + forward[2], rtol=1e-6)
        for a, b in zip(vjp_out, forward):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(LoopOverflowError), reraise_overflow():
        value_and_grad(1.5)
    with reraise_overflow():  # no overflow, no error, plausible numbers
        value, grad = value_and_grad(3.0)
    assert np.isfinite(value) and np.isfinite(grad)
    assert not np.isnan(jax.jit(f)(1.5)[0])  # the forward alone never stops early


def test_stack_output_overflow_under_jit_is_nan(quiet):
    f = jax.jit(lambda x: while_loop_stack_output(lambda c: c < 9.0, lambda c: c + x, 0.0, max_steps=3))
    with pytest.raises(LoopOverflowError, match="max_steps=3"), reraise_overflow():
        stacked, n = f(1.0)
    assert np.all(np.isnan(stacked)) and int(n) == 3
    with pytest.raises(LoopOverflowError, match="max_steps=3"):
        while_loop_stack_output(lambda c: c < 9.0, lambda c: c + 1.0, 0.0, max_steps=3)


def test_reraise_overflow_passes_other_errors_through():
    with pytest.raises(ZeroDivisionError):
        with reraise_overflow():
            1 / 0


@pytest.mark.parametrize("make", [
    lambda loss: jaxaot.value_and_grad(jaxaot.aot_function(loss, donate_argnums=0)),
    lambda loss: jaxaot.value_and_grad(jaxaot.aot_function(loss, donate_argnums=0), fused=False),
    lambda loss: jaxaot.compiled_value_and_grad(loss),
    lambda loss: jaxaot.grad(jaxaot.aot_function(loss, donate_argnums=0)),
    lambda loss: jaxaot.compiled_grad(loss),
])
def test_an_overflow_error_holds_the_call_s_outputs(make, quiet):
    """A call that donated its parameters has its outputs nowhere but the error: NaN gradients, as jit gives them."""
    def loss(w, x, limit):
        y, _ = while_loop(lambda c: c[1] < limit, lambda c: (jnp.tanh(c[0] @ w), c[1] + 1), (x, 0), max_steps=5)
        return jnp.sum(y ** 2)

    vg = make(loss)
    k = jax.random.split(jax.random.key(np.random.default_rng().integers(1 << 30)), 2)
    w, x = jax.random.normal(k[0], (3, 3)) / 3, jax.random.normal(k[1], (2, 3))
    got, want = vg(jnp.array(w), x, 3), jax.value_and_grad(loss)(w, x, 3)
    pair = isinstance(got, tuple)  # value_and_grad's (value, grads), or grad's grads alone: outputs as returned
    np.testing.assert_allclose(got[1] if pair else got, want[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(LoopOverflowError, match="outputs") as info:
        vg(jnp.array(w), x, 10)
    if pair:
        value, grads = info.value.outputs
        assert np.isfinite(value)
    else:
        grads = info.value.outputs
    assert np.isnan(grads).all()
