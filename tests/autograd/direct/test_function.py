"""jaxaot.value_and_grad / jaxaot.grad: the eager fast path equals jax's answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from zoo import assert_trees_close, kept_step


def _normal(*shape):
    return jax.random.normal(jax.random.key(np.random.randint(1 << 30)), shape)


def loss(params, x, n):
    h = jnp.tanh(x @ params["w"] + params["b"])
    return jnp.mean(h**2) * n, {"h": h}


@pytest.mark.parametrize("argnums", [0, (0, 1)])
def test_value_and_grad_matches_jax(argnums):
    params, x = {"w": _normal(4, 3), "b": _normal(3)}, _normal(5, 4)
    f = jaxaot.aot_function(loss)
    got = jaxaot.value_and_grad(f, argnums=argnums, has_aux=True)(params, x, jnp.int32(2))
    want = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(params, x, jnp.int32(2))
    assert_trees_close(got, want)
    g = jaxaot.grad(f, argnums=argnums, has_aux=True)(params, x, jnp.int32(2))
    assert_trees_close(g, jax.grad(loss, argnums=argnums, has_aux=True)(params, x, jnp.int32(2)))


@pytest.mark.smoke
def test_fast_path_runs_compiled_executables_only():
    f = jaxaot.aot_function(lambda w: jnp.sum(jnp.sin(w)))
    vg = jaxaot.value_and_grad(f)
    w = _normal(6)
    vg(w)
    choice = kept_step(f, (w,))  # the step that runs, and nothing else
    assert f.cache_info().entries[0].fused == (choice,)
    assert_trees_close(vg(w), jax.value_and_grad(lambda w: jnp.sum(jnp.sin(w)))(w))
    jaxaot.value_and_grad(f, fused=False)(w)  # the split pair, asked for: compiled (again) and kept beside
    assert set(f.cache_info().entries[0].executables) == {"forward", "backward"} | {
        choice.executable for _ in range(choice.runs == "fused")}


def test_falls_back_under_jit_and_for_plain_functions():
    fn = lambda w: jnp.sum(jnp.cos(w) ** 2)  # noqa: E731
    w = _normal(3)
    want = jax.grad(fn)(w)
    assert_trees_close(jax.jit(jaxaot.grad(jaxaot.aot_function(fn)))(w), want)
    assert_trees_close(jaxaot.grad(fn)(w), want)


def test_errors_are_jax_errors():
    f = jaxaot.aot_function(lambda w: jnp.sin(w))
    with pytest.raises(TypeError, match="scalar"):
        jaxaot.grad(f)(_normal(3))
    g = jaxaot.aot_function(lambda w, n: jnp.sum(w) * n)
    with pytest.raises(TypeError, match="real- or complex-valued"):
        jaxaot.grad(g, argnums=1)(_normal(3), jnp.int32(2))


def test_a_differentiated_bool_leaf_is_jax_s_type_error_before_the_function_traces():
    """JAX checks the differentiated inputs' types before it traces: a bool leaf the function branches on (a model's
    ``training`` flag left in its parameters) is JAX's ``TypeError`` naming bool, not the branch's tracer error."""
    f = jaxaot.aot_function(lambda p: jnp.sum(p["w"]) * (2.0 if p["training"] else 1.0))
    params = {"w": _normal(3), "training": True}
    for grad in (jax.grad, jaxaot.grad):
        with pytest.raises(TypeError, match="real- or complex-valued.*bool") as err:
            grad(f)(params)
        assert not isinstance(err.value, jax.errors.TracerBoolConversionError)


@pytest.mark.parametrize("argnums", [0, 1])
def test_same_array_in_two_arguments_differentiates_only_the_picked_one(argnums):
    fn = lambda a, b: jnp.sum(jnp.sin(a) * b ** 2)  # noqa: E731
    x = jax.random.normal(jax.random.key(7), (5,))
    vg = jaxaot.value_and_grad(jaxaot.aot_function(fn), argnums=argnums)
    assert_trees_close(vg(x, x), jax.value_and_grad(fn, argnums=argnums)(x, x), rtol=1e-6, atol=1e-6)
    assert vg.lower(x, x).joint.differentiable == tuple(i == argnums for i in range(2))


# Outputs jax.grad refuses (or treats specially): the drop-in must do exactly what JAX does.
_OUTPUT_SHAPES = {
    "tuple": (lambda x: (jnp.sum(x), jnp.sum(x**2)), False),
    "list": (lambda x: [jnp.sum(x)], False),
    "dict": (lambda x: {"loss": jnp.sum(x)}, False),
    "vector": (lambda x: x * 2, False),
    "complex": (lambda x: jnp.sum(x).astype(jnp.complex64), False),
    "aux_triple": (lambda x: (jnp.sum(x), x, x), True),
    "aux_not_a_pair": (lambda x: jnp.sum(x), True),
    "aux_value_is_tuple": (lambda x: ((jnp.sum(x), jnp.sum(x)), x), True),
    "aux_list_pair": (lambda x: [jnp.sum(x**2), x], True),
    "scalar": (lambda x: jnp.sum(jnp.sin(x)), False),
    "aux_pair": (lambda x: (jnp.sum(jnp.sin(x)), {"x": x}), True),
}


@pytest.mark.parametrize("name", sorted(_OUTPUT_SHAPES))
@pytest.mark.parametrize("entry", ["grad", "value_and_grad"])
def test_outputs_behave_exactly_as_jax_grad(name, entry):
    # Regression: jaxaot.grad of a tuple-, list- or dict-valued function silently
    # differentiated the first leaf, where jax.grad raises.
    fn, has_aux = _OUTPUT_SHAPES[name]
    x = _normal(5)
    ours, theirs = getattr(jaxaot, entry), getattr(jax, entry)
    try:
        want = theirs(fn, has_aux=has_aux)(x)
    except Exception as err:  # JAX refuses: so must we, with the same exception class
        with pytest.raises(type(err)):
            ours(jaxaot.aot_function(fn), has_aux=has_aux)(x)
        return
    assert_trees_close(ours(jaxaot.aot_function(fn), has_aux=has_aux)(x), want)


def test_a_repeated_signature_runs_its_step_directly_and_follows_every_change():
    """A training loop calls with one signature: once its fused step is decided, the next call with that
    signature runs it without the lookup (as jit's dispatch does), counted as a hit. Every change of shape,
    dtype, weak type, structure, leaf kind or differentiated arguments still finds its own entry, and each call
    equals jax.value_and_grad on fresh inputs."""
    def fn(p, x):
        return jnp.sum(jnp.tanh(x @ p["w"]) * p["b"])

    f = jaxaot.aot_function(fn)
    vg, vg_both = jaxaot.value_and_grad(f), jaxaot.value_and_grad(f, argnums=(0, 1))

    def args(n, dtype=jnp.float32):
        return {"w": _normal(4, n).astype(dtype), "b": _normal(n).astype(dtype)}, _normal(3, 4).astype(dtype)

    calls = [(vg, args(5)), (vg, args(5)), (vg, args(5)), (vg, args(7)), (vg, args(5)),
             (vg, args(5, jnp.float16)), (vg_both, args(5)), (vg, args(5))]
    w0, x0 = calls[0][1][0]["w"], calls[0][1][1]
    calls.append((vg, ({"w": w0, "b": jnp.asarray(1.0)}, x0)))  # a weak-typed scalar leaf
    calls.append((vg, ({"w": w0, "b": np.ones(5, np.float32)}, x0)))  # a numpy leaf
    calls.append((vg, ({"w": w0, "b": _normal(5), "c": _normal(1)}, x0)))  # another structure
    for step, a in calls:
        want = jax.value_and_grad(fn, argnums=0 if step is vg else (0, 1))(*a)
        tol = 1e-2 if a[1].dtype == jnp.float16 else 1e-5
        assert_trees_close(step(*a), want, rtol=tol, atol=tol)
    info = f.cache_info()
    # f32[5], f32[7], f16[5], f32[] b, the extra leaf; the numpy leaf has f32[5]'s signature (found by lookup).
    assert info.misses == 5, [e.signature for e in info.entries]
    assert info.hits == len(calls) - info.misses


def test_the_direct_step_refuses_arrays_on_other_devices_and_looks_them_up():
    if jax.device_count() < 2:
        pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    fn = lambda w, x: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    vg = jaxaot.value_and_grad(jaxaot.aot_function(fn))
    for device in (jax.devices()[0], jax.devices()[0], jax.devices()[1], jax.devices()[0]):
        w, x = jax.device_put((_normal(4, 3), _normal(2, 4)), device)
        value, grad = vg(w, x)
        assert_trees_close((value, grad), jax.value_and_grad(fn)(w, x))
        assert grad.devices() == {device}
