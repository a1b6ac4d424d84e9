"""Every loop mode under ``jax_enable_x64`` and ``jax_numpy_dtype_promotion="strict"``, f32 and f64 carries.

Strict promotion is what the Equinox, diffrax and optimistix test suites run with:
any implicit promotion in a loop's bookkeeping (an int32 step against an int64
index, a bool added to an int) is a ``TypePromotionError`` there. Each case runs
the gradient (eager, jitted and under ``vmap`` with per-lane trip counts) of a
loop with an int and a float carry, and compares it, its value and their dtypes
with ``lax.while_loop``'s forward-mode derivative under the same configuration.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot
import jaxaot._src.loops

_SEED = int(np.random.SeedSequence().entropy % 2**31)

#: name -> (while_loop options, offline schedule, online block)
MODES = {
    "max_steps": (dict(max_steps=20), None, None),
    "checkpoints": (dict(checkpoints=3), None, None),
    "checkpoints_blocked": (dict(checkpoints=3), None, 3),
    "bounded_binomial": (dict(max_steps=20, checkpoints=3), "binomial", None),
    "bounded_nested": (dict(max_steps=20, checkpoints=12), "nested", None),
    "host_snapshots": (dict(max_steps=40, checkpoints=8, checkpoint_memory="host"), None, None),
}
#: (x64, carry dtype)
CONFIGS = [(False, "float32"), (True, "float32"), (True, "float64")]
#: The default suite's cases (each compiles a gradient and its vmap: 2-14 s); the rest are slow.
DEFAULT = {("max_steps", True, "float64"), ("checkpoints", True, "float32"), ("bounded_binomial", True, "float64")}
CASES = [pytest.param(m, x, d, id=f"{m}-x64-{d}" if x else f"{m}-{d}",
                      marks=() if (m, x, d) in DEFAULT else pytest.mark.slow)
         for m in sorted(MODES) for x, d in CONFIGS]


@contextlib.contextmanager
def _configured(x64: bool, schedule, block):
    with jaxaot.config.override(offline_schedule=schedule, online_block=block):
        with jax.enable_x64(x64), jax.numpy_dtype_promotion("strict"):
            yield


def _loop(wl, x):
    """An int counter, a float carry whose trip count depends on ``x``, and an int32 carry."""
    return wl(lambda c: c[1] < 5.0, lambda c: (c[0] + 1, c[1] * 1.3 + x, c[2] + jnp.int32(2)), (0, x, jnp.int32(0)))


@pytest.mark.parametrize("mode,x64,dtype", CASES)
def test_gradients_under_strict_promotion_equal_lax_forward_mode(mode, x64, dtype):
    options, schedule, block = MODES[mode]
    xs = np.random.default_rng(_SEED).uniform(0.2, 0.9, 3)
    with _configured(x64, schedule, block):
        x = jnp.asarray(xs, dtype)
        loop = lambda x: _loop(lambda c, b, i: jaxaot.loops.while_loop(c, b, i, **options), x)  # noqa: E731
        ref_out, ref_dot = jax.vmap(lambda x: jax.jvp(lambda x: _loop(lax.while_loop, x), (x,), (jnp.ones_like(x),)))(x)
        grad = jax.grad(lambda x: loop(x)[1])
        out, g0, grads = jax.jit(lambda x: (jax.vmap(loop)(x), grad(x[0]), jax.vmap(grad)(x)))(x)  # one compile
        for a, b in zip(out, ref_out):
            assert jax.typeof(a) == jax.typeof(b)
            np.testing.assert_allclose(a, b, rtol=1e-6)
        assert g0.dtype == grads.dtype == x.dtype
        np.testing.assert_allclose(g0, ref_dot[1][0], rtol=1e-5, err_msg=f"seed {_SEED}")
        np.testing.assert_allclose(grads, ref_dot[1], rtol=1e-5, err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("x64,dtype", [pytest.param(x, d, id=f"x64-{d}" if x else d,
                                                  marks=() if x and d == "float64" else pytest.mark.slow)
                                     for x, d in CONFIGS])
def test_stacked_outputs_and_dynamic_capacity_under_strict_promotion(x64, dtype):
    with _configured(x64, None, None):
        x = jnp.asarray(0.5, dtype)
        stacked, n = jaxaot.loops.while_loop_stack_output(lambda c: c[1] < 5.0, lambda c: (c[0] + 1, c[1] * 1.3 + x),
                                                    (0, x), max_steps=16)
        rows = lax.scan(lambda c, _: ((c[0] + 1, c[1] * 1.3 + x),) * 2, (0, x), None, length=int(n))[1]
        assert stacked[1].dtype == x.dtype and n.dtype == jnp.int32
        np.testing.assert_allclose(stacked[1][: int(n)], rows[1], rtol=1e-6)
        with jaxaot._src.loops.dynamic_capacity(32):
            g = jax.grad(lambda x: _loop(jaxaot.loops.while_loop, x)[1])(x)
        ref = jax.jvp(lambda x: _loop(lax.while_loop, x)[1], (x,), (jnp.ones_like(x),))[1]
        assert g.dtype == x.dtype
        np.testing.assert_allclose(g, ref, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(max_steps=8), dict(checkpoints=2), dict(max_steps=8, checkpoints=2)],
                         ids=["max_steps", "checkpoints", "both"])
def test_weak_float_outputs_keep_their_weak_type_under_reverse_mode(options):
    """A Python-float carry comes out weakly typed in every mode and transformation, as from ``lax.scan``: the
    product with a bfloat16 array is then bfloat16 under ``jax.grad`` as in the forward."""
    x0 = float(np.random.default_rng(_SEED).uniform(0.2, 0.9))
    b = jnp.asarray(np.random.default_rng(_SEED + 1).uniform(0.5, 2.0, 3), jnp.bfloat16)

    def loss(wl, x, **o):
        y = wl(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x), **o)[1]
        return (y * b).astype(jnp.float32).sum(), y

    scan = lambda cond, body, init: lax.scan(lambda c, _: (body(c), None), init, None, length=3)[0]  # noqa: E731
    for wrap in (lambda f: f, jax.jit):  # a jit may compute the bfloat16 product in float32: compare like with like
        ref = wrap(jax.value_and_grad(lambda x: loss(scan, x), has_aux=True))(x0)
        (value, y), g = wrap(jax.value_and_grad(lambda x: loss(jaxaot.loops.while_loop, x, **options),
                                                has_aux=True))(x0)
        assert jax.typeof(y) == jax.typeof(ref[0][1]) and y.weak_type
        assert value == ref[0][0], f"seed {_SEED}"
        np.testing.assert_allclose(g, ref[1], rtol=1e-2, err_msg=f"seed {_SEED}")


def test_stacked_weak_rows_keep_their_weak_type_under_reverse_mode():
    x0 = float(np.random.default_rng(_SEED).uniform(0.2, 0.9))
    run = lambda x: jaxaot.loops.while_loop_stack_output(lambda c: c < 2.0, lambda c: c * 1.5 + 0.1, x,  # noqa: E731
                                                         max_steps=16)[0]
    forward = run(x0)
    (_, stacked), g = jax.value_and_grad(lambda x: (run(x).sum(), run(x)), has_aux=True)(x0)
    assert jax.typeof(stacked) == jax.typeof(forward) and forward.weak_type
    n = int(jnp.sum(forward != 0))
    ref = jax.grad(lambda x: lax.scan(lambda c, _: ((c * 1.5 + 0.1),) * 2, x, None, length=n)[1].sum())(x0)
    np.testing.assert_allclose(g, ref, rtol=1e-5, err_msg=f"seed {_SEED}")


def test_stacked_rows_have_the_same_types_under_jit_and_disable_jit_as_lax_scan():
    """Eagerly run under ``jax.disable_jit``, the stacked rows keep the carry's weak types, as under ``jit`` and as
    ``lax.scan``'s stacked outputs do either way."""
    x0 = float(np.random.default_rng(_SEED).uniform(0.2, 0.9))
    body = lambda c: (c[0] + 1, c[1] * 1.5 + 0.1)  # noqa: E731

    def ours(x):
        return jaxaot.loops.while_loop_stack_output(lambda c: c[0] < 3, body, (0, x), max_steps=5)[0]

    def scan(x):
        return lax.scan(lambda c, _: (body(c),) * 2, (0, x), None, length=5)[1]

    types = []
    for fn in (ours, scan):
        for run in (jax.jit(fn), fn):
            with jax.disable_jit(run is fn):
                types.append([jax.typeof(leaf).weak_type for leaf in run(x0)])
    assert types[0] == types[1] == types[2] == types[3] == [True, True], types
    with jax.disable_jit():
        eager = ours(x0)
    for a, b in zip(eager, jax.jit(ours)(x0)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
