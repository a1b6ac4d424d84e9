"""A gradient carries JAX's weak type: that of a Python float is weakly typed, so arithmetic with it keeps a
bfloat16 parameter bfloat16. Every eager entry point (``jax.grad`` of an ``aot_function``, ``jaxaot.grad`` and
``jaxaot.value_and_grad``, fused or split, ``jax.vjp`` and ``backward``) hands back the weak types JAX's own
autodiff does, on fresh random inputs, for the loss value as for the gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import assert_trees_close, key_stream

fresh_key = key_stream(7100)


def _types(tree):
    """Each leaf's ``(dtype, weak type)``."""
    return jax.tree.map(lambda v: (str(v.dtype), bool(v.weak_type)), tree)


def _py(key) -> float:
    """A fresh Python float: a weakly typed input."""
    return float(jax.random.uniform(key, minval=0.5, maxval=1.5))


def _vec(key, n=3, dtype=jnp.float32):
    return jax.random.normal(key, (n,), dtype)


def _scalar_args(key):
    return (_py(key),)


def _mixed_args(key):
    k1, k2 = jax.random.split(key)
    return (_py(k1), _vec(k2))


def _tree_args(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return ({"a": _py(k1), "b": _py(k2)}, _vec(k3, 2))


def _bf16_args(key):
    k1, k2 = jax.random.split(key)
    return (_py(k1), _vec(k2, 4, jnp.bfloat16))


#: name -> (function, fresh arguments, value_and_grad keywords). The weak input's gradient is weakly typed when the
#: loss is (a Python float all the way), and when a strong input promotes it (the conversion's transpose).
CASES = {
    "weak_loss": (lambda a: jnp.sin(a) * 3.0, _scalar_args, {}),
    "weak_times_strong": (lambda a, b: jnp.sum(jnp.sin(a) * b), _mixed_args, {"argnums": (0, 1)}),
    "weak_input_unused": (lambda a, b: jnp.sum(jnp.cos(b)) * 2.0, _mixed_args, {"argnums": (0, 1)}),
    "pytree": (lambda p, x: p["a"] * jnp.cos(p["b"]) + p["a"] ** 2 + jnp.sum(x) * 0.0, _tree_args, {}),
    "pytree_strong_loss": (lambda p, x: jnp.sum(p["a"] * x) + jnp.sin(p["b"]), _tree_args, {"argnums": (0, 1)}),
    "aux_weak": (lambda a, b: (jnp.sum(jnp.sin(a) * b), a * 2.0), _mixed_args, {"argnums": (0, 1), "has_aux": True}),
    "aux_strong": (lambda a, b: (a * 3.0, jnp.sum(a * b)), _mixed_args, {"has_aux": True}),
    "bf16_param": (lambda a, w: jnp.sum(w * a).astype(jnp.float32) * a, _bf16_args, {"argnums": (0, 1)}),
    # A transpose that fills with zeros (select's, abs's) types them as the cotangent: weak where JAX's is.
    "where_zeros": (lambda a: jnp.where(a > 1.0, a, 0.0) * 3.0, _scalar_args, {}),
    "relu_abs": (lambda a, b: jnp.sum(jax.nn.relu(a - 1.0) * b) + jnp.abs(a), _mixed_args, {"argnums": (0, 1)}),
}


def _entry_points(fn, kw):
    """name -> a ``value_and_grad`` of ``fn`` through one of jaxaot's eager paths (and one under ``jit``)."""
    return {
        "jaxaot_fused": jaxaot.value_and_grad(jaxaot.aot_function(fn), **kw),
        "jaxaot_split": jaxaot.value_and_grad(jaxaot.aot_function(fn), fused=False, **kw),
        "jax_of_aot": jax.value_and_grad(jaxaot.aot_function(fn), **kw),
        "jit_of_aot": jax.jit(jax.value_and_grad(jaxaot.aot_function(fn), **kw)),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_and_grad_weak_types_match_jax(name):
    fn, make, kw = CASES[name]
    for path, vg in _entry_points(fn, kw).items():
        for _ in range(3):  # the first call, then the signature's hot path
            args = make(fresh_key())
            want = jax.value_and_grad(fn, **kw)(*args)
            got = vg(*args)
            assert _types(got) == _types(want), (path, _types(got), _types(want))
            tol = 2e-2 if name == "bf16_param" else 2e-5
            assert_trees_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("fused", [True, False])
def test_grad_of_a_python_float_keeps_bfloat16_arithmetic(fused):
    g = lambda a: jnp.sin(a) * 3.0  # noqa: E731
    f = jaxaot.aot_function(g)
    w = _vec(fresh_key(), 3, jnp.bfloat16)
    for _ in range(3):
        a = _py(fresh_key())
        want = jax.grad(g)(a)
        for got in (jax.grad(f)(a), jaxaot.grad(f, fused=fused)(a)):
            assert _types(got) == _types(want) == ("float32", True)
            assert (w - got).dtype == jnp.bfloat16
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_weakly_typed_array_on_the_hot_path():
    """A weakly typed array (not a Python float) is a concrete leaf: the fused step's hot path runs it, and its
    gradient is weakly typed there too."""
    g = lambda a: jnp.sin(a) * 3.0  # noqa: E731
    weak = jax.jit(lambda v: v * 1.0)  # of a Python float: a weakly typed scalar array
    f = jaxaot.aot_function(g)
    vg = jaxaot.value_and_grad(f)
    for _ in range(4):
        a = weak(_py(fresh_key()))
        assert a.weak_type
        want = jax.value_and_grad(g)(a)
        got = vg(a)
        assert _types(got) == _types(want) == (("float32", True), ("float32", True))
        assert_trees_close(got, want)
    assert f.cache_info().hits >= 2  # the hot path ran the later calls


@pytest.mark.parametrize("name", ["weak_loss", "weak_times_strong", "pytree", "pytree_strong_loss", "where_zeros"])
def test_vjp_cotangents_weak_types_match_jax(name):
    """``jax.vjp``: a strong cotangent, a weakly typed one and a Python float each give JAX's weak types;
    ``AOTFunction.backward`` as well."""
    fn, make, _ = CASES[name]
    f = jaxaot.aot_function(fn)
    args = make(fresh_key())
    out, vjp = jax.vjp(fn, *args)
    aot_out, aot_vjp = jax.vjp(f, *args)
    assert _types(aot_out) == _types(out)
    _, residuals = f.forward(*args)
    ct = jax.random.normal(fresh_key(), out.shape, out.dtype)
    cts = [ct, ct * 1.0 if out.weak_type else ct]
    if out.shape == ():
        cts.append(float(ct))
    for c in cts:
        want = vjp(c)
        for got in (aot_vjp(c), f.backward(residuals, c)):
            assert _types(got) == _types(want), (c, _types(got), _types(want))
            assert_trees_close(got, want)
