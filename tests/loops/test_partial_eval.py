"""Partial evaluation: the split into a known stacking loop and a linear counted loop."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.loops import differentiable
from jaxaot._src.loops.common import counted_loop_p, while_loop_p, while_loop_stack_output_p
from jaxaot._src.loops.wrappers import while_loop

_SEED = int(np.random.SeedSequence().entropy % 2**31)


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


def _nest_of_kinds(p, depth):
    """``depth`` nested ``lax.while_loop``s over a carry ``(k, t, y)``. Level 0 stops on its integer counter
    ``k``, odd levels on the float ``t``, the others on ``k``, a closed-over differentiated value and ``y``.
    Every body reads the differentiated values of all the levels around it and runs the next level; below
    level 0 it advances ``t`` by a loop of its own whose inputs carry no derivative that reaches its output:
    ``t`` and, at levels 1, 5, ..., the ``floor`` of a closed-over differentiated value."""
    def level(i, y0, env):
        def derivative_free(t):
            step = 0.3 + (0.05 * jnp.clip(jnp.floor(4 * jnp.mean(jnp.abs(env[-1]))), 0, 4) if i % 4 == 1 else 0.1)
            return lax.while_loop(lambda d: d[0] < 2, lambda d: (d[0] + 1, d[1] + step), (0, t))[1]

        def cond(c):
            k, t, y = c
            if i == 0:
                return k < 2
            if i % 2:
                return t < 1.0
            return (k < 2) & jnp.all(env[0] < 100.0) & jnp.all(jnp.abs(y) < 100.0)

        def body(c):
            k, t, y = c
            z = level(i + 1, y, [*env, y]) if i + 1 < depth else y
            read = sum(0.1 * (j + 1) * e for j, e in enumerate(env))
            return k + 1, derivative_free(t) if i else t, jnp.sin(z) * 0.8 + read * jnp.cos(y)

        return lax.while_loop(cond, body, (0, jnp.zeros((), y0.dtype), y0))[2]

    return jnp.sum(level(0, p, [p]) ** 2)


@pytest.mark.parametrize("depth,mode", [(3, dict(max_steps=8)), (4, dict(max_steps=8)),
                                        pytest.param(3, dict(checkpoints=2), marks=pytest.mark.slow),
                                        pytest.param(4, dict(max_steps=8, checkpoints=3), marks=pytest.mark.slow)])
def test_conditions_may_read_inner_loops_without_derivatives(depth, mode):
    # A loop whose inputs carry no derivative that reaches an output is known, also under the
    # jax.checkpoint that wraps each inner loop in its outer loop's backward: a loop around it whose
    # condition reads its results splits into stacking and linear loops as any other, at any depth.
    p = jnp.asarray(np.random.default_rng(_SEED).uniform(-1.0, 1.0, 3), jnp.float32)
    got = jax.grad(differentiable(lambda p: _nest_of_kinds(p, depth), **mode))(p)
    with jax.enable_x64(True):  # float64 central differences of the same program
        shifts = 1e-6 * np.eye(3)
        q = np.asarray(p, np.float64)
        values = jax.jit(jax.vmap(lambda q: _nest_of_kinds(q, depth)))(np.concatenate([q + shifts, q - shifts]))
        fd = np.asarray(values[:3] - values[3:]) / 2e-6
    np.testing.assert_allclose(got, fd, rtol=1e-4, atol=1e-6, err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("policy", ["everything_saveable", "nothing_saveable", "dots_saveable"])
def test_a_checkpointed_loop_without_derivatives_stays_known(policy):
    # Under any policy, the outer loop's condition reads the inner loop's result as a known value.
    rule = getattr(jax.checkpoint_policies, policy)
    p = jnp.float32(np.random.default_rng(_SEED).uniform(1.2, 1.8))  # floor(p) = 1: three outer steps

    def f(p):
        bound = jax.checkpoint(lambda p: while_loop(lambda d: d[0] < 2, lambda d: (d[0] + 1, d[1] + jnp.floor(p)),
                                                    (0, 0.3), max_steps=4)[1], policy=rule)(p)
        return while_loop(lambda c: c[0] < bound, lambda c: (c[0] + 1.0, jnp.sin(c[1]) * p), (0.0, p), max_steps=8)[1]

    ref = jax.grad(lambda p: lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) * p, p))(p)
    chex.assert_trees_all_close(jax.grad(jax.checkpoint(f, policy=rule))(p), ref, rtol=1e-5)
    chex.assert_trees_all_close(jax.jit(jax.grad(f))(p), ref, rtol=1e-5)


@pytest.mark.parametrize("mode", [dict(max_steps=2), dict(), dict(checkpoints=2), dict(max_steps=2, checkpoints=1)])
def test_a_loop_whose_outputs_carry_no_derivative_runs_to_its_end(mode):
    # The condition reads the differentiated x, the outputs do not depend on it: the loop runs as it runs
    # without differentiation, past max_steps and without one, and reverse mode transposes none of it.
    x = jnp.float32(np.random.default_rng(_SEED).uniform(0.55, 0.95))

    def f(x):
        n = while_loop(lambda c: c[1] < x * 10, lambda c: (c[0] + 1, c[1] + 1.0), (0, 0.0), **mode)[0]
        return x * n

    n = float(np.ceil(10 * np.float32(x)))  # the trip count, more than max_steps
    assert float(jax.grad(f)(x)) == n and float(jax.jit(jax.grad(f))(x)) == n
