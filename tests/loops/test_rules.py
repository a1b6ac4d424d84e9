"""The loop primitives' rules: jaxprs, abstract eval, impl, JVP, transpose, batching, DCE."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.loops.common import counted_loop_p, while_loop_p, while_loop_stack_output_p
from jaxaot._src.loops.wrappers import while_loop, while_loop_stack_output


def _loop(x, n=3, **kw):
    return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.5, c[2] * 2.0), (0, x, x), **kw)


def _eqns(closed, prim):
    return [e for e in C.jaxpr_of(closed).eqns if e.primitive is prim]


def test_primitives_appear_readably_in_jaxprs():
    text = str(jax.make_jaxpr(lambda x: _loop(x, max_steps=4))(1.0))
    assert "while_loop[" in text and "body_jaxpr=" in text and "max_steps=4" in text
    stack = str(jax.make_jaxpr(lambda x: while_loop_stack_output(lambda c: c < 3.0, jnp.sin, x, max_steps=5))(1.0))
    assert "while_loop_stack_output[" in stack
    grad = str(jax.make_jaxpr(jax.grad(lambda x: _loop(x, max_steps=4)[1]))(1.0))
    assert "while_loop_stack_output[" in grad and "counted_loop[" in grad and "reverse=True" in grad


def test_bind_abstract_eval_and_impl():
    closed = jax.make_jaxpr(lambda x: while_loop_stack_output(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] * 3.0),
                                                              (0, x), max_steps=4))(jnp.ones(2))
    (eqn,) = _eqns(closed, while_loop_stack_output_p)
    avals = [v.aval for v in eqn.outvars]
    assert [a.shape for a in avals] == [(), (2,), (4,), (4, 2), (), ()]
    assert [a.dtype for a in avals[-2:]] == [np.int32, np.bool_]
    outs = while_loop_stack_output_p.bind(0, jnp.ones(2), **eqn.params)  # the impl, eagerly
    chex.assert_trees_all_close(outs[1], jnp.full(2, 9.0))
    assert int(outs[4]) == 2 and not bool(outs[5])
    chex.assert_trees_all_close(outs[3][:2], jnp.array([[3.0, 3.0], [9.0, 9.0]]))


def test_counted_loop_reverse_reads_and_writes_rows_backwards():
    body = jax.make_jaxpr(lambda c, x: [c + x, c])(0.0, 0.0)
    xs = jnp.array([1.0, 2.0, 4.0, 8.0])
    c, ys = counted_loop_p.bind(3, 0.0, xs, body_jaxpr=body, num_consts=0, num_carry=1, length=4, reverse=True)
    # iterations visit rows 2, 1, 0: carry 0 -> 4 -> 6 -> 7; row j gets the carry before it
    assert float(c) == 7.0
    chex.assert_trees_all_close(ys, jnp.array([6.0, 4.0, 0.0, 0.0]))


def test_jvp_rule_keeps_the_primitive():
    jaxpr = jax.make_jaxpr(lambda x, t: jax.jvp(lambda x: _loop(x)[1], (x,), (t,)))(1.0, 1.0)
    (eqn,) = _eqns(jaxpr, while_loop_p)
    assert len(eqn.outvars) == 5  # counter, 2 primal carries, 2 tangent carries
    ref = jax.jvp(lambda x: lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) * 1.5, x), (0.7,), (1.0,))
    chex.assert_trees_all_close(jax.jvp(lambda x: _loop(x)[1], (0.7,), (1.0,)), ref, rtol=1e-6)


def test_transpose_of_counted_loop_is_a_reverse_loop_with_const_cotangents():
    w = jnp.array([[0.5, -1.0], [2.0, 0.3]])
    # linear in (w, c) jointly, so both get cotangents from the transpose
    body = jax.make_jaxpr(lambda w, c, r: [jnp.tanh(r) * c + r @ w])(w, jnp.ones(2), jnp.ones(2))
    rows = jax.random.normal(jax.random.PRNGKey(0), (5, 2))

    def linear(w, c, n):
        return counted_loop_p.bind(n, w, c, rows, body_jaxpr=body, num_consts=1, num_carry=1, length=5,
                                     reverse=False)[0]

    def ref(w, c, n):
        return lax.fori_loop(0, n, lambda i, c: jnp.tanh(rows[i]) * c + rows[i] @ w, c)

    ct = jnp.array([1.0, -2.0])
    for n in (0, 2, 5):
        got = jax.linear_transpose(lambda w, c: linear(w, c, n), w, jnp.ones(2))(ct)
        want = jax.vjp(lambda w, c: ref(w, c, n), w, jnp.ones(2))[1](ct)
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)
    tjaxpr = jax.make_jaxpr(lambda ct: jax.linear_transpose(lambda c: linear(w, c, 3), jnp.ones(2))(ct))(ct)
    assert True in [e.params["reverse"] for e in _eqns(tjaxpr, counted_loop_p)]


def test_batching_rule_per_lane_trip_counts():
    ns = jnp.array([0, 1, 4])
    xs = jnp.array([0.3, 0.5, 0.7])
    got = jax.vmap(lambda x, n: _loop(x, n)[1])(xs, ns)
    want = jnp.stack([lax.fori_loop(0, int(n), lambda i, v: jnp.sin(v) * 1.5, x) for x, n in zip(xs, ns)])
    chex.assert_trees_all_close(got, want, rtol=1e-6)
    stacked, n = jax.vmap(lambda x, m: while_loop_stack_output(lambda c: c[0] < m, lambda c: (c[0] + 1, c[1] + 1.0),
                                                                (0, x), max_steps=4))(xs, ns)
    chex.assert_trees_all_equal(n, ns.astype(jnp.int32))
    chex.assert_trees_all_close(stacked[1][2], xs[2] + jnp.arange(1.0, 5.0))


@pytest.mark.parametrize("kw", [{}, {"max_steps": 8}, {"checkpoints": 2}])
def test_batching_leaves_unbatched_carries_unbatched(kw):
    # jax.jacfwd is a vmap over tangents: the primal carries must come out unbatched.
    x = jnp.array([0.3, -0.2, 0.9])
    got = jax.jacfwd(lambda v: _loop(v, 5, **kw)[1])(x)
    want = jax.jacfwd(lambda v: lax.fori_loop(0, 5, lambda i, a: jnp.sin(a) * 1.5, v))(x)
    chex.assert_trees_all_close(got, want, rtol=1e-5)
    out = jax.vmap(lambda s: _loop(x * s, 4, **kw), in_axes=None, axis_size=2)(1.0)  # nothing batched
    assert out[1].shape == (2, 3)


def test_dce_rule_drops_unused_carries():
    closed = jax.make_jaxpr(lambda x: _loop(x)[1])(1.0)
    (eqn,) = _eqns(closed, while_loop_p)
    used_inputs, new = C.dce_rules[while_loop_p]([False, True, False], eqn)
    assert used_inputs == [True, True, False]  # the counter feeds cond; the third carry is dead
    assert len(new.outvars) == 2 and new.params["body_jaxpr"].out_avals[1].shape == ()
    assert C.dce_rules[while_loop_p]([False] * 3, eqn) == ([False] * 3, None)


@pytest.mark.parametrize("prim", [while_loop_p, while_loop_stack_output_p])
def test_cond_on_a_differentiated_value_has_a_clear_transpose_error(prim):
    with pytest.raises(Exception, match="cannot be transposed"):
        C.primitive_transposes[prim](None)


def test_rules_are_registered_for_the_tracer():
    for p in (while_loop_p, while_loop_stack_output_p, counted_loop_p):
        assert C.has_jvp_rule(p)


@pytest.mark.parametrize("mode", [dict(max_steps=16), dict(checkpoints=3)])
def test_finished_lanes_contribute_exactly_zero_under_vmap(mode):
    # Each lane stops when its state reaches 0, where sqrt has an infinite derivative:
    # a finished lane's zero cotangent must be selected, never multiplied by it.
    def f(x):
        body = lambda c: (c[0] + jnp.sqrt(c[1]), jnp.maximum(c[1] - 1.0, 0.0))  # noqa: E731
        return while_loop(lambda c: c[1] > 0, body, (0.0, x), **mode)[0]

    xs = jnp.asarray(np.random.default_rng().uniform(0.5, 6.0, 5), jnp.float32)
    summed = jax.jit(jax.grad(lambda xs: jnp.sum(jax.vmap(f)(xs))))(xs)
    lane_grad = jax.jit(jax.grad(f))
    per_lane = jnp.stack([lane_grad(x) for x in xs])
    assert np.all(np.isfinite(summed))
    np.testing.assert_allclose(summed, per_lane, rtol=1e-5)


@pytest.mark.parametrize("mode", [dict(max_steps=8), dict(checkpoints=2)])
def test_read_only_carry_stays_unbatched_and_differentiates(mode):
    # w is read only (the body returns it unchanged) and the trip count is per lane: w stays
    # unbatched (out_axes=None accepts it), and its gradient sums the lanes' gradients.
    def f(w, x, n):
        _, x, w = while_loop(lambda v: v[0] < n, lambda v: (v[0] + 1, jnp.tanh(v[1] @ v[2]), v[2]), (0, x, w), **mode)
        return w, x

    w = jnp.asarray(np.random.default_rng().uniform(-1, 1, (2, 2)), jnp.float32)
    xs, ns = jnp.ones((4, 2)), jnp.arange(4)
    w_out, _ = jax.vmap(f, in_axes=(None, 0, 0), out_axes=(None, 0))(w, xs, ns)
    chex.assert_trees_all_equal(w_out, w)
    loss = lambda w: jnp.sum(jax.vmap(f, in_axes=(None, 0, 0))(w, xs, ns)[1])  # noqa: E731
    per_lane = sum(jax.grad(lambda w, x, n: jnp.sum(f(w, x, n)[1]))(w, x, n) for x, n in zip(xs, ns))
    chex.assert_trees_all_close(jax.grad(loss)(w), per_lane, rtol=1e-5)


def test_stacked_rows_under_vmap_are_each_lanes_rows_and_differentiate():
    # A lane that stops early has zero rows past its num_steps, as it has without vmap, never rows of
    # a state it did not reach: vmap's output is the lanes' outputs stacked, and a loss over every row
    # has the gradient of the values computed (central differences, and the lanes' own gradients).
    rng = np.random.default_rng()
    ns = jnp.asarray(rng.permutation([0, 1, 3, 4, 4, 2]), jnp.int32)  # 0 and max_steps among them
    with jax.enable_x64(True):
        xs = jnp.asarray(rng.uniform(-1.0, 1.0, 6))
        weights = jnp.asarray(rng.uniform(0.5, 1.5, (6, 4)))

        def rows(x, n):
            (i, ys), num_steps = while_loop_stack_output(
                lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1]) + 0.5 * x), (0, x), max_steps=4)
            return i, ys, num_steps

        got = jax.jit(jax.vmap(rows))(xs, ns)
        lanes = jax.jit(rows)
        want = [jnp.stack(r) for r in zip(*[lanes(x, n) for x, n in zip(xs, ns)])]
        chex.assert_trees_all_equal(got, tuple(want))
        chex.assert_trees_all_equal(got[2], ns)

        def loss(xs):
            return jnp.sum(jax.vmap(rows)(xs, ns)[1] * weights)

        grad = jax.jit(jax.grad(loss))(xs)
        lane_loss = jax.jit(jax.grad(lambda x, n, w: jnp.sum(rows(x, n)[1] * w)))
        per_lane = jnp.stack([lane_loss(x, n, w) for x, n, w in zip(xs, ns, weights)])
        eps = 1e-6
        fd = jnp.stack([(loss(xs.at[j].add(eps)) - loss(xs.at[j].add(-eps))) / (2 * eps) for j in range(6)])
        chex.assert_trees_all_close(grad, per_lane, rtol=1e-12, atol=1e-12)
        chex.assert_trees_all_close(grad, fd, rtol=1e-6, atol=1e-8)
