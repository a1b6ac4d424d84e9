"""Both pipeline executors as drop-ins for ``jax.value_and_grad(..., allow_int=True)`` of the unpipelined model.

Beyond float32 arrays: ``jax_enable_x64`` with float32 and float64 parameters, integer, bool and PRNG-key
parameter leaves (float0 gradients), Python-float leaves (weakly typed gradients), params given as a tuple
(a tuple back), and ``data_axes`` naming an axis the mesh lacks (a typed error). Two stages; the compiled
executor's mesh takes two devices where there are, else both stages share one (the interleaved schedule).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxaot.errors import InvalidValueError
from jaxaot._src.parallel.training_pipeline import pipeline
from zoo import key_stream

M = 2  # microbatches
fresh_key = key_stream(9900)
EXECUTORS = ("compiled", "python")


def executor_options(executor: str, schedule: str = "gpipe") -> dict:
    """Two stages on the devices there are (one device: the compiled executor interleaves them on it)."""
    have = jax.devices()
    if executor == "python":
        return dict(executor="python", schedule=schedule, devices=[have[i % len(have)] for i in range(2)])
    n = min(2, len(have))
    mesh = jax.sharding.Mesh(np.array(have[:n]), ("stage",))
    return dict(mesh=mesh, schedule=schedule if n == 2 else "interleaved")


def reference(stages, loss_fn, params, x, t):
    """``jax.value_and_grad(allow_int=True)`` of the mean microbatch loss of the composed stages."""
    def loss(params):
        total = 0.0
        for xm, tm in zip(jnp.split(x, M), jnp.split(t, M)):
            for fn, p in zip(stages, params):
                xm = fn(p, xm)
            total = total + loss_fn(xm, tm)
        return total / M

    return jax.value_and_grad(loss, allow_int=True)(params)


def assert_like_jax(got, want, rtol=1e-5, atol=1e-6):
    """Equal losses and gradients: tree structure (containers too), dtypes, shapes, weak types, values."""
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(ref_grads)
    assert type(grads) is type(ref_grads)
    assert loss.dtype == ref_loss.dtype
    np.testing.assert_allclose(loss, ref_loss, rtol=rtol, atol=atol)
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(ref_grads)):
        where = jax.tree_util.keystr(path)
        assert (g.dtype, g.shape) == (r.dtype, r.shape), where
        assert getattr(g, "weak_type", False) == getattr(r, "weak_type", False), where
        if r.dtype != jax.dtypes.float0:
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=where)


def mse(y, t):
    return jnp.mean((y - t) ** 2)


def dense(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def batch(key, width=4, dtype=jnp.float32):
    kx, kt = jax.random.split(key)
    return jax.random.normal(kx, (4 * M, width), dtype), jax.random.normal(kt, (4 * M, width), dtype)


def dense_params(key, width=4, dtype=jnp.float32):
    k1, k2 = jax.random.split(key)
    return [{"w": jax.random.normal(k, (width, width), dtype) / 2, "b": jnp.zeros(width, dtype)} for k in (k1, k2)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_runs_under_x64_with_float32_and_float64(executor, dtype):
    with jax.enable_x64(True):
        kp, kd = jax.random.split(fresh_key())
        params, (x, t) = dense_params(kp, dtype=dtype), batch(kd, dtype=dtype)
        step = pipeline([dense] * 2, mse, num_microbatches=M, **executor_options(executor))
        assert_like_jax(step(params, x, t), reference([dense] * 2, mse, params, x, t))
    assert jnp.ones(1).dtype == jnp.float32  # the flag is restored


def scaled(p, x):
    """Integer and bool leaves beside float ones: ``k`` scales, ``flip`` picks a sign."""
    y = x * p["k"] + p["w"]
    return jnp.tanh(jnp.where(p["flip"], -y, y))


@pytest.mark.parametrize("executor,schedule", [("compiled", "zero_bubble"), ("python", "1f1b")])
def test_integer_and_bool_leaves_get_float0_gradients(executor, schedule):
    key = fresh_key()
    params = [{"k": jnp.int32(3), "w": jax.random.normal(key, (4,)), "flip": jnp.bool_(True)},
              {"k": jnp.arange(4, dtype=jnp.int32), "w": jnp.ones(4), "flip": jnp.array([True, False] * 2)}]
    x, t = batch(jax.random.fold_in(key, 1))
    step = pipeline([scaled] * 2, mse, num_microbatches=M, **executor_options(executor, schedule))
    got = step(params, x, t)
    assert_like_jax(got, reference([scaled] * 2, mse, params, x, t))
    assert got[1][1]["k"].dtype == jax.dtypes.float0 and got[1][1]["k"].shape == (4,)


def noisy(p, x):
    """A stage whose parameters hold PRNG keys: one key and a pair of them."""
    noise = jax.random.normal(p["key"], x.shape) + jax.random.uniform(p["pair"][1], x.shape)
    return jnp.tanh(x @ p["w"]) + 0.1 * noise


@pytest.mark.parametrize("executor", EXECUTORS)
def test_prng_key_leaves_get_float0_gradients(executor):
    key = fresh_key()
    params = [{"key": jax.random.fold_in(key, 1), "pair": jax.random.split(key), "w": jnp.eye(4)},
              {"w": jax.random.normal(key, (4, 4)) / 2, "b": jnp.zeros(4)}]
    x, t = batch(jax.random.fold_in(key, 2))
    step = pipeline([noisy, dense], mse, num_microbatches=M, **executor_options(executor))
    got = step(params, x, t)
    assert_like_jax(got, reference([noisy, dense], mse, params, x, t))
    assert got[1][0]["pair"].shape == (2,)
    if executor == "compiled":  # packed and back, the keys are the same keys
        back = step.unshard_params(step.shard_params(params, x, t))
        for k in ("key", "pair"):
            assert back[0][k].dtype == params[0][k].dtype
            np.testing.assert_array_equal(jax.random.key_data(back[0][k]), jax.random.key_data(params[0][k]))


def affine(p, x):
    return jnp.tanh(x * p["a"] + p["w"])


Stages = collections.namedtuple("Stages", "first second")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_tuple_params_and_weak_types_come_back_as_jax_gives_them(executor):
    key = fresh_key()
    x, t = batch(key)
    step = pipeline([affine] * 2, mse, num_microbatches=M, **executor_options(executor))
    weak = ({"a": 2.0, "w": jax.random.normal(key, (4,))}, {"a": 0.5, "w": jnp.ones(4)})
    assert_like_jax(step(weak, x, t), reference([affine] * 2, mse, weak, x, t))
    assert step(list(weak), x, t)[1][0]["a"].weak_type
    named = Stages(*weak)
    assert_like_jax(step(named, x, t), reference([affine] * 2, mse, named, x, t))
    strong = tuple(dict(p, a=jnp.float32(p["a"])) for p in weak)  # the same shapes, strongly typed
    assert_like_jax(step(strong, x, t), reference([affine] * 2, mse, strong, x, t))
    assert step.cache_info().misses == 2  # a weak type is part of the signature


def two_axis_mesh(names=("stage", "batch")) -> jax.sharding.Mesh:
    """A 2-D mesh of the devices there are: 2 x 2 from four devices, 1 x 2 from two, 1 x 1 from one."""
    n = len(jax.devices())
    shape = (2, 2) if n >= 4 else (1, min(n, 2))
    return jax.sharding.Mesh(np.array(jax.devices()[:shape[0] * shape[1]]).reshape(shape), names)


def test_data_axes_the_mesh_lacks_raise_naming_the_axis_and_the_mesh_axes():
    mesh = two_axis_mesh()
    for axes in (("btach",), ("data",), ("batch", "data")):
        with pytest.raises(InvalidValueError, match=r"btach|'data'.*\('stage', 'batch'\)"):
            pipeline([dense] * 2, mse, num_microbatches=M, mesh=mesh, data_axes=axes)
    with pytest.raises(InvalidValueError, match="other than the pipeline axis 'stage'"):
        pipeline([dense] * 2, mse, num_microbatches=M, mesh=mesh, data_axes=("stage",))


@pytest.mark.parametrize("data_axes,split", [(None, ()), (("batch",), ("batch",))])
def test_default_data_axes_is_the_data_axis_where_the_mesh_has_one(data_axes, split):
    mesh = two_axis_mesh()
    kp, kd = jax.random.split(fresh_key())
    params, (x, t) = dense_params(kp), batch(kd)
    schedule = "gpipe" if mesh.shape["stage"] == 2 else "interleaved"
    step = pipeline([dense] * 2, mse, schedule=schedule, num_microbatches=M, mesh=mesh, data_axes=data_axes)
    assert step._compiled.axes.data == split
    assert_like_jax(step(params, x, t), reference([dense] * 2, mse, params, x, t))
    with_data = pipeline([dense] * 2, mse, schedule=schedule, num_microbatches=M, mesh=two_axis_mesh(("stage", "data")))
    assert with_data._compiled.axes.data == ("data",)
