"""NaN and Inf propagate exactly as in ``jax.grad``; ``jax.debug_nans`` / ``debug_infs`` through aot_function."""

from __future__ import annotations

import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reliability.fuzzlib import PARTITIONERS, assert_close

import jaxaot


def where_sqrt(x, w):  # the where-trap: JAX's gradient is NaN where x < 0
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0) * w)


def log_at_zero(x, w):  # -inf output, inf gradient
    return jnp.sum(jnp.log(jnp.abs(x)) * w)


def overflow(x, w):  # exp overflows to inf in float32; its gradient too
    return jnp.sum(jnp.exp(x * 100.0) * w)


def inf_minus_inf(x, w):  # inf - inf = NaN in the forward, NaN gradients
    e = jnp.exp(x * 100.0)
    return jnp.sum((e - e) * w + jnp.sin(x))


def recompute_bait(x, w):  # cheap ops min-cut recomputes around values that are NaN/Inf in places
    h = jnp.tanh(x) / x  # 0/0 = NaN at x == 0
    g = jnp.exp(x * 80.0) * jnp.cos(w)
    return jnp.sum(jnp.sin(h) * g + jnp.sqrt(jnp.abs(w)) * h)


FUNCTIONS = [where_sqrt, log_at_zero, overflow, inf_minus_inf, recompute_bait]


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(8).astype(np.float32)
    x[:3] = [0.0, -0.0, 2.0]  # exact zeros and a value that overflows exp(100 x)
    w = rng.standard_normal(8).astype(np.float32)
    w[5] = 0.0
    return jnp.asarray(x), jnp.asarray(w)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_nan_and_inf_propagate_as_in_jax(fn):
    args = _inputs(0)
    want = jax.value_and_grad(fn, argnums=(0, 1))(*args)
    leaves = np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree_util.tree_leaves(want)])
    assert not np.isfinite(leaves).all(), "the case must actually produce NaN or Inf"
    for pname, partition in PARTITIONERS.items():
        f = jaxaot.aot_function(fn, partition_fn=partition)
        assert_close(jaxaot.value_and_grad(f, argnums=(0, 1))(*args), want, "float32", f"{pname}/eager")
        assert_close(jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(*args), want, "float32", f"{pname}/jit")
        out, res = f.forward(*args)
        assert_close((out, f.backward(res, jnp.float32(1))), want, "float32", f"{pname}/split")


def log_line(x):
    y = jnp.log(x)  # NAN SOURCE
    return jnp.sum(y * 2.0)


def exp_line(x):
    y = jnp.exp(x * 1000.0)  # INF SOURCE
    return jnp.sum(y)


def _raised(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - inspected by the caller
        return err, "".join(traceback.format_exception(err))
    return None, ""


def test_debug_nans_without_aot_names_the_line():  # the behaviour the aot test below asks for
    with jax.debug_nans(True):
        err, tb = _raised(lambda: jax.grad(log_line)(jnp.array([1.0, -1.0])))
    assert isinstance(err, FloatingPointError) and "NAN SOURCE" in tb


@pytest.mark.parametrize("flag,fn,x,marker", [
    ("debug_nans", log_line, [1.0, -1.0], "NAN SOURCE"),
    ("debug_infs", exp_line, [1.0, 0.0], "INF SOURCE"),
])
def test_debug_nans_and_infs_through_aot_function_name_the_line(flag, fn, x, marker):
    f = jaxaot.aot_function(fn)
    x = jnp.array(x)
    for call in (lambda: f(x), lambda: jax.grad(f)(x), lambda: jaxaot.value_and_grad(f)(x)):
        with getattr(jax, flag)(True):
            err, tb = _raised(call)
        assert isinstance(err, FloatingPointError), f"raised {type(err).__name__}: {err}"
        assert marker in tb
    assert jnp.isfinite(jax.grad(f)(jnp.array([1e-3, 2e-3]))).all()  # and it still works afterwards
