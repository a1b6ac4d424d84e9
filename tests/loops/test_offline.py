"""``while_loop(..., max_steps=N, checkpoints=k)``: the offline schedules against ``lax.fori_loop`` references.

Both schedules run on the CPU here: nested scans (GPUs' default, ``jaxaot.config.offline_schedule = "nested"``)
and the binomial schedule (the default elsewhere)."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import InvalidLoopOptionError, LoopOverflowError
from jaxaot._src.loops import reraise_overflow
from jaxaot._src.loops.offline import plan
from jaxaot._src.loops.revolve import revolve_counts
from loop_models import mlp_loss as _mlp_loss, mlp_ref as _mlp_ref, inputs as _inputs

TOL = dict(rtol=2e-5, atol=2e-6)


@pytest.fixture(params=["nested", "binomial"])
def schedule(request):
    """Each schedule of a bounded loop whose nested plan fits."""
    with jaxaot.config.override(offline_schedule=request.param):
        yield request.param


@pytest.fixture
def nested():
    """Nested scans, as on GPUs."""
    with jaxaot.config.override(offline_schedule="nested"):
        yield


@pytest.fixture
def one_stack():
    """One stack of max_steps rows (no CPU segments), as on GPUs."""
    with jaxaot.config.override(stack_segments=False):
        yield


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 120))
def test_plan_fits_the_bound_and_the_memory(n, k):
    sizes = plan(n, k)
    if sizes is None:
        assert n > k and k < 2 * math.ceil(math.log2(n)) + 2  # only small k fail
        return
    assert math.prod(sizes) >= n and sum(sizes) <= k
    # removing a step from the outer level would no longer cover n: no needless masked chunks
    assert math.prod(sizes) - math.prod(sizes[1:]) < n
    more = plan(n, k + 10)
    assert more is not None and len(more) <= len(sizes)


@pytest.mark.parametrize("n", [0, 1, 13, 40])
@pytest.mark.parametrize("jit", [False, True])
def test_gradients_match_fori_loop(n, jit, schedule):
    w, b, x = _inputs(n)
    g = jax.grad(_mlp_loss, argnums=(0, 1, 2))
    if jit:
        g = jax.jit(g, static_argnames=("max_steps", "checkpoints"))
    got = g(w, b, x, jnp.int32(n), max_steps=40, checkpoints=12)  # plan (5, 3, 3): 45 >= 40 steps
    ref = jax.grad(_mlp_ref, argnums=(0, 1, 2))(w, b, x, n)
    chex.assert_trees_all_close(got, ref, **TOL)


def test_four_levels_and_value_and_grad(schedule):
    w, b, x = _inputs(3)
    assert plan(200, 16) == (4, 4, 4, 4)
    val, got = jax.jit(jax.value_and_grad(lambda *a: _mlp_loss(*a, 157, max_steps=200, checkpoints=16),
                                          argnums=(0, 1, 2)))(w, b, x)
    ref_val, ref = jax.value_and_grad(_mlp_ref, argnums=(0, 1, 2))(w, b, x, 157)
    chex.assert_trees_all_close((val, got), (ref_val, ref), **TOL)


def test_forward_result_and_jvp_are_lax_while_loops():
    w, b, x = _inputs(5)
    chex.assert_trees_all_close(_mlp_loss(w, b, x, 9, max_steps=40, checkpoints=12), _mlp_ref(w, b, x, 9), **TOL)
    tw = jax.random.normal(jax.random.key(9), w.shape)
    got = jax.jvp(lambda w: _mlp_loss(w, b, x, 9, max_steps=40, checkpoints=12), (w,), (tw,))
    ref = jax.jvp(lambda w: _mlp_ref(w, b, x, 9), (w,), (tw,))
    chex.assert_trees_all_close(got, ref, **TOL)


def test_hessian_vector_product(schedule):
    w, b, x = _inputs(6)
    v = jax.random.normal(jax.random.key(7), x.shape)
    hvp = lambda f: jax.jvp(jax.grad(f), (x,), (v,))[1]  # noqa: E731
    chex.assert_trees_all_close(hvp(lambda x: _mlp_loss(w, b, x, 11, max_steps=40, checkpoints=12)),
                                hvp(lambda x: _mlp_ref(w, b, x, 11)), **TOL)


def test_vmap_lanes_of_different_lengths(schedule):
    w, b, _ = _inputs(8)
    xs = jax.random.normal(jax.random.key(10), (3, 4, 8))
    ns = jnp.array([0, 7, 31], jnp.int32)
    got = jax.vmap(jax.grad(lambda x, n: _mlp_loss(w, b, x, n, max_steps=40, checkpoints=12)))(xs, ns)
    got2 = jax.grad(lambda xs: jnp.sum(jax.vmap(lambda x, n: _mlp_loss(w, b, x, n, max_steps=40,
                                                                        checkpoints=12))(xs, ns)))(xs)
    ref = jnp.stack([jax.grad(lambda x: _mlp_ref(w, b, x, int(n)))(x) for x, n in zip(xs, ns)])
    chex.assert_trees_all_close(got, ref, **TOL)
    chex.assert_trees_all_close(got2, ref, **TOL)


def _descent(a, **kw):
    """Step size shrinks to exactly 0; the body's sqrt is singular there (the loop stops first)."""
    out = jaxaot.loops.while_loop(lambda c: c[1] > 0.0, lambda c: (c[0] + jnp.sqrt(c[1]) * a, jnp.maximum(c[1] - 0.25, 0.0)),
                            (jnp.float32(0.0), jnp.float32(1.0)), **kw)
    return out[0]


def test_masked_steps_are_nan_safe(schedule):
    got = jax.grad(_descent)(jnp.float32(2.0), max_steps=32, checkpoints=12)
    ref = sum(np.sqrt(1.0 - 0.25 * i) for i in range(4))
    assert np.isfinite(got) and abs(float(got) - ref) < 1e-5
    lanes = jax.grad(lambda a: jnp.sum(jax.vmap(lambda a: _descent(a, max_steps=32, checkpoints=12))(a)))(
        jnp.array([1.0, 2.0, 3.0]))
    chex.assert_trees_all_close(lanes, jnp.full((3,), ref), **TOL)


def test_overflow_raises_loop_overflow_error(schedule):
    w, b, x = _inputs(11)
    with pytest.raises(LoopOverflowError, match="max_steps=40"):
        jax.grad(_mlp_loss)(w, b, x, 41, max_steps=40, checkpoints=12)
    g = jax.jit(jax.grad(lambda w, n: _mlp_loss(w, b, x, n, max_steps=40, checkpoints=12)))
    with pytest.raises(LoopOverflowError, match="max_steps=40"), reraise_overflow():
        jax.block_until_ready(g(w, 41))
    chex.assert_trees_all_close(g(w, 40), jax.grad(_mlp_ref)(w, b, x, 40), **TOL)  # still works afterwards


def _slow_drift(x, n, **kw):  # a cheap body whose gradient stays away from 0 and inf for 10,000 steps
    return jaxaot.loops.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 1e-3 * jnp.cos(c[1])), (0, x), **kw)[1]


def _slow_drift_scan(x, n):
    return jax.lax.scan(lambda v, _: (v + 1e-3 * jnp.cos(v), None), x, None, length=n)[0]


@pytest.mark.parametrize("k,bound,n", [(1, 300, 300), (2, 2000, 1999), (3, 10_000, 10_000), (3, 16, 7), (2, 16, 0)])
def test_too_few_checkpoints_for_nested_scans_run_the_binomial_schedule(k, bound, n):
    # plan() needs k >= about 2 log2(N); below, the bounded binomial schedule takes any k >= 1.
    assert plan(bound, k) is None
    got = jax.jit(jax.value_and_grad(lambda x: _slow_drift(x, n, max_steps=bound, checkpoints=k)))(0.3)
    chex.assert_trees_all_close(got, jax.value_and_grad(_slow_drift_scan)(0.3, n), rtol=1e-5)
    if n >= 100:  # forward evaluations (the forward pass and the recomputation) against revolve's optimum
        assert revolve_counts(n, k).ratio <= 1.10, revolve_counts(n, k)


def test_binomial_schedule_overflow_and_effects():
    f = lambda x, n: _slow_drift(x, n, max_steps=16, checkpoints=2)  # noqa: E731
    with pytest.raises(LoopOverflowError, match="max_steps=16"):
        jax.grad(f)(0.3, 17)
    assert np.isnan(jax.jit(jax.grad(f))(0.3, 17))
    body = lambda c: (jax.debug.callback(lambda: None) or c[0] + 1, c[1] * 1.5)  # noqa: E731
    g = jax.grad(lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 5, body, (0, x), max_steps=16, checkpoints=2)[1])
    assert float(g(1.0)) == 1.5 ** 5  # no masked steps, so effects are allowed


def test_refusals():
    def body(c):
        jax.debug.print("step {}", c)
        return c + 1.0
    with pytest.raises(InvalidLoopOptionError, match="effects"):
        jaxaot.loops.while_loop(lambda c: c < 5.0, body, 0.0, max_steps=40, checkpoints=12)


def test_memory_stays_within_the_plan(schedule, one_stack):
    """Compiled temporaries: the offline schedule keeps far less than stacking every step."""
    w, b, x = _inputs(12, width=64)
    x = jnp.tile(x, (16, 1))  # a (64, 64) carry, 16 KiB

    def temp(**kw):
        g = jax.jit(jax.grad(lambda w: _mlp_loss(w, b, x, 300, **kw)))
        return g.lower(w).compile().memory_analysis().temp_size_in_bytes

    offline, stacked = temp(max_steps=400, checkpoints=24), temp(max_steps=400)
    assert offline * 4 < stacked, (offline, stacked)


def test_a_large_body_is_not_unrolled(nested):
    # The innermost level unrolls small bodies (up to 16) but not large ones: the program holds
    # one body per level (the forward of each jax.checkpoint level), not 16 per level.
    ws = [jnp.full((4, 4), 0.1 * i) for i in range(40)]

    def step(x):
        for w in ws:
            x = x + 0.01 * jnp.tanh(x @ w)
        return x

    def loss(x, **kw):
        return jnp.sum(jaxaot.loops.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, step(c[1])), (0, x), **kw)[1])

    def program(fn, x):  # jaxaot's program: the body's tanhs and the scans' unroll factors
        eqns = list(C.iter_eqns(jax.make_jaxpr(fn)(x)))
        return sum(str(e.primitive) == "tanh" for e in eqns), [e.params["unroll"] for e in eqns
                                                               if str(e.primitive) == "scan"]

    def compiled(fn, x):  # in the optimized program, where XLA has inlined the unrolled steps
        return jax.jit(fn).lower(x).compile().as_text().count(" tanh(")

    levels = len(plan(100, 16))  # (4, 5, 5): three levels
    big = jax.grad(lambda x: loss(x, max_steps=100, checkpoints=16))
    tanhs, unroll = program(big, jnp.ones((2, 4)))
    assert tanhs == levels * len(ws) and set(unroll) == {1}  # one body per level, none unrolled
    # XLA's GPU fusion computes an elementwise producer again in each consumer fusion: the innermost
    # level's recomputation, which stores the step's residual (1 - tanh^2) in its own
    # dynamic-update-slice fusion, evaluates the body's tanhs there a second time. CPUs keep one copy.
    again = 1 if jax.default_backend() == "gpu" else 0
    assert compiled(big, jnp.ones((2, 4))) == (levels + again) * len(ws)
    small = jax.grad(lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, jnp.tanh(c[1])),
                                                 (0, x), max_steps=100, checkpoints=16)[1])
    assert max(program(small, 1.0)[1]) == 5 and compiled(small, 1.0) > 3 * levels  # a small body is unrolled
