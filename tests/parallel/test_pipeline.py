"""jaxaot.parallel.pipeline's Python executor: every schedule's loss and gradients equal jax.value_and_grad's.

(The compiled executor, the default, has tests/parallel/test_compiled_pipeline.py.)

Models are tiny (CPU): a tanh MLP and a GPT (token embedding, pre-LN blocks,
a head and a cross-entropy loss), cut into 2 or 4 stages, each stage on its
own device where there are enough (the conftest gives every test process 8 CPU
devices); with fewer (one GPU, say) the schedule's devices take the ones there
are in turn, as ``pipeline(devices=...)`` allows a device more than once.
Combinations are sampled so that every schedule, both models, 2 and 4 stages
and 1, 4 and 8 microbatches each appear; the full product is marked slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxaot.errors import InvalidInputError, InvalidValueError, StageMismatchError
from jaxaot._src.parallel.training_pipeline import Pipeline, PipelineReport, pipeline
from jaxaot._src.parallel.simulator import OpTimes, simulate
from pipeline_models import MODELS, mlp_model, mlp_stage, mse, unpipelined
from zoo import assert_trees_close, key_stream

TOL = dict(rtol=1e-4, atol=1e-5)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
fresh_key = key_stream(9300)


def schedule_devices(count: int) -> list:
    """``count`` devices for a schedule: its own device each where the backend has enough, else cycling."""
    have = jax.devices()
    return [have[i % len(have)] for i in range(count)]


def placed(params, step: Pipeline):
    return [jax.device_put(p, st.sharding) for p, st in zip(params, step.stages)]


def check_step(model: str, num_stages: int, schedule: str, num_microbatches: int) -> Pipeline:
    devices = schedule_devices(num_stages // 2 if schedule == "interleaved" else num_stages)
    stages, loss_fn, params, x, t = MODELS[model](num_stages, fresh_key())
    step = pipeline(stages, loss_fn, schedule=schedule, num_microbatches=num_microbatches, devices=devices,
                    executor="python")
    ref_loss, ref_grads = unpipelined(stages, loss_fn, num_microbatches)(params, x, t)
    params = placed(params, step)
    loss, grads = step(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
    for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(params)):
        assert g.devices() == p.devices()
    assert {d.id for p in params for d in jax.tree_util.tree_leaves(p)[0].devices()} == {
        d.id for d in step.devices}
    assert step.last_peak_live == tuple(step.schedule.peak_live_microbatches())
    return step


# --------------------------------------------------------------------------- correctness
# (model, stages, schedule, microbatches): every schedule, model, stage count and microbatch count appears.
CASES = [
    ("mlp", 4, "gpipe", 8),
    ("mlp", 4, "1f1b", 8),
    ("mlp", 4, "interleaved", 4),
    ("mlp", 4, "zero_bubble", 4),
    ("mlp", 2, "1f1b", 1),
    ("mlp", 2, "zero_bubble", 8),
    pytest.param("gpt", 2, "zero_bubble", 4, marks=pytest.mark.slow),  # the compiled executor's tests run the GPT
    pytest.param("gpt", 4, "interleaved", 1, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("model,num_stages,schedule,num_microbatches", CASES)
def test_pipeline_equals_value_and_grad(model, num_stages, schedule, num_microbatches):
    check_step(model, num_stages, schedule, num_microbatches)


@pytest.mark.slow
@pytest.mark.parametrize("num_microbatches", (1, 4, 8))
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("num_stages", (2, 4))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_pipeline_equals_value_and_grad_everywhere(model, num_stages, schedule, num_microbatches):
    if schedule == "interleaved" and num_stages == 2:
        pytest.skip("2 stages interleaved over 1 device: covered by 4 stages over 2")
    check_step(model, num_stages, schedule, num_microbatches)


def test_residual_peaks_follow_the_schedule_and_steps_repeat():
    stages, loss_fn, params, x, t = mlp_model(4, fresh_key())
    for schedule, m in (("1f1b", 8), ("gpipe", 4)):
        step = pipeline(stages, loss_fn, schedule=schedule, num_microbatches=m, devices=schedule_devices(4),
                        executor="python")
        loss1, grads1 = step(params, x, t)
        peaks = step.last_peak_live
        if schedule == "1f1b":
            assert all(p <= 4 - i for i, p in enumerate(peaks)) and peaks[0] == 4
        else:
            assert peaks == (m,) * 4
        # A second step (new inputs, same signature) reuses the programs and agrees with the reference.
        _, _, _, x2, t2 = mlp_model(4, fresh_key())
        loss2, grads2 = step(params, x2, t2)
        ref_loss, ref_grads = unpipelined(stages, loss_fn, m)(params, x2, t2)
        np.testing.assert_allclose(loss2, ref_loss, **TOL)
        assert_trees_close(grads2, ref_grads, **TOL)


@pytest.mark.smoke
def test_lower_reports_residuals_and_op_times_feed_the_simulator():
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key())
    step = pipeline(stages, loss_fn, schedule="zero_bubble", num_microbatches=4, devices=schedule_devices(2),
                    executor="python")
    report = step.lower(params, x, t)
    assert isinstance(report, PipelineReport)
    assert report.schedule is step.schedule and report.peak_live_microbatches == (2, 1)
    assert report.residual_bytes[0] > 0 and report.weight_pass_bytes[1] > 0
    assert report.input_specs[1].shape == (4, 8)
    assert "residuals/mb" in str(report)
    times = step.measure_op_times(params, x, t, repeats=2)
    assert isinstance(times, OpTimes)
    assert all(len(getattr(times, k)) == 2 for k in ("forward", "backward_input", "backward_weight", "backward"))
    assert simulate(step.schedule, times).step_time > 0


# --------------------------------------------------------------------------- errors
def test_stage_mismatch_names_both_stages_and_shapes():
    wide = lambda p, x: x @ p  # noqa: E731
    step = pipeline([wide, wide], mse, schedule="1f1b", num_microbatches=2, devices=schedule_devices(2),
                    executor="python")
    params = [jnp.ones((8, 6)), jnp.ones((8, 8))]  # stage 0 returns width 6; stage 1 takes width 8
    with pytest.raises(StageMismatchError, match=r"stage 0 returns f32\[4,6\].*stage 1") as info:
        step(params, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert isinstance(info.value, TypeError)
    assert "(6,)" in str(info.value) and "(8,)" in str(info.value)
    assert step.last_peak_live is None  # nothing ran


def test_loss_mismatch_names_the_last_stage():
    step = pipeline([mlp_stage, mlp_stage], mse, schedule="gpipe", num_microbatches=2, devices=schedule_devices(2),
                    executor="python")
    params = [{"w": jnp.ones((8, 8)), "b": jnp.ones(8)}] * 2
    with pytest.raises(StageMismatchError, match=r"stage 1 \(the last\) returns f32\[4,8\].*targets f32\[4,3\]"):
        step(params, jnp.ones((8, 8)), jnp.ones((8, 3)))


@pytest.mark.parametrize("executor", [
    "python",
    pytest.param("compiled", marks=pytest.mark.skipif(jax.device_count() < 2, reason="two stages need two devices")),
])
def test_under_a_transformation_the_step_is_a_typed_error_and_keeps_working(executor):
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key())
    kw = dict(devices=schedule_devices(2)) if executor == "python" else {}
    step = pipeline(stages, loss_fn, num_microbatches=2, executor=executor, **kw)
    match = "outside jax.jit, jax.grad and jax.vmap"
    with pytest.raises(InvalidInputError, match=match):
        jax.jit(step)(params, x, t)
    with pytest.raises(InvalidInputError, match=match):
        jax.grad(lambda ps: step(ps, x, t)[0])(params)
    with pytest.raises(InvalidInputError, match=match):
        jax.vmap(lambda xx: step(params, xx, t)[0])(x[None])
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 2)(params, x, t)
    loss, grads = step(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


def test_bad_microbatch_counts_are_typed_errors():
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=10)
    step = pipeline(stages, loss_fn, num_microbatches=4, devices=schedule_devices(2), executor="python")
    with pytest.raises(InvalidValueError, match=r"shape \(10, 8\).*num_microbatches=4"):
        step(params, x, t)
    with pytest.raises(InvalidValueError, match="num_microbatches"):
        pipeline(stages, loss_fn, num_microbatches=0)
    with pytest.raises(InvalidInputError, match="one parameter tree per stage"):
        step(params[:1], x[:8], t[:8])
    with pytest.raises(InvalidValueError, match=r"is a scalar: .*leading batch axis.*num_microbatches=4"):
        step(params, x[:8], t[0, 0])


def test_sub_mesh_stages_with_sharded_parameters():
    """Pipeline x tensor parallel: each stage on a sub-mesh of half the devices, its weights sharded over it.

    With 8 devices each sub-mesh has 4, with 2 each has one; on one device both stages share its one-device mesh.
    """
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())  # the stages' devices; 8 divides the width
    half = max(n // 2, 1)
    meshes = [jax.make_mesh((half,), ("model",), devices=jax.devices()[(half * i) % n:(half * i) % n + half],
                            axis_types=(jax.sharding.AxisType.Auto,)) for i in range(2)]
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key())
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 4)(params, x, t)
    sharded = [{"w": jax.device_put(p["w"], NamedSharding(m, P(None, "model"))),
                "b": jax.device_put(p["b"], NamedSharding(m, P("model")))} for p, m in zip(params, meshes)]
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=4, devices=meshes, executor="python")
    loss, grads = step(sharded, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
    for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(sharded)):
        assert g.sharding.is_equivalent_to(p.sharding, p.ndim), (g.sharding, p.sharding)


def test_sub_mesh_stages_constraining_their_activations_by_a_partition_spec():
    """A stage on a sub-mesh whose ``with_sharding_constraint`` names a PartitionSpec: it traces under that sub-mesh
    (no ``jax.set_mesh``), as a plain call under ``jax.set_mesh(sub_mesh)`` would; losses and gradients are JAX's."""
    from jax.sharding import PartitionSpec as P

    n = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())
    half = max(n // 2, 1)
    meshes = [jax.make_mesh((half,), ("model",), devices=jax.devices()[(half * i) % n:(half * i) % n + half],
                            axis_types=(jax.sharding.AxisType.Auto,)) for i in range(2)]
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key())

    def constrained(p, h):
        return jax.lax.with_sharding_constraint(stages[0](p, h), P(None, "model"))

    ref_loss, ref_grads = unpipelined(stages, loss_fn, 4)(params, x, t)  # a constraint changes no value
    step = pipeline([constrained] * 2, loss_fn, schedule="1f1b", num_microbatches=4, devices=meshes,
                    executor="python")
    loss, grads = step(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


@pytest.mark.parametrize("where", ["stage", "loss"])
def test_a_stage_s_own_error_goes_up_as_it_was_raised(where):
    """A stage (or loss) that checks its input raises its own ValueError, not a StageMismatchError about shapes."""
    def picky(p, x):
        if x.shape[0] < 8:
            raise ValueError("needs microbatches of at least 8")
        return jnp.tanh(x @ p)

    def picky_loss(y, t):
        if y.shape[0] < 8:
            raise ValueError("needs microbatches of at least 8")
        return mse(y, t)

    stages, loss = ([picky, lambda p, x: x @ p], mse) if where == "stage" else ([lambda p, x: x @ p] * 2, picky_loss)
    step = pipeline(stages, loss, schedule="gpipe", num_microbatches=2, devices=schedule_devices(2),
                    executor="python")
    with pytest.raises(ValueError, match="needs microbatches of at least 8") as info:
        step([jnp.eye(8)] * 2, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert not isinstance(info.value, StageMismatchError)


@pytest.mark.parametrize("filtering", ["auto", "off"])
def test_a_stage_using_a_traced_value_in_python_raises_jax_s_error_however_tracebacks_are_filtered(filtering):
    """A stage's ``if`` on a traced value is JAX's ``TracerBoolConversionError``, with its hint, whether or not JAX
    filters its frames from the traceback (``JAX_TRACEBACK_FILTERING``): never a stage mismatch."""
    def branchy(p, x):
        return jnp.tanh(x @ p) if jnp.sum(x) > 0 else x

    step = pipeline([lambda p, x: x @ p, branchy], mse, schedule="gpipe", num_microbatches=2,
                    devices=schedule_devices(2), executor="python")
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", filtering)
    try:
        with pytest.raises(jax.errors.TracerBoolConversionError, match="depends on the value") as info:
            step([jnp.eye(8)] * 2, jnp.ones((8, 8)), jnp.ones((8, 8)))
    finally:
        jax.config.update("jax_traceback_filtering", before)
    assert not isinstance(info.value, StageMismatchError)


@pytest.mark.parametrize("schedule, split", [("gpipe", False), ("1f1b", False), ("zero_bubble", True)])
def test_weight_pass_bytes_are_those_a_split_keeps_for_its_w_pass(schedule, split):
    step = pipeline([mlp_stage] * 2, mse, schedule=schedule, num_microbatches=2, devices=schedule_devices(2),
                    executor="python")
    params = [{"w": jnp.ones((8, 8)), "b": jnp.ones(8)}] * 2
    report = step.lower(params, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert (min(report.weight_pass_bytes) > 0) if split else report.weight_pass_bytes == (0, 0)
