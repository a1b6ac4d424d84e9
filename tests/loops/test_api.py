"""jaxaot.loops.while_loop / while_loop_stack_output against lax.while_loop and lax.scan.

Everything here goes through the public functions, in the three memory modes of
reverse mode (``max_steps``, ``checkpoints``, ``dynamic_capacity``).

Reference: the same computation with ``lax.scan`` over the observed trip count
(differentiated by JAX), plus float64 finite differences for a few cases.
"""

from __future__ import annotations

import contextlib
import typing

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxaot
from jaxaot.errors import (
    InvalidLoopOptionError,
    LoopCarryMismatchError,
    LoopFunctionError,
    LoopOverflowError,
    ReverseModeBoundError,
)
from jaxaot._src.loops.wrappers import while_loop, while_loop_stack_output
from jaxaot._src.loops.capacity import dynamic_capacity
from jaxaot._src.loops.overflow import reraise_overflow

MODES = {
    "max_steps": dict(max_steps=16),
    "checkpoints": dict(checkpoints=3),
    "dynamic": dict(),  # run inside dynamic_capacity
}


def _mode_ctx(mode: str):
    return dynamic_capacity(16) if mode == "dynamic" else contextlib.nullcontext()


def _params(seed: int, width: int = 4, batch: int = 3):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = jax.random.normal(k[0], (width, width)) * 0.6
    b = jax.random.normal(k[1], (width,)) * 0.3
    x = jax.random.normal(k[2], (batch, width))
    return w, b, x


def _mlp_step(x, w, b):
    return jnp.tanh(x @ w + b)


def loop_mlp(w, b, x, n, **kw):
    """n tanh steps as a while loop whose trip count comes from an int carry."""
    out = while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, _mlp_step(c[1], w, b)), (0, x), **kw)
    return jnp.sum(out[1] ** 2)


def scan_mlp(w, b, x, n):
    out, _ = lax.scan(lambda c, _: (_mlp_step(c, w, b), None), x, None, length=n)
    return jnp.sum(out**2)


def _grads(fn, *args, **kw):
    # jit: one compilation instead of one per primitive (eager mode recompiles each loop)
    # (the trip count, args[3], is static: lax.scan needs it)
    return jax.jit(lambda *a: jax.grad(lambda *b: fn(*b, **kw), argnums=(0, 1, 2))(*a), static_argnums=3)(*args)


# --------------------------------------------------------------------------- forward semantics
@pytest.mark.parametrize(
    "init",
    [
        (0, 1.0),  # Python scalars: weak types
        (jnp.int32(0), jnp.float32(1.0)),
        {"i": 0, "v": np.ones(3, np.float32)},
    ],
)
def test_forward_matches_lax(init):
    cond = lambda c: jax.tree_util.tree_leaves(c)[0] < 4  # noqa: E731
    body = lambda c: jax.tree_util.tree_map(lambda x: x + 1, c)  # noqa: E731
    ours = while_loop(cond, body, init)
    ref = lax.while_loop(cond, body, init)
    chex.assert_trees_all_equal(ours, ref)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == b.dtype and a.weak_type == b.weak_type


class Point(typing.NamedTuple):
    x: jax.Array
    y: jax.Array


@jax.tree_util.register_pytree_node_class
class Box:
    """A custom pytree node (not a tuple/dict)."""

    def __init__(self, v, n):
        self.v, self.n = v, n

    def tree_flatten(self):
        return (self.v, self.n), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@pytest.mark.smoke
def test_custom_pytree_carry_and_grad():
    def f(a):
        out = while_loop(lambda b: b.n < 3, lambda b: Box(Point(b.v.x * a, b.v.y + a), b.n + 1),
                         Box(Point(a, a), 0), max_steps=5)
        return out.v.x + out.v.y

    def ref(a):
        v = Point(a, a)
        for _ in range(3):
            v = Point(v.x * a, v.y + a)
        return v.x + v.y

    chex.assert_trees_all_close(jax.grad(f)(1.3), jax.grad(ref)(1.3), rtol=1e-6)


def test_disable_jit_forward_and_grad():
    w, b, x = _params(1)
    with jax.disable_jit():
        chex.assert_trees_all_close(loop_mlp(w, b, x, 3, max_steps=4), scan_mlp(w, b, x, 3), rtol=1e-6)
        chex.assert_trees_all_close(_grads(loop_mlp, w, b, x, 3, max_steps=4), _grads(scan_mlp, w, b, x, 3),
                                    rtol=1e-5)


def test_disable_jit_overflows_as_the_compiled_loop_does():
    """Eagerly run, a reverse-differentiated loop past ``max_steps`` raises as the compiled one does; run forward
    (or under ``jax.jvp``) it runs on, as the compiled one does."""
    a = float(np.random.default_rng().uniform(0.5, 1.0))  # 10 / a > 3 steps
    f = lambda a: while_loop(lambda x: x < 10.0, lambda x: x + a, 0.0, max_steps=3)  # noqa: E731
    ref = lambda a: lax.while_loop(lambda x: x < 10.0, lambda x: x + a, 0.0)  # noqa: E731
    with jax.disable_jit():
        chex.assert_trees_all_close(f(a), ref(a))
        chex.assert_trees_all_close(jax.jvp(f, (a,), (1.0,)), jax.jvp(ref, (a,), (1.0,)), rtol=1e-6)
        with pytest.raises(LoopOverflowError, match="max_steps=3"):
            jax.grad(f)(a)
        chex.assert_trees_all_close(jax.grad(f)(4.0 + a), 3.0)  # three steps: within the bound
    with pytest.raises(LoopOverflowError, match="max_steps=3"):
        jax.grad(f)(a)


def test_batched_predicate_forward():
    ns = jnp.array([0, 3, 1, 5])
    ours = jax.vmap(lambda n: while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, 1.0)))(ns)
    ref = jax.vmap(lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, 1.0)))(ns)
    chex.assert_trees_all_equal(ours, ref)


# --------------------------------------------------------------------------- the seed's examples
def test_seed_example_1_tensor_counter():
    # cond_fn(iter, x): iter.sum() < 10; body_fn(iter, x): (iter + 1, x.sin())
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 4))
    f = lambda x: while_loop(lambda c: c[0].sum() < 10, lambda c: (c[0] + 1, jnp.sin(c[1])),  # noqa: E731
                             (jnp.zeros(1), x), max_steps=12)[1].sum()
    ref = lambda x: lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=10)[0].sum()  # noqa: E731
    chex.assert_trees_all_close(f(x), ref(x), rtol=1e-6)
    chex.assert_trees_all_close(jax.grad(f)(x), jax.grad(ref)(x), rtol=1e-5)


def test_seed_example_2_python_int_counter():
    # cond_fn(i, x): 2 * i < x.shape[0]; body_fn(i, x): (i + 1, x + i)
    x = jax.random.normal(jax.random.PRNGKey(3), (5, 4))

    def f(x):
        i, y = while_loop(lambda c: 2 * c[0] < c[1].shape[0], lambda c: (c[0] + 1, c[1] * jnp.cos(c[1]) + c[0]),
                          (0, x), max_steps=4)
        return jnp.sum(y), i

    def ref(x):
        y = x
        for i in range(3):
            y = y * jnp.cos(y) + i
        return jnp.sum(y)

    assert int(f(x)[1]) == 3
    chex.assert_trees_all_close(jax.grad(lambda x: f(x)[0])(x), jax.grad(ref)(x), rtol=1e-5)


# --------------------------------------------------------------------------- gradients: all modes
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("n", [0, 1, 7])
def test_grad_matches_scan(mode, n):
    w, b, x = _params(n)
    with _mode_ctx(mode):
        got = _grads(loop_mlp, w, b, x, n, **MODES[mode])
    chex.assert_trees_all_close(got, _grads(scan_mlp, w, b, x, n), rtol=1e-5, atol=1e-6)


@settings(max_examples=5, deadline=None)
@given(n=st.integers(0, 12), k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_modes_agree_hypothesis(n, k, seed):
    w, b, x = _params(seed)
    ref = _grads(scan_mlp, w, b, x, n)
    stack = _grads(loop_mlp, w, b, x, n, max_steps=12)
    ckpt = _grads(loop_mlp, w, b, x, n, checkpoints=k)
    with dynamic_capacity(12):
        dyn = _grads(loop_mlp, w, b, x, n)
    # Gradients of order 1 after up to 12 float32 steps: a rounding-level atol for entries near 0.
    for got in (stack, ckpt, dyn):
        chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", list(MODES))
def test_zero_iterations_identity(mode):
    w, b, x = _params(4)

    def f(w, x):
        return while_loop(lambda c: c[0] < 0, lambda c: (c[0] + 1, _mlp_step(c[1], w, b)), (0, x), **MODES[mode])[1]

    with _mode_ctx(mode):
        y, vjp = jax.vjp(f, w, x)
        ct = jax.random.normal(jax.random.PRNGKey(5), x.shape)
        gw, gx = vjp(ct)
    chex.assert_trees_all_equal(y, x)
    chex.assert_trees_all_equal(gx, ct)  # identity for carries
    chex.assert_trees_all_equal(gw, jnp.zeros_like(w))  # zero for closed-over arrays


def test_integer_carries_get_no_gradient():
    def f(x):
        i, j, y = while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] * 2, c[2] * x), (0, 1, x), max_steps=6)
        return y + j.astype(jnp.float32)

    chex.assert_trees_all_close(jax.grad(f)(1.5), jax.grad(lambda x: x**5 + 16.0)(1.5), rtol=1e-6)
    gi = jax.grad(lambda c: while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), c, max_steps=4)[1],
                  allow_int=True)((0, 1.0))
    assert gi[0].dtype == jax.dtypes.float0
    chex.assert_trees_all_close(gi[1], 8.0)


@pytest.mark.parametrize("mode", list(MODES))
def test_grad_of_closed_over_arrays(mode):
    w, b, x = _params(6)
    with _mode_ctx(mode):
        got = jax.grad(lambda w, b: loop_mlp(w, b, x, 5, **MODES[mode]), argnums=(0, 1))(w, b)
    chex.assert_trees_all_close(got, jax.grad(lambda w, b: scan_mlp(w, b, x, 5), argnums=(0, 1))(w, b),
                                rtol=1e-5, atol=1e-6)


def test_nested_while_loops():
    def f(a):
        def outer(c):
            i, x = c
            _, x = while_loop(lambda d: d[0] < i + 1, lambda d: (d[0] + 1, jnp.sin(d[1]) * a), (0, x), max_steps=5)
            return i + 1, x
        return while_loop(lambda c: c[0] < 3, outer, (0, a), max_steps=4)[1]

    def ref(a):
        x = a
        for i in range(3):
            for _ in range(i + 1):
                x = jnp.sin(x) * a
        return x

    chex.assert_trees_all_close(jax.grad(f)(0.9), jax.grad(ref)(0.9), rtol=1e-5)


def test_scan_inside_body_and_while_inside_scan():
    w, b, x = _params(7)

    def inner_scan(x):  # two tanh steps via lax.scan inside the while body
        return lax.scan(lambda c, _: (_mlp_step(c, w, b), None), x, None, length=2)[0]

    f = lambda x: jnp.sum(while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, inner_scan(c[1])), (0, x),  # noqa: E731
                                     max_steps=4)[1] ** 2)
    chex.assert_trees_all_close(jax.grad(f)(x), jax.grad(lambda x: scan_mlp(w, b, x, 6))(x), rtol=1e-5)

    def g(x):  # a while loop of 2 steps inside each of 3 scan steps
        step = lambda c, _: (while_loop(lambda d: d[0] < 2, lambda d: (d[0] + 1, _mlp_step(d[1], w, b)),  # noqa: E731
                                        (0, c), max_steps=3)[1], None)
        return jnp.sum(lax.scan(step, x, None, length=3)[0] ** 2)

    chex.assert_trees_all_close(jax.grad(g)(x), jax.grad(lambda x: scan_mlp(w, b, x, 6))(x), rtol=1e-5)


@pytest.mark.parametrize("mode", ["max_steps", "checkpoints"])
def test_vmap_per_lane_trip_counts(mode):
    w, b, x = _params(8)
    ns = jnp.array([0, 4, 1, 6])
    xs = jnp.stack([x * (i + 1) for i in range(4)])
    ref = jnp.stack([jax.grad(scan_mlp, argnums=2)(w, b, xs[i], int(n)) for i, n in enumerate(ns)])
    per_lane = lambda x, n: loop_mlp(w, b, x, n, **MODES[mode])  # noqa: E731
    chex.assert_trees_all_close(jax.vmap(jax.grad(per_lane))(xs, ns), ref, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(jax.grad(lambda xs: jax.vmap(per_lane)(xs, ns).sum())(xs), ref, rtol=1e-5, atol=1e-6)


def test_jvp_forward_mode():
    w, b, x = _params(9)
    tw = jax.random.normal(jax.random.PRNGKey(10), w.shape)
    got = jax.jvp(lambda w: loop_mlp(w, b, x, 5), (w,), (tw,))  # no bound needed for forward mode
    chex.assert_trees_all_close(got, jax.jvp(lambda w: scan_mlp(w, b, x, 5), (w,), (tw,)), rtol=1e-5)


@pytest.mark.parametrize("mode", ["max_steps", "dynamic", pytest.param("checkpoints", marks=pytest.mark.slow)])
def test_grad_of_grad(mode):
    w, b, x = _params(11)
    h = lambda s, fn, **kw: jnp.sum(jax.grad(fn, argnums=2)(w * s, b, x, 4, **kw) ** 2)  # noqa: E731
    with _mode_ctx(mode):
        got = jax.jit(jax.grad(lambda s: h(s, loop_mlp, **MODES[mode])))(1.1)
    chex.assert_trees_all_close(got, jax.grad(h)(1.1, scan_mlp), rtol=1e-4)


@pytest.mark.parametrize("mode", ["max_steps", "checkpoints"])
def test_jit_around_everything(mode):
    w, b, x = _params(12)
    f = jax.jit(jax.value_and_grad(lambda w, b, x, n: loop_mlp(w, b, x, n, **MODES[mode]), argnums=(0, 1, 2)))
    for n in (0, 3, 8):  # a traced trip count: one compilation serves all
        chex.assert_trees_all_close(f(w, b, x, n), jax.value_and_grad(scan_mlp, argnums=(0, 1, 2))(w, b, x, n),
                                    rtol=1e-5, atol=1e-6)


def test_jax_checkpoint_around_loop():
    w, b, x = _params(13)
    f = jax.checkpoint(lambda w, x: loop_mlp(w, b, x, 4, max_steps=6))
    chex.assert_trees_all_close(jax.grad(f, argnums=(0, 1))(w, x),
                                jax.grad(lambda w, x: scan_mlp(w, b, x, 4), argnums=(0, 1))(w, x), rtol=1e-5)


def test_without_direct_linearize():
    if not hasattr(jax.config, "jax_use_direct_linearize"):
        pytest.skip("this jax has no jax_use_direct_linearize flag")
    w, b, x = _params(14)
    old = jax.config.jax_use_direct_linearize
    jax.config.update("jax_use_direct_linearize", not old)
    try:
        for mode in ("max_steps", "checkpoints"):
            chex.assert_trees_all_close(_grads(loop_mlp, w, b, x, 5, **MODES[mode]), _grads(scan_mlp, w, b, x, 5),
                                        rtol=1e-5, atol=1e-6)
    finally:
        jax.config.update("jax_use_direct_linearize", old)


@pytest.mark.parametrize("kw", [dict(max_steps=6), pytest.param(dict(checkpoints=2), marks=pytest.mark.slow)])
def test_finite_differences_float64(kw):
    with jax.enable_x64(True):
        w, b, x = (np.asarray(a, np.float64) for a in _params(15))
        f = jax.jit(lambda w, x: loop_mlp(w, b, x, 5, **kw))
        jax.test_util.check_grads(f, (w, x), order=1, modes=["rev"], eps=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_finite_differences_second_order_float64():
    with jax.enable_x64(True):
        w, b, x = (np.asarray(a, np.float64) for a in _params(15))
        jax.test_util.check_grads(lambda w: loop_mlp(w, b, x, 3, max_steps=4), (w,), order=2, modes=["rev"],
                                  eps=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- memory mode errors
@pytest.mark.parametrize("jit", [False, True])
def test_overflow_is_an_error_naming_max_steps(jit):
    w, b, x = _params(16)
    g = jax.grad(lambda x, n: loop_mlp(w, b, x, n, max_steps=3))
    g = jax.jit(g) if jit else g
    with pytest.raises(LoopOverflowError, match="max_steps=3"), reraise_overflow():  # needed under jit only
        jax.block_until_ready(g(x, 5))
    if jit:
        assert np.all(np.isnan(g(x, 5)))  # a bare jit: NaN gradients, never plausible numbers
    chex.assert_trees_all_close(g(x, 3), jax.grad(lambda x: scan_mlp(w, b, x, 3))(x), rtol=1e-5)


@pytest.mark.parametrize("where", ["cond", "scan", "checkpoint", "loop"])
def test_overflow_where_jax_traces_the_loop_raises_through_jaxaot_gradients(where):
    """Inside ``lax.cond``, ``lax.scan``, ``jax.checkpoint`` or another loop's body JAX traces the loop as ``jit``
    does: eager ``jax.grad`` gets NaN there, and jaxaot's gradients raise when the call returns."""
    w, b, x = _params(19)
    def inner(x, n):
        return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, _mlp_step(c[1], w, b)), (0, x), max_steps=3)[1]

    outer = {"cond": lambda x, n: lax.cond(jnp.sum(x) > -1e9, lambda x: inner(x, n), lambda x: x, x),
             "scan": lambda x, n: lax.scan(lambda c, _: (inner(c, n), None), x, None, length=1)[0],
             "checkpoint": jax.checkpoint(inner, static_argnums=1),
             "loop": lambda x, n: while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, inner(c[1], n)), (0, x),
                                             max_steps=2)[1]}[where]
    loss = lambda x, n: jnp.sum(outer(x, n) ** 2)  # noqa: E731
    assert np.all(np.isnan(jax.grad(loss)(x, 5)))
    for gradient in (jaxaot.value_and_grad(loss), jaxaot.compiled_value_and_grad(loss)):
        with pytest.raises(LoopOverflowError, match="max_steps=3"):
            gradient(x, 5)
        value, grad = gradient(x, 3)  # within the bound: JAX's numbers, the function still working
        chex.assert_trees_all_close((value, grad), jax.value_and_grad(loss)(x, 3), rtol=1e-5)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_gradient_keeps_the_weak_type_of_its_input(mode):
    f = lambda x: while_loop(lambda c: c < 5.0, lambda c: c * 1.5 + x, x, **MODES[mode])  # noqa: E731
    with _mode_ctx(mode):
        got = jax.grad(f)(1.0)
    want = jax.grad(lambda x: lax.fori_loop(0, 3, lambda i, c: c * 1.5 + x, x))(1.0)
    assert got.dtype == want.dtype and got.weak_type == want.weak_type
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("transform", ["grad", "vjp", "linearize"])
def test_unbounded_reverse_mode_asks_for_a_bound(transform):
    w, b, x = _params(17)  # as with lax.while_loop, vjp and linearize run; the transpose is refused
    f = lambda x: jnp.sum(loop_mlp(w, b, x, 3))  # noqa: E731
    with pytest.raises(ReverseModeBoundError, match="max_steps.*checkpoints"):
        {"grad": jax.grad(f), "vjp": lambda x: jax.vjp(f, x)[1](1.0),
         "linearize": lambda x: jax.linear_transpose(jax.linearize(f, x)[1], x)(1.0)}[transform](x)


def test_dynamic_capacity_reports_trip_counts():
    w, b, x = _params(18)

    def fwd_bwd(x, n, capacity):
        with dynamic_capacity(capacity) as trips:
            y, vjp = jax.vjp(lambda x: loop_mlp(w, b, x, n), x)
            (g,) = vjp(jnp.ones_like(y))
        assert len(trips) == 1
        return g, trips[0]

    g, trips = jax.jit(fwd_bwd, static_argnums=2)(x, 5, 8)
    assert int(trips) == 5
    chex.assert_trees_all_close(g, jax.grad(lambda x: scan_mlp(w, b, x, 5))(x), rtol=1e-5)
    _, trips = jax.jit(fwd_bwd, static_argnums=2)(x, 11, 8)
    assert int(trips) == 9  # capacity + 1: "needed more than capacity"
    with dynamic_capacity(4) as trips:
        jaxpr = jax.make_jaxpr(lambda x: jax.vjp(lambda x: loop_mlp(w, b, x, 2), x)[0])(x)
    assert len(trips) == 1 and "while_loop_stack_output" in str(jaxpr)


# --------------------------------------------------------------------------- while_loop_stack_output
def test_stack_output_rows_and_count():
    x = jax.random.normal(jax.random.PRNGKey(19), (2,))
    stacked, n = while_loop_stack_output(lambda c: c[0] < 4, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x),
                                         max_steps=6)
    assert int(n) == 4
    ref = lax.scan(lambda c, _: ((c[0] + 1, jnp.sin(c[1])),) * 2, (0, x), None, length=4)[1]
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda s: s[:4], stacked), ref, rtol=1e-6)


def test_stack_output_grad_and_zero_rows():
    x = jax.random.normal(jax.random.PRNGKey(20), (3,))

    def f(x, m):
        stacked, n = while_loop_stack_output(lambda c: c[0] < m, lambda c: (c[0] + 1, jnp.tanh(c[1]) * 1.5),
                                             (0, x), max_steps=5)
        rows = jnp.arange(5) < n
        return jnp.sum(jnp.where(rows[:, None], stacked[1], 0.0) ** 2)

    def ref(x, m):
        ys = lax.scan(lambda c, _: (jnp.tanh(c) * 1.5,) * 2, x, None, length=m)[1]
        return jnp.sum(ys**2)

    for m in (0, 1, 4):
        chex.assert_trees_all_close(jax.grad(f)(x, m), jax.grad(ref)(x, m), rtol=1e-5, atol=1e-7)
    with pytest.raises(Exception, match="max_steps=5"):
        jax.block_until_ready(f(x, 7))


# --------------------------------------------------------------------------- bad input
def test_cond_must_return_bool_scalar():
    with pytest.raises(LoopFunctionError, match="boolean scalar.*int32"):
        while_loop(lambda c: c, lambda c: c + 1, 0)
    with pytest.raises(LoopFunctionError, match=r"bool\[3\]"):
        while_loop(lambda c: c < 3, lambda c: c + 1, jnp.zeros(3))
    with pytest.raises(LoopFunctionError, match="pytree"):
        while_loop(lambda c: (c < 3, c < 4), lambda c: c + 1, 0)
    for wrapped in (lambda p: (p,), lambda p: [p], lambda p: {"p": p}):  # one leaf, in a container: as lax refuses
        with pytest.raises(TypeError, match="boolean scalar"):
            lax.while_loop(lambda c: wrapped(c < 3), lambda c: c + 1, 0)
        with pytest.raises(LoopFunctionError, match="boolean scalar"):
            while_loop(lambda c: wrapped(c < 3), lambda c: c + 1, 0)


def test_body_must_keep_the_carry_type():
    with pytest.raises(LoopCarryMismatchError, match="structure"):
        while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1,), (0, 1.0))
    with pytest.raises(LoopCarryMismatchError, match=r"init_val\['v'\].*float32\[3\].*float32\[4\]"):
        while_loop(lambda c: c["i"] < 3, lambda c: {"i": c["i"] + 1, "v": jnp.zeros(4)},
                   {"i": 0, "v": jnp.zeros(3)})
    with pytest.raises(LoopCarryMismatchError, match=r"init_val\[1\].*int32.*float32"):
        while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, jnp.int32(4)))


@pytest.mark.parametrize("bad", [None, 3, "f"])
def test_functions_must_be_callable(bad):
    with pytest.raises(LoopFunctionError, match="callable"):
        while_loop(bad, lambda c: c, 0)
    with pytest.raises(LoopFunctionError, match="callable"):
        while_loop(lambda c: c < 1, bad, 0)


@pytest.mark.parametrize("option", ["max_steps", "checkpoints"])
@pytest.mark.parametrize("value", [0, -2, 1.5, True, "3", np.float32(2)])
def test_options_must_be_positive_ints(option, value):
    with pytest.raises(InvalidLoopOptionError, match=option):
        while_loop(lambda c: c < 1, lambda c: c + 1, 0, **{option: value})


def test_stack_output_needs_max_steps():
    for bad in (None, 0, -3, 2.0):  # each message names the function called
        with pytest.raises(InvalidLoopOptionError, match="^while_loop_stack_output: max_steps"):
            while_loop_stack_output(lambda c: c < 1, lambda c: c + 1, 0, max_steps=bad)


def test_public_names():
    assert jaxaot.loops.while_loop is while_loop and jaxaot.loops.while_loop_stack_output is while_loop_stack_output
