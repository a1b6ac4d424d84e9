"""The compiled pipeline's parameters: key leaves, param_specs checks, mixed shardings and 16-bit floats.

Each case compares the compiled step with jax.value_and_grad of the unpipelined model on fresh random inputs.
Meshes size themselves from ``jax.device_count()`` and skip, saying why, where there are too few devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxaot.errors import InvalidValueError
from jaxaot._src.parallel.training_pipeline import pipeline
from pipeline_models import mlp_model, mlp_stage, mse, unpipelined
from zoo import assert_trees_close, key_stream

TOL = dict(rtol=1e-5, atol=1e-6)
fresh_key = key_stream(9800)


def devices_available() -> int:
    return max(n for n in (1, 2, 4, 8) if n <= jax.device_count())


def mesh_of(shape: tuple, names: tuple) -> jax.sharding.Mesh:
    size = int(np.prod(shape))
    if devices_available() < size:
        pytest.skip(f"a {' x '.join(map(str, shape))} mesh needs {size} devices; {jax.device_count()} here")
    return jax.sharding.Mesh(np.array(jax.devices()[:size]).reshape(shape), names)


def noisy_stage(params, x):
    """A stage whose parameters hold a PRNG key: noise of one feature row (the same for every batch shard)."""
    return mlp_stage(params, x) + 0.1 * jax.random.normal(params["key"], x.shape[1:])


@pytest.mark.parametrize("data", [1, 2])
def test_key_parameters_get_float0_gradients_on_a_mesh_with_a_data_axis(data):
    mesh = mesh_of((2, data), ("stage", "data"))
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=8)
    keys = jax.random.split(fresh_key(), 2)
    params = [dict(p, key=k) for p, k in zip(params, keys)]
    loss, grads = pipeline([noisy_stage] * 2, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh)(params, x, t)
    ref_loss, ref_grads = unpipelined([noisy_stage] * 2, loss_fn, 2)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert all(g["key"].dtype == jax.dtypes.float0 for g in grads)
    assert_trees_close(grads, ref_grads, **TOL)


def test_param_specs_of_too_many_dimensions_or_of_axes_the_mesh_lacks_are_named():
    mesh = mesh_of((2, max(1, devices_available() // 2)), ("stage", "model"))
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=8)
    wide = pipeline(stages, loss_fn, num_microbatches=2, mesh=mesh, param_specs=[{"w": P(None, None, "model"),
                                                                                  "b": None}] * 2)
    with pytest.raises(InvalidValueError, match=r"param_specs\[0\]\['w'\] = .*\(8, 8\) \(rank 2\)"):
        wide(params, x, t)
    unknown = pipeline(stages, loss_fn, num_microbatches=2, mesh=mesh, param_specs=[{"w": P("nope"), "b": None}] * 2)
    with pytest.raises(InvalidValueError, match=r"names 'nope': not an axis of the mesh"):
        unknown(params, x, t)


@pytest.mark.parametrize("names", [("stage", "model"), ("stage", "data", "model")])
def test_a_stage_with_sharded_and_replicated_leaves_equals_value_and_grad(names):
    """One leaf split over 'model', the rest (a bias, a scalar) replicated: no stage waits on another's devices."""
    mesh = mesh_of((2,) * len(names), names)
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=16)
    params = [dict(p, s=jnp.float32(1.5)) for p in params]
    stage = lambda p, h: mlp_stage(p, h) * p["s"]  # noqa: E731
    step = pipeline([stage] * 2, loss_fn, schedule="1f1b", num_microbatches=4, mesh=mesh,
                    param_specs=[{"w": P(None, "model"), "b": None, "s": None}] * 2)
    loss, grads = step(params, x, t)
    ref_loss, ref_grads = unpipelined([stage] * 2, loss_fn, 4)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_sixteen_bit_pipelines_on_a_mesh_with_more_axes_equal_value_and_grad(dtype):
    n = devices_available()
    shape, names = ((2, 2, 2), ("stage", "data", "model")) if n >= 8 else ((2, max(1, n // 2)), ("stage", "model"))
    mesh = mesh_of(shape, names)
    stages, loss_fn, params, x, t = jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if isinstance(a, jax.Array) else a, mlp_model(2, fresh_key(), batch=16))
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh)
    loss, grads = step(params, x, t)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 2)(params, x, t)
    assert loss.dtype == dtype and all(g.dtype == dtype for g in jax.tree_util.tree_leaves(grads))
    np.testing.assert_allclose(np.float32(loss), np.float32(ref_loss), rtol=2e-2)
    assert_trees_close(jax.tree_util.tree_map(np.float32, grads), jax.tree_util.tree_map(np.float32, ref_grads),
                       rtol=5e-2, atol=1e-2)


@pytest.mark.parametrize("how", ["spec under set_mesh", "spec", "named sharding"])
def test_a_stage_s_sharding_constraints_over_the_other_axes_equal_value_and_grad(how):
    """``with_sharding_constraint`` on a stage's activation, over an axis left to XLA: a PartitionSpec (resolved
    against the step's mesh, whose pipeline and data axes are manual inside the step) or a NamedSharding."""
    n = devices_available()
    shape, names = ((2, 2, 2), ("stage", "data", "model")) if n >= 8 else ((2, max(1, n // 2)), ("stage", "model"))
    mesh = mesh_of(shape, names)
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=16)
    target = P(None, "model") if how != "named sharding" else jax.sharding.NamedSharding(mesh, P(None, "model"))

    def constrained(p, h):
        return jax.lax.with_sharding_constraint(mlp_stage(p, h), target)

    step = pipeline([constrained] * 2, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh,
                    param_specs=[{"w": P(None, "model"), "b": None}] * 2)
    if how == "spec under set_mesh":
        with jax.set_mesh(mesh):
            loss, grads = step(params, x, t)
    else:
        loss, grads = step(params, x, t)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 2)(params, x, t)  # a constraint changes no value
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
