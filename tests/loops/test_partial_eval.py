"""Partial evaluation: the split into a known stacking loop and a linear counted loop."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.loops.common import counted_loop_p, while_loop_p, while_loop_stack_output_p
from jaxaot._src.loops.wrappers import while_loop


def _loop(x, n=3, **kw):
    return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.5, c[2] * 2.0), (0, x, x), **kw)


def _eqns(closed, prim):
    return [e for e in C.jaxpr_of(closed).eqns if e.primitive is prim]


def test_linearize_splits_known_stacking_and_unknown_linear_loop():
    _, lin = jax.linearize(lambda x: _loop(x, max_steps=5)[1], 0.7)
    lin_jaxpr = jax.make_jaxpr(lin)(1.0)
    assert _eqns(lin_jaxpr, counted_loop_p) and not _eqns(lin_jaxpr, while_loop_p)
    ref = jax.linearize(lambda x: lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) * 1.5, x), 0.7)[1]
    chex.assert_trees_all_close(lin(2.0), ref(2.0), rtol=1e-6)


def test_partial_eval_custom_rule_under_jax_checkpoint():
    policy = jax.checkpoint_policies.everything_saveable
    for kw in (dict(), dict(policy=policy)):
        f = jax.checkpoint(lambda x: _loop(x, max_steps=4)[1] ** 2, **kw)
        ref = lambda x: lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) * 1.5, x) ** 2  # noqa: E731
        chex.assert_trees_all_close(jax.grad(f)(0.7), jax.grad(ref)(0.7), rtol=1e-6)


def test_loop_invariant_residuals_are_hoisted_not_stacked():
    w = jnp.linspace(0.0, 1.0, 64)

    def body(c, w):
        return jnp.sin(c) * jnp.sum(jnp.cos(w))  # sin(w), a residual for dw, does not vary

    def f(w):
        return while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, body(c[1], w)), (0, 0.5), max_steps=5)[1]

    (stack,) = _eqns(jax.make_jaxpr(jax.grad(f))(w), while_loop_stack_output_p)
    stacked = [v.aval.shape for v in stack.outvars if v.aval.shape[:1] == (5,)]
    assert stacked and all(s == (5,) for s in stacked)  # per-iteration scalars only, no (5, 64) rows
    ref = jax.grad(lambda w: lax.fori_loop(0, 3, lambda i, c: body(c, w), 0.5))(w)
    chex.assert_trees_all_close(jax.grad(f)(w), ref, rtol=1e-5)


def _nest(x, depth, max_steps):
    """``depth`` nested 3-step loops, each of bound ``max_steps``."""
    def body(c):
        y = jnp.sin(c[1]) * 1.01 + 0.01
        return c[0] + 1, _nest(y, depth - 1, max_steps) if depth > 1 else y

    return while_loop(lambda c: c[0] < 3, body, (0, x), max_steps=max_steps)[1]


def _nest_ref(x, depth):
    step = lambda i, y: jnp.sin(y) * 1.01 + 0.01  # noqa: E731
    return lax.fori_loop(0, 3, lambda i, y: _nest_ref(step(i, y), depth - 1) if depth > 1 else step(i, y), x)


def test_inner_loops_are_recomputed_not_stacked_per_outer_iteration():
    # Three nested loops of max_steps=128 and a 64-float carry: stacking every inner loop's rows for
    # every outer iteration would take 128**3 rows (512 MiB); recomputed, each level keeps its own.
    x = jax.random.normal(jax.random.key(3), (64,))
    g = jax.jit(jax.grad(lambda x: _nest(x, 3, 128).sum()))
    temp = g.lower(x).compile().memory_analysis().temp_size_in_bytes
    assert temp < 4 * 3 * 128 * 64 * 4, temp  # a few rows of each level's 128, not 128**3
    chex.assert_trees_all_close(g(x), jax.grad(lambda x: _nest_ref(x, 3).sum())(x), rtol=1e-5)
