"""``max_steps=N`` in segments (CPUs): gradients, overflow and memory those of one stack, cost in the steps run."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot
from jaxaot.errors import LoopOverflowError
from jaxaot._src.loops import segments

_SEED = int(np.random.SeedSequence().entropy % 2**31)


def _inputs():
    k = jax.random.split(jax.random.key(_SEED), 3)
    return jax.random.normal(k[0], (8, 8)) / 8, jax.random.normal(k[1], (4, 8))


def _loss(w, x, n, max_steps):
    out = jaxaot.loops.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 0.05 * jnp.tanh(c[1] @ w)), (0, x),
                            max_steps=max_steps)
    return jnp.sum(out[1] ** 2)


def _scan_loss(w, x, n):
    return jnp.sum(lax.scan(lambda c, _: (c + 0.05 * jnp.tanh(c @ w), None), x, None, length=n)[0] ** 2)


@pytest.fixture
def segmented(monkeypatch):
    monkeypatch.setattr(segments, "MIN_STACK_BYTES", 0)  # the small test body's stack too
    with jaxaot.config.override(stack_segments=True):
        yield


def test_the_segment_length():
    assert [segments.segment_steps(n) for n in (128, 129, 4096, 4097, 16384)] == [None, 64, 64, 65, 128]


def test_gradients_at_every_segment_boundary_equal_one_stacks_and_scans(segmented):
    w, x = _inputs()
    grad = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)), static_argnums=3)
    for n in (0, 1, 63, 64, 65, 128, 129, 200, 300):  # S = 64 for N = 300: a first segment and 4 more
        got = grad(w, x, jnp.int32(n), 300)
        want = jax.value_and_grad(_scan_loss, argnums=(0, 1))(w, x, n)
        chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-4, custom_message=f"n={n} seed {_SEED}")
    with jaxaot.config.override(stack_segments=False):
        one_stack = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)), static_argnums=3)(w, x, jnp.int32(200), 300)
    got = grad(w, x, jnp.int32(200), 300)
    chex.assert_trees_all_close(got, one_stack, rtol=1e-5, atol=1e-4)  # the consts' sums regrouped per segment


def test_overflow(segmented):
    w, x = _inputs()
    with pytest.raises(LoopOverflowError, match="max_steps=300"):
        jax.grad(_loss)(w, x, 301, 300)
    assert np.isnan(jax.jit(jax.grad(_loss), static_argnums=3)(w, x, jnp.int32(301), 300)).all()


@pytest.mark.parametrize("stacking", ["segments", "one stack"])
def test_past_max_steps_the_outputs_are_the_loop_s_and_only_a_used_derivative_fails(stacking, monkeypatch):
    """Segments or one stack, a loop run past ``max_steps`` under reverse mode returns the outputs it returns
    undifferentiated (the counter too); a gradient through it raises eagerly and is NaN under ``jit``; a loss
    reading only the counter differentiates to 0 with no error."""
    monkeypatch.setattr(segments, "MIN_STACK_BYTES", 0)
    w, x = _inputs()

    def f(w, x, n, max_steps):
        i, h = jaxaot.loops.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 0.05 * jnp.tanh(c[1] @ w)),
                                       (0, x), max_steps=max_steps)
        return jnp.sum(h ** 2), i

    with jaxaot.config.override(stack_segments=stacking == "segments"):
        (value, i), grad = jax.jit(jax.value_and_grad(f, has_aux=True), static_argnums=3)(w, x, jnp.int32(301), 300)
        with pytest.raises(LoopOverflowError, match="max_steps=300"):
            jax.grad(lambda w: f(w, x, 301, 300)[0])(w)
        counter_only = jax.grad(lambda w: f(w, x, 301, 300)[1].astype(jnp.float32))(w)
    chex.assert_trees_all_close((value, i), (_scan_loss(w, x, 301), 301), rtol=1e-5, atol=1e-4)
    assert np.isnan(grad).all() and not np.asarray(counter_only).any()


@pytest.mark.slow  # 25 s on 2 cores
def test_lanes_of_different_lengths(segmented):
    w, x = _inputs()
    ns = jnp.array([5, 90, 250], jnp.int32)
    lanes = jax.vmap(jax.grad(_loss, argnums=1), in_axes=(None, None, 0, None))(w, x, ns, 300)
    want = jnp.stack([jax.grad(_scan_loss, argnums=1)(w, x, int(n)) for n in ns])
    chex.assert_trees_all_close(lanes, want, rtol=1e-5, atol=1e-4)


def test_memory_is_a_few_segments_not_max_steps_rows(segmented):
    # N = 16384, S = 128: two segments' residuals and 127 carries, against 16384 rows of residuals
    w, x = _inputs()

    def temp():
        g = jax.jit(jax.grad(_loss), static_argnums=3)
        return g.lower(w, x, jnp.int32(40), 16384).compile().memory_analysis().temp_size_in_bytes

    in_segments = temp()
    with jaxaot.config.override(stack_segments=False):
        one_stack = temp()
    assert one_stack > 16384 * x.size * 4 and 20 * in_segments < one_stack, (in_segments, one_stack)


def test_where_segments_apply():
    with jaxaot.config.override(stack_segments=None):
        assert segments.segments_here() == (jax.default_backend() == "cpu")  # GPUs zero a stack at full bandwidth
    with jaxaot.config.override(stack_segments=False):
        assert not segments.segments_here()
    body = lambda c: (jax.debug.callback(lambda: None) or c[0] + 1, c[1] * 1.5)  # noqa: E731
    eqn = jax.make_jaxpr(lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 3, body, (0, x), max_steps=1000))(1.0).eqns[0]
    loop = jaxaot._src.loops.common.loop_of(eqn.primitive, eqn.params)
    big = [jax.ShapeDtypeStruct((1024,), jnp.float32)]  # 4 KiB per step: a 4 MiB stack
    pure = loop.replace(body=jax.make_jaxpr(lambda c: (c[0] + 1, c[1] * 1.5))((0, 1.0)))
    with jaxaot.config.override(stack_segments=True):
        assert segments.applies(loop, big) is None  # effects: one stack
        assert segments.applies(pure, big) == 64
        assert segments.applies(pure, big[:0]) is None  # a small stack: one
