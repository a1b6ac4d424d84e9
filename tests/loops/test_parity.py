"""Parity with ``lax.while_loop``: a table of lax's own behaviours, run through both.

Without ``max_steps`` / ``checkpoints``, ``jaxaot.loops.while_loop`` must do what
``lax.while_loop`` does, the same way: each case below is one function of the
loop implementation, run with ``lax.while_loop`` and with ``jaxaot.loops.while_loop`` on
the same fresh random inputs; values, dtypes and weak types must agree. The error
cases must raise an instance of the class lax raises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import jaxaot
from jaxaot.errors import ReverseModeBoundError

_SEED = int(np.random.SeedSequence().entropy % 2**31)


def _rand(*shape):
    return jnp.asarray(np.random.default_rng(_SEED).uniform(0.5, 1.5, shape), jnp.float32)


def _count_loop(wl, x, n=4):
    return wl(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1 + 0.1), (0, x))


def _until(wl, x):  # trip count depends on x: a batched predicate under vmap
    return wl(lambda c: c[1] < 6.0, lambda c: (c[0] + 1, c[1] * 1.7 + 0.1), (0, x))


def _read_only(wl, x, y):  # y is a carry the body never changes
    return wl(lambda c: c[1] < 6.0, lambda c: (c[0] * c[2], c[1] + c[2], c[2]), (x, x, y))


def _named(wl, x):  # a named axis and a collective in the body
    return wl(lambda c: c[0] < 3,
              lambda c: (c[0] + 1, c[1] * 0.5 + lax.axis_index("i") + lax.psum(c[1], "i") * 0.1), (0, x))


def _named_cond(wl, x):
    return wl(lambda c: c[0] < 2 + lax.axis_index("i"), lambda c: (c[0] + 1, c[1] * 1.5), (0, x))


def _read_only_matmul(wl, w, x, n):  # w is read only; the trip count n is batched
    _, x, w = wl(lambda v: v[0] < n, lambda v: (v[0] + 1, v[1] @ v[2], v[2]), (0, x, w))
    return w, x


def _chain(wl, x):  # a batched value reaches c[3], then c[2], then c[1]: the fixpoint takes three rounds
    return wl(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[2] * 2.0, c[3] + 1.0, c[3] + x), (0, 1.0, 1.0, 1.0))


def _io_callback(wl, x, pred_on_carry):
    def body(c):
        return c[0] + 1, io_callback(lambda v: v, jax.ShapeDtypeStruct((), jnp.float32), c[1]) + x

    cond = (lambda c: c[1] < 3.0) if pred_on_carry else (lambda c: c[0] < 3)
    return wl(cond, body, (0, jnp.float32(0.0)))


def _debug_callback_batched(wl, x):
    # vmap of jax.debug.callback calls it once per lane, as separate unordered effects
    # (jax/_src/debugging.py, debug_batching_rule), so the order of one iteration's lanes is not
    # defined (GPUs differ from CPUs): each iteration's values compare as a sorted multiset.
    seen = []
    out = jax.vmap(lambda x: wl(lambda c: c < 3.0,
                                lambda c: jax.debug.callback(lambda v: seen.append(np.asarray(v)), c) or c + x,
                                0.0))(x)
    jax.block_until_ready(out)
    jax.effects_barrier()
    per_iteration = np.stack(seen).reshape(-1, x.shape[0])
    return out, jnp.asarray(np.sort(per_iteration, axis=1))


def _effects(wl, x):
    seen = []
    out = wl(lambda c: c[0] < 3,
             lambda c: (jax.debug.callback(lambda v: seen.append(float(v)), c[1]) or c[0] + 1, c[1] * 2.0), (0, x))
    jax.block_until_ready(out)
    jax.effects_barrier()
    return out, jnp.asarray(seen)


#: name -> (function of the loop implementation, argument shapes)
CASES = {
    "forward": (lambda wl, x: _count_loop(wl, x), [(3,)]),
    "forward_cond_driven": (lambda wl, x: _until(wl, x), [()]),
    "zero_iterations": (lambda wl, x: wl(lambda c: c[0] > 10.0, lambda c: c * 2.0, x), [(2,)]),
    "weak_type_python_scalars": (lambda wl, x: wl(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, 1.0)), [()]),
    "weak_type_promoted": (lambda wl, x: wl(lambda c: c < 3.0, lambda c: c + x, 0.0), [()]),
    "jit": (lambda wl, x: jax.jit(lambda x: _until(wl, x))(x), [()]),
    "jvp": (lambda wl, x: jax.jvp(lambda x: _until(wl, x)[1], (x,), (jnp.ones_like(x),)), [()]),
    "jvp_pytree": (lambda wl, x: jax.jvp(lambda x: _count_loop(wl, x), (x,), (x * 0.3,)), [(3,)]),
    "linearize": (lambda wl, x: (lambda y, f: (y, f(x * 0.5)))(*jax.linearize(lambda x: _until(wl, x)[1], x)), [()]),
    "jacfwd": (lambda wl, x: jax.jacfwd(lambda x: _count_loop(wl, x)[1])(x), [(3,)]),
    "vmap_batched_predicate": (lambda wl, x: jax.vmap(lambda x: _until(wl, x))(x), [(5,)]),
    "vmap_unbatched_predicate": (lambda wl, x: jax.vmap(lambda x: _count_loop(wl, x))(x), [(4, 2)]),
    "vmap_read_only_batched": (lambda wl, x, y: jax.vmap(lambda x, y: _read_only(wl, x, y))(x, y), [(4,), (4,)]),
    "vmap_read_only_unbatched": (lambda wl, x, y: jax.vmap(lambda x: _read_only(wl, x, y[0]))(x), [(4,), (4,)]),
    "vmap_in_axes_1": (lambda wl, x: jax.vmap(lambda x: _until(wl, x[0]), in_axes=1)(x), [(1, 3)]),
    "vmap_nested": (lambda wl, x: jax.vmap(jax.vmap(lambda x: _until(wl, x)))(x), [(2, 3)]),
    "vmap_axis_index_psum": (lambda wl, x: jax.vmap(lambda x: _named(wl, x), axis_name="i")(x), [(4,)]),
    "vmap_axis_index_in_cond": (lambda wl, x: jax.vmap(lambda x: _named_cond(wl, x), axis_name="i")(x), [(3,)]),
    "vmap_of_jvp": (lambda wl, x: jax.vmap(lambda x: jax.jvp(lambda x: _until(wl, x)[1], (x,), (x,)))(x), [(4,)]),
    "jvp_of_vmap": (lambda wl, x: jax.jvp(jax.vmap(lambda x: _until(wl, x)[1]), (x,), (x,)), [(4,)]),
    "effects_debug_callback": (lambda wl, x: _effects(wl, x), [()]),
    # lax.while_loop's batching rule, case by case (jax/_src/lax/control_flow/loops.py):
    # a read-only carry stays unbatched under a batched predicate (out_axes=None accepts it)
    "vmap_read_only_batched_predicate_out_axes_none": (
        lambda wl, w, x: jax.vmap(lambda w, x, n: _read_only_matmul(wl, w, x, n), in_axes=(None, 0, 0),
                                  out_axes=(None, 0))(w, x, jnp.arange(4)), [(2, 2), (4, 2)]),
    "vmap_read_only_read_by_cond": (
        lambda wl, x: jax.vmap(lambda x, y: wl(lambda c: c[1] < y * 3.0, lambda c: (c[0] * 2.0, c[1] + x, c[2]),
                                               (x, x, y)), in_axes=(0, None))(x, 2.0), [(3,)]),
    "vmap_batched_const_reaches_carries": (lambda wl, x: jax.vmap(lambda x: _chain(wl, x))(x), [(3,)]),
    "vmap_predicate_batched_by_const_only": (
        lambda wl, x: jax.vmap(lambda n: wl(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x[0]), (0, 1.0)))(
            jnp.arange(4)), [(1,)]),
    "vmap_int_carries_batched_predicate": (
        lambda wl, x: jax.vmap(lambda n: wl(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 3), (0, 1)))(
            jnp.arange(4)), [()]),
    "vmap_debug_callback_batched_predicate": (lambda wl, x: _debug_callback_batched(wl, x), [(3,)]),
    "vmap_io_callback_unbatched_predicate": (lambda wl, x: jax.vmap(lambda x: _io_callback(wl, x, False))(x),
                                             [(3,)]),
}


def _leaves_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert jax.typeof(x).dtype == jax.typeof(y).dtype, (jax.typeof(x), jax.typeof(y))
        assert jax.typeof(x).weak_type == jax.typeof(y).weak_type, (jax.typeof(x), jax.typeof(y))
        if jax.typeof(x).dtype != jax.dtypes.float0:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6,
                                       err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_behaves_like_lax_while_loop(name):
    fn, shapes = CASES[name]
    args = [_rand(*s) for s in shapes]
    _leaves_equal(fn(jaxaot.loops.while_loop, *args), fn(lax.while_loop, *args))


#: name -> function of the loop implementation that lax refuses
ERRORS = {
    "cond_returns_float": lambda wl: wl(lambda c: c * 1.0, lambda c: c + 1.0, 0.0),
    "cond_returns_vector": lambda wl: wl(lambda c: c < jnp.ones(2), lambda c: c + 1.0, 0.0),
    "body_changes_dtype": lambda wl: wl(lambda c: c < 3, lambda c: (c + 1).astype(jnp.float32), jnp.int32(0)),
    "body_changes_shape": lambda wl: wl(lambda c: c[0] < 3, lambda c: c + jnp.ones((2, 2)), jnp.zeros(2)),
    "body_changes_structure": lambda wl: wl(lambda c: c[0] < 3, lambda c: (c[0] + 1,), (0, 1.0)),
    "cond_not_callable": lambda wl: wl(3, lambda c: c, 0.0),
    "body_not_callable": lambda wl: wl(lambda c: c < 3, None, 0.0),
    "grad_of_unbounded_loop": lambda wl: jax.grad(lambda x: _until(wl, x)[1])(1.0),
    "vmap_io_callback_batched_predicate": lambda wl: jax.vmap(lambda x: _io_callback(wl, x, True))(jnp.ones(3)),
    "vmap_ordered_io_callback": lambda wl: jax.vmap(lambda x: wl(
        lambda c: c < 3.0, lambda c: io_callback(
            lambda v: v, jax.ShapeDtypeStruct((), jnp.float32), c, ordered=True) + x, 0.0))(jnp.ones(3)),
    "transpose_of_linearize": lambda wl: jax.linear_transpose(jax.linearize(lambda x: _until(wl, x)[1], 1.0)[1], 1.0)(1.0),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_raises_the_class_lax_raises(name):
    with pytest.raises(Exception) as lax_error:
        ERRORS[name](lax.while_loop)
    with pytest.raises(type(lax_error.value)):
        ERRORS[name](jaxaot.loops.while_loop)


def test_unbounded_linearize_stages_the_loop_and_refuses_only_its_transpose():
    x = _rand()
    y, f = jax.linearize(lambda x: _until(jaxaot.loops.while_loop, x)[1], x)
    y_ref, f_ref = jax.linearize(lambda x: _until(lax.while_loop, x)[1], x)
    np.testing.assert_allclose(f(2.0), f_ref(2.0), rtol=1e-6)
    with pytest.raises(ReverseModeBoundError, match="max_steps=N"):
        jax.linear_transpose(f, x)(1.0)
