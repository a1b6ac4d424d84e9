"""``checkpoint_memory="host"``: the offline schedule with its snapshots in host memory."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxaot
from jaxaot.errors import InvalidLoopOptionError, LoopOverflowError
from jaxaot._src.loops import reraise_overflow
from jaxaot._src.loops.offline import MAX_UNROLL, plan_host
from loop_models import mlp_loss as _loss, mlp_ref as _ref, inputs as _inputs

TOL = dict(rtol=2e-5, atol=2e-6)
HOST = dict(checkpoint_memory="host")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200_000), st.integers(1, 2000))
def test_plan_keeps_a_bounded_level_on_the_device(n, k):
    sizes = plan_host(n, k)
    if sizes is None:
        assert k < 2 * math.ceil(math.log2(math.ceil(n / MAX_UNROLL))) + 2  # only small k fail
        return
    assert math.prod(sizes) >= n
    assert sizes[-1] <= MAX_UNROLL  # the device's share does not grow with n or k
    assert sum(sizes[:-1]) <= k  # host snapshots


@pytest.mark.parametrize("n", [0, 1, 16, 17, 150, 400])
def test_gradients_match_fori_loop(n):
    w, b, x = _inputs(n)
    g = jax.jit(jax.grad(lambda w, b, x, n: _loss(w, b, x, n, max_steps=400, checkpoints=12, **HOST),
                         argnums=(0, 1, 2)))
    assert plan_host(400, 12) == (5, 5, 16)
    chex.assert_trees_all_close(g(w, b, x, jnp.int32(n)), jax.grad(_ref, argnums=(0, 1, 2))(w, b, x, n), **TOL)


def test_snapshots_are_host_residuals():
    """The stacked snapshots of every outer level have host memory space in the jaxpr."""
    w, b, x = _inputs(1)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: _loss(w, b, x, 100, max_steps=400, checkpoints=12, **HOST)))(x)
    assert "f32<host>[5,4,8]" in str(jaxpr)
    device = jax.make_jaxpr(jax.grad(lambda x: _loss(w, b, x, 100, max_steps=400, checkpoints=24)))(x)
    assert "<host>" not in str(device)


@pytest.mark.slow
def test_vmap_jvp_and_value_and_grad():
    w, b, _ = _inputs(2)
    xs = jax.random.normal(jax.random.key(3), (3, 4, 8))
    ns = jnp.array([0, 20, 90], jnp.int32)
    f = lambda x, n: _loss(w, b, x, n, max_steps=100, checkpoints=8, **HOST)  # noqa: E731
    got = jax.grad(lambda xs: jnp.sum(jax.vmap(f)(xs, ns)))(xs)
    ref = jnp.stack([jax.grad(lambda x: _ref(w, b, x, int(n)))(x) for x, n in zip(xs, ns)])
    chex.assert_trees_all_close(got, ref, **TOL)
    chex.assert_trees_all_close(jax.value_and_grad(f)(xs[2], 90), jax.value_and_grad(_ref, argnums=2)(w, b, xs[2], 90),
                                **TOL)
    tx = jax.random.normal(jax.random.key(4), xs[1].shape)
    chex.assert_trees_all_close(jax.jvp(lambda x: f(x, 20), (xs[1],), (tx,)),
                                jax.jvp(lambda x: _ref(w, b, x, 20), (xs[1],), (tx,)), **TOL)


def test_overflow_and_patch():
    w, b, x = _inputs(5)
    g = jax.jit(jax.grad(lambda w, n: _loss(w, b, x, n, max_steps=40, checkpoints=6, **HOST)))
    with pytest.raises(LoopOverflowError, match="max_steps=40"), reraise_overflow():
        jax.block_until_ready(g(w, 41))
    chex.assert_trees_all_close(g(w, 40), jax.grad(_ref)(w, b, x, 40), **TOL)  # still works afterwards

    def library(w):  # third-party code calling jax.lax.while_loop
        out = jax.lax.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, c[1] + 0.1 * jnp.tanh(c[1] @ w + b)),
                                 (0, x))
        return jnp.sum(out[1] ** 2)

    with jaxaot.loops.patch_while_loop(max_steps=64, checkpoints=6, checkpoint_memory="host"):
        got = jax.grad(library)(w)
    chex.assert_trees_all_close(got, jax.grad(_ref)(w, b, x, 30), **TOL)


def test_refusals():
    body = lambda c: c + 1.0  # noqa: E731
    with pytest.raises(InvalidLoopOptionError, match="checkpoint_memory must be one of"):
        jaxaot.loops.while_loop(lambda c: c < 5.0, body, 0.0, max_steps=40, checkpoints=12, checkpoint_memory="gpu")
    with pytest.raises(InvalidLoopOptionError, match="needs both max_steps"):
        jaxaot.loops.while_loop(lambda c: c < 5.0, body, 0.0, checkpoints=12, checkpoint_memory="host")
    with pytest.raises(InvalidLoopOptionError, match="needs both max_steps"):
        with jaxaot.loops.patch_while_loop(max_steps=40, checkpoint_memory="host"):
            pass
    # too few host snapshots for nested scans: the binomial schedule, its k + 1 snapshots on the device
    f = lambda x: jaxaot.loops.while_loop(lambda c: c < 5.0, lambda c: c * x + 1.0, 0.0,  # noqa: E731
                                    max_steps=100_000, checkpoints=5, checkpoint_memory="host")
    assert float(jax.grad(f)(1.0)) == 10.0  # c = 1, 2, 3, 4, 5 after five steps: d/dx sum = 0+1+2+3+4


@pytest.mark.slow
def test_device_memory_does_not_grow_with_the_bound():
    """Compiled device temporaries of the host schedule are flat in max_steps (CPU: host and
    device share memory, so this checks the device schedule's share: the innermost level)."""
    w, b, x = _inputs(12, width=64)
    x = jnp.tile(x, (16, 1))  # a (64, 64) carry, 16 KiB

    def temp(bound):
        g = jax.jit(jax.grad(lambda w: _loss(w, b, x, 300, max_steps=bound, checkpoints=64, **HOST)))
        return g.lower(w).compile().memory_analysis().temp_size_in_bytes

    small, large = temp(1_000), temp(60_000)
    assert large <= 1.1 * small, (small, large)
