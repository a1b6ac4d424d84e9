"""Compiled stages against ``jax.jit``'s on fresh random inputs: arguments that differ from the lowered ones only in
weak type, arrays a call donated, and the ``jax.stages`` attributes (``in_tree``, ``out_tree``, ``out_info``,
``args_info``, ``input_shardings``, ``output_shardings``, ``input_formats``).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import assert_trees_close, key_stream, normal_at

fresh_key = key_stream(9100)


def _loss(w, x, scale):
    return jnp.sum(jnp.tanh(x @ w) ** 2) * scale


def _normal(shape):
    return jax.random.normal(fresh_key(), shape)


# Python float, NumPy scalar, strong and weak JAX scalars: the forms of one float32 scalar.
SCALARS = {
    "python": lambda v: v,
    "numpy": lambda v: np.float32(v),
    "strong": lambda v: jnp.float32(v),
    "weak": lambda v: jnp.asarray(v),
}
PAIRS = [("python", "strong"), ("strong", "python"), ("python", "numpy"), ("weak", "strong"), ("numpy", "weak")]


@pytest.mark.parametrize("lowered_as, called_as", PAIRS)
def test_a_stage_takes_an_argument_differing_only_in_weak_type_as_jax_does(lowered_as, called_as):
    f = jaxaot.aot_function(_loss)
    w, x = _normal((4, 3)), _normal((5, 4))
    lo = SCALARS[lowered_as](1.5)
    ours, theirs = f.lower(w, x, lo).compile(), jax.jit(_loss).lower(w, x, lo).compile()
    w2, x2 = normal_at(1, (4, 3)), normal_at(2, (5, 4))
    scale = SCALARS[called_as](float(np.random.default_rng().uniform(0.5, 2.0)))
    assert_trees_close(ours(w2, x2, scale), theirs(w2, x2, scale))
    assert f.cache_info().misses == 1  # run by the executables it compiled


@pytest.mark.parametrize("lowered_as, called_as", PAIRS[:2])
def test_a_gradients_stage_takes_an_argument_differing_only_in_weak_type(lowered_as, called_as):
    f = jaxaot.aot_function(_loss)
    w, x = _normal((4, 3)), _normal((5, 4))
    lo = SCALARS[lowered_as](2.0)
    ours = jaxaot.value_and_grad(f).lower(w, x, lo).compile()
    theirs = jax.jit(jax.value_and_grad(_loss)).lower(w, x, lo).compile()
    w2, x2 = _normal((4, 3)), _normal((5, 4))
    scale = SCALARS[called_as](float(np.random.default_rng().uniform(0.5, 2.0)))
    assert_trees_close(ours(w2, x2, scale), theirs(w2, x2, scale))


def test_a_stage_still_refuses_another_dtype_or_shape():
    f = jaxaot.aot_function(_loss)
    w, x = _normal((4, 3)), _normal((5, 4))
    compiled = f.lower(w, x, 1.0).compile()
    with pytest.raises(TypeError, match="Argument types differ"):
        compiled(w, x, jnp.int32(2))
    with pytest.raises(TypeError, match="Argument types differ"):
        compiled(w, x, jnp.ones(2))


def _donated_calls(name):
    f = jaxaot.aot_function(lambda w, x: _loss(w, x, 1.0), donate_argnums=0)
    if name == "value_and_grad":
        return jaxaot.value_and_grad(f)
    if name == "grad":
        return jaxaot.grad(f)
    return jaxaot.value_and_grad(f).lower(_normal((4, 3)), _normal((6, 4))).compile()


@pytest.mark.parametrize("name", ["value_and_grad", "grad", "stage"])
def test_an_array_a_call_donated_is_jaxs_runtime_error_when_passed_again(name):
    run = _donated_calls(name)
    fn = lambda w, x: _loss(w, x, 1.0)  # noqa: E731
    x, w = _normal((6, 4)), _normal((4, 3))
    expected = jax.value_and_grad(fn)(w + 0.0, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a donated buffer no output reuses
        assert_trees_close(run(w, x), expected[1] if name == "grad" else expected)
    assert w.is_deleted()
    with pytest.raises(RuntimeError, match=r"Array has been deleted with shape=float32\[4,3\]") as theirs:
        jax.jit(fn)(w, x)
    with pytest.raises(type(theirs.value), match=r"Array has been deleted with shape=float32\[4,3\]"):
        run(w, x)
    w2 = _normal((4, 3))  # a fresh array runs
    expected = jax.value_and_grad(fn)(w2 + 0.0, x)
    assert_trees_close(run(w2, x), expected[1] if name == "grad" else expected)


def _same_args_info(ours, theirs):
    a, b = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    assert [(i.shape, i.dtype, i.donated) for i in a] == [(i.shape, i.dtype, i.donated) for i in b]


def _same_out_info(ours, theirs, shardings=False):
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert (a.shape, a.dtype, a.weak_type) == (b.shape, b.dtype, b.weak_type)
        if shardings:
            assert a.sharding == b.sharding
            assert getattr(a, "format", None) == getattr(b, "format", None)  # the layout, as jax.stages gives it


def _pair_fn(params, x, *, scale):
    h = jnp.tanh(x @ params["w"] + params["b"])
    return {"loss": jnp.mean(h ** 2) * scale, "h": h, "w": params["w"]}


def _stage_args():
    params = {"w": _normal((4, 3)), "b": _normal((3,))}
    return (params, _normal((5, 4))), {"scale": 0.5}


def test_the_function_stages_attributes_are_jaxs():
    args, kwargs = _stage_args()
    f = jaxaot.aot_function(_pair_fn, donate_argnums=1)
    ours_low, theirs_low = f.lower(*args, **kwargs), jax.jit(_pair_fn, donate_argnums=1).lower(*args, **kwargs)
    for ours, theirs in ((ours_low, theirs_low), (ours_low.compile(), theirs_low.compile())):
        assert ours.in_tree == theirs.in_tree and ours.out_tree == theirs.out_tree
        _same_args_info(ours.args_info, theirs.args_info)
    ours, theirs = ours_low.compile(), theirs_low.compile()
    _same_out_info(ours_low.out_info, theirs_low.out_info)
    _same_out_info(ours.out_info, theirs.out_info, shardings=True)
    assert ours.input_shardings == theirs.input_shardings
    assert ours.output_shardings == theirs.output_shardings
    assert ours.input_formats == theirs.input_formats
    assert ours.output_formats == theirs.output_formats
    args2 = jax.tree.map(lambda a: a + _normal(a.shape), args)
    got = ours(*args2, **kwargs)
    assert jax.tree.structure(got) == ours.out_tree
    _same_out_info(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                                               sharding=a.format), got), ours.out_info, True)


@pytest.mark.parametrize("which", ["value_and_grad", "grad_aux"])
def test_a_gradients_stage_describes_what_the_gradient_returns(which):
    def loss(params, x, *, scale):
        out = _pair_fn(params, x, scale=scale)
        return (out["loss"], {"h": out["h"]}) if which == "grad_aux" else out["loss"]

    ours_grad = (jaxaot.value_and_grad(jaxaot.aot_function(loss)) if which == "value_and_grad"
                 else jaxaot.grad(jaxaot.aot_function(loss), argnums=(0, 1), has_aux=True))
    theirs_grad = (jax.value_and_grad(loss) if which == "value_and_grad"
                   else jax.grad(loss, argnums=(0, 1), has_aux=True))
    args, kwargs = _stage_args()
    ours_low, theirs_low = ours_grad.lower(*args, **kwargs), jax.jit(theirs_grad).lower(*args, **kwargs)
    ours, theirs = ours_low.compile(), theirs_low.compile()
    for a, b in ((ours_low, theirs_low), (ours, theirs)):
        assert a.in_tree == b.in_tree and a.out_tree == b.out_tree
        _same_args_info(a.args_info, b.args_info)
        _same_out_info(a.out_info, b.out_info)
    assert ours.input_shardings == theirs.input_shardings
    for name in ("output_shardings", "output_formats"):
        with pytest.raises(AttributeError, match="gradient's stage has no single executable"):
            getattr(ours, name)
    args2 = jax.tree.map(lambda a: a + _normal(a.shape), args)
    assert_trees_close(ours(*args2, **kwargs), theirs(*args2, **kwargs))


@pytest.mark.parametrize("on_mesh", [False, True])
def test_reading_a_gradient_stage_s_out_info_leaves_the_cache_as_it_was(on_mesh):
    """As reading ``jax.stages.Lowered.out_info``: no hit counted, no signature traced for the abstract call."""
    loss = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)  # noqa: E731
    w, x = _normal((16, 4)), _normal((8, 16))
    if on_mesh:
        n = max(k for k in (1, 2, 4, 8) if k <= jax.device_count())
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    f = jaxaot.aot_function(loss)
    low = jaxaot.value_and_grad(f).lower(w, x)
    before = f.cache_info()
    _same_out_info(low.out_info, jax.jit(jax.value_and_grad(loss)).lower(w, x).out_info)
    after = f.cache_info()
    assert (after.hits, after.misses, len(after.entries)) == (before.hits, before.misses, len(before.entries))


def _explicit_mesh(shape, names):
    n = int(np.prod(shape))
    if jax.device_count() < n:
        pytest.skip(f"needs {n} devices; {jax.device_count()} here")
    kind = (jax.sharding.AxisType.Explicit,) * len(shape)
    return jax.sharding.Mesh(np.array(jax.devices()[:n]).reshape(shape), names, axis_types=kind)


def test_outputs_pinned_to_explicit_axes_run_and_are_typed_as_jit_s():
    """``out_shardings`` on an Explicit-axes mesh, for an array on one device: jit's placement, stages and types."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _explicit_mesh((2,), ("d",))
    s = NamedSharding(mesh, P("d"))
    h = lambda x: jnp.tanh(x) * 2  # noqa: E731
    x = _normal((8,))
    want = jax.jit(h, out_shardings=s)(x)
    f = jaxaot.aot_function(h, out_shardings=s)
    compiled = f.lower(x).compile()
    for got in (f(x), compiled(x)):
        assert_trees_close(got, want)
        assert got.sharding.is_equivalent_to(want.sharding, 1)
    assert compiled.out_info.sharding.is_equivalent_to(s, 1)
    assert f.eval_shape(x).sharding == jax.jit(h, out_shardings=s).eval_shape(x).sharding


def test_stage_out_info_keeps_the_shardings_explicit_axes_type():
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _explicit_mesh((2, 2), ("d", "m"))
    w = jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=NamedSharding(mesh, P(None, "m")))
    x = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P("d", None)))
    f = lambda w, x: (jnp.sum(jnp.tanh(x @ w)), x @ w)  # noqa: E731
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))  # noqa: E731
    specs = lambda tree: [getattr(s.sharding, "spec", None) for s in jax.tree.leaves(tree)]  # noqa: E731
    af = jaxaot.aot_function(f)
    assert specs(af.trace(w, x).out_info) == specs(jax.jit(f).trace(w, x).out_info)
    assert specs(af.lower(w, x).out_info) == specs(jax.jit(f).lower(w, x).out_info)
    assert specs(jaxaot.value_and_grad(jaxaot.aot_function(loss)).lower(w, x).out_info) == specs(
        jax.jit(jax.value_and_grad(loss)).lower(w, x).out_info)


def test_a_stage_called_with_a_keyword_array_as_none_names_that_argument():
    def f(x, n, y=None):
        return x * n if y is None else x * n + y

    x = _normal((3,))
    compiled = jaxaot.aot_function(f, static_argnums=1).lower(x, 3, y=x).compile()
    with pytest.raises(TypeError, match="y is no longer passed") as info:
        compiled(x, y=None)
    assert "static" not in str(info.value)
