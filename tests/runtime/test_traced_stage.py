"""``aot_fn.trace(...)``, the traced stage, against ``jax.jit(f).trace(...)`` on fresh random inputs: the same jaxpr
(evaluated, it gives the function's outputs), the same ``in_tree``/``args_info``/``out_info``/``out_tree``, static
arguments left out of its inputs as jit leaves them out, and ``.lower()`` the stage ``aot_fn.lower`` gives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from zoo import assert_trees_close, key_stream

fresh_key = key_stream(9500)


def _loss(params, x, power=2):
    h = jnp.tanh(x @ params["w"] + params["b"])
    return {"loss": jnp.sum(h ** power), "h": h}


def _args():
    kw, kb, kx = jax.random.split(fresh_key(), 3)
    return ({"w": jax.random.normal(kw, (3, 4)), "b": jax.random.normal(kb, (4,))}, jax.random.normal(kx, (5, 3)))


@pytest.mark.parametrize("static", [False, True])
def test_the_traced_stage_is_jits(static):
    params, x = _args()
    kwargs = dict(static_argnums=(2,)) if static else {}
    call = (params, x, 3) if static else (params, x)
    f = jaxaot.aot_function(_loss, **kwargs)
    traced, want = f.trace(*call), jax.jit(_loss, **kwargs).trace(*call)
    assert isinstance(traced, jaxaot.AOTTraced)
    assert [e.primitive for e in traced.jaxpr.eqns] == [e.primitive for e in want.jaxpr.eqns]
    leaves = jax.tree_util.tree_leaves((params, x))
    outs = jax.core.eval_jaxpr(traced.jaxpr.jaxpr, traced.jaxpr.consts, *leaves)
    assert_trees_close(jax.tree_util.tree_unflatten(traced.out_tree, outs), _loss(*call))
    assert traced.in_tree == want.in_tree
    assert traced.out_info == want.out_info and traced.out_tree == jax.tree_util.tree_structure(want.out_info)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), traced.args_info) == jax.tree.map(
        lambda a: (a.shape, a.dtype), want.args_info)
    assert traced.fun_name == f.__name__ and "AOTTraced" in repr(traced)


def test_lowering_the_traced_stage_is_lowering_the_function():
    params, x = _args()
    f = jaxaot.aot_function(lambda p, x: _loss(p, x)["loss"])
    lowered = f.trace(params, x).lower()
    assert lowered.saved_bytes == f.lower(params, x).saved_bytes
    assert_trees_close(lowered.compile()(params, x), _loss(params, x)["loss"])
    assert_trees_close(jax.grad(f)(params, x), jax.grad(lambda p, x: _loss(p, x)["loss"])(params, x))
    assert f.cache_info().misses == 1  # one signature: traced once, whichever stage asked


def test_tracing_abstract_inputs_compiles_nothing():
    params, x = _args()
    f = jaxaot.aot_function(lambda p, x: _loss(p, x)["loss"])
    avals = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x))
    traced = f.trace(*avals)
    assert traced.out_info.shape == () and f.cache_info().entries[0].executables == ()
    assert_trees_close(traced.lower().compile()(params, x), _loss(params, x)["loss"])
