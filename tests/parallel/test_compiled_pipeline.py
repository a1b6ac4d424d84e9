"""The compiled pipeline (the default executor): one SPMD program equals jax.value_and_grad of the model.

Every schedule runs on a ``(stage,)`` and a ``(stage, data)`` mesh, with the GPT whose first and last stages
differ from the middle ones (embedding, head and loss), against the unpipelined reference at f32 rtol 1e-5.
Meshes size themselves from ``jax.device_count()``: 4 stages where there are 8 devices (4 x 2 with data),
2 stages on 2 or 4, and on one device the interleaved schedule's two stages share it.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxaot.errors import InvalidInputError, InvalidValueError, ScheduleError, StageMismatchError
from jaxaot._src.parallel import Action, Schedule, simulate
from jaxaot._src.parallel.training_pipeline import pipeline
from jaxaot._src.parallel.simulator import OpTimes, simulate_lockstep
from jaxaot._src.parallel.spmd import StageParams, plan
from pipeline_models import gpt_model, mlp_model, mlp_stage, mse, unpipelined, widening_stage
from zoo import assert_trees_close, key_stream

TOL = dict(rtol=1e-5, atol=1e-6)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
fresh_key = key_stream(9700)


def devices_available() -> int:
    return max(n for n in (1, 2, 4, 8) if n <= jax.device_count())


def mesh_for(schedule: str, data: bool) -> tuple[jax.sharding.Mesh, int]:
    """A mesh and the stage count for ``schedule`` on the devices there are."""
    n = devices_available()
    if data and n < 4:
        pytest.skip(f"a (stage, data) mesh needs 4 devices; {jax.device_count()} here (the 1-D mesh case runs)")
    if schedule != "interleaved" and n == 1:
        pytest.skip("one device: only the interleaved schedule puts two stages on it (that case runs)")
    width = 2 if data else 1
    stage_devices = min(4, n // width)
    devs = np.array(jax.devices()[:stage_devices * width]).reshape((stage_devices, width)[:1 + data])
    num_stages = 2 * stage_devices if schedule == "interleaved" else stage_devices
    return jax.sharding.Mesh(devs, ("stage", "data")[:1 + data]), num_stages


def check(model, schedule: str, data: bool, num_microbatches: int = 4):
    mesh, num_stages = mesh_for(schedule, data)
    stages, loss_fn, params, x, t = model(num_stages, fresh_key())
    step = pipeline(stages, loss_fn, schedule=schedule, num_microbatches=num_microbatches, mesh=mesh)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, num_microbatches)(params, x, t)
    loss, grads = step(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
    return step, params, x, t


def check_placed(model, schedule: str, data: bool) -> None:
    step, params, x, t = check(model, schedule, data)
    assert step.executor == "compiled"
    # each stage's gradients come back on a device of its stage
    for s, g in enumerate(step(params, x, t)[1]):
        device = step.devices[step.schedule.stage_device()[s]]
        assert all(leaf.devices() == {device} for leaf in jax.tree_util.tree_leaves(g))


#: (model, schedule, data axis): every schedule, both meshes, the GPT with its distinct first and last stages.
CASES = [("gpt", "1f1b", True), ("gpt", "zero_bubble", False), ("mlp", "gpipe", True), ("mlp", "interleaved", False)]
MODELS = {"gpt": gpt_model, "mlp": mlp_model}


@pytest.mark.parametrize("model,schedule,data", CASES)
def test_schedules_equal_value_and_grad_on_stage_and_data_meshes(model, schedule, data):
    check_placed(MODELS[model], schedule, data)


@pytest.mark.slow
@pytest.mark.parametrize("data", [False, True], ids=["stage", "stage_data"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_equals_value_and_grad_with_distinct_first_and_last_stages(schedule, data):
    check_placed(gpt_model, schedule, data)


def test_packed_params_train_and_round_trip():
    mesh, num_stages = mesh_for("1f1b", data=False)
    stages, loss_fn, params, x, t = mlp_model(num_stages, fresh_key())
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=4, mesh=mesh)
    packed = step.shard_params(params, x, t)
    assert isinstance(packed, StageParams)
    assert_trees_close(step.unshard_params(packed), params, rtol=0, atol=0)
    loss, grads = step(packed, x, t)
    assert isinstance(grads, StageParams) and grads.layout == packed.layout
    ref = unpipelined(stages, loss_fn, 4)
    ref_loss, ref_grads = ref(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(step.unshard_params(grads), ref_grads, **TOL)
    # an SGD step over the packed pytree equals the same step on the trees
    new = jax.tree.map(lambda p, g: p - 0.1 * g, packed, grads)
    want = jax.tree.map(lambda p, g: p - 0.1 * g, params, ref_grads)
    loss2, _ = step(new, x, t)
    np.testing.assert_allclose(loss2, ref(want, x, t)[0], **TOL)
    info = step.cache_info()
    assert info.misses == 1 and info.hits >= 2
    assert info.entries[0].program == "step" and "compile_pipeline_step" in info.entries[0].times


def test_one_f_one_b_peaks_below_gpipe_as_the_schedule_predicts():
    mesh, num_stages = mesh_for("1f1b", data=False)
    if num_stages < 2:
        pytest.skip("one stage device")
    m = 4 * num_stages
    stages, loss_fn, params, x, t = mlp_model(num_stages, fresh_key(), batch=64 * m, width=64)
    temp, live = {}, {}
    for name in ("gpipe", "1f1b"):
        step = pipeline(stages, loss_fn, schedule=name, num_microbatches=m, mesh=mesh)
        temp[name] = step.compile(params, x, t).memory_analysis().temp_size_in_bytes
        report = step.lower(params, x, t)
        live[name] = max(report.peak_live_microbatches)
        record = max(report.residual_bytes)
    assert (live["gpipe"], live["1f1b"]) == (m, num_stages)
    saved = temp["gpipe"] - temp["1f1b"]
    predicted = (live["gpipe"] - live["1f1b"]) * record
    assert 0.8 * predicted <= saved <= 1.25 * predicted, (temp, predicted)


def test_program_size_does_not_grow_with_the_microbatch_count():
    mesh, num_stages = mesh_for("1f1b", data=False)
    stages, loss_fn, params, x, t = mlp_model(num_stages, fresh_key(), batch=32)
    counts = []
    for m in (2, 16):
        step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=m, mesh=mesh)
        text = step._compiled.lower(params, x, t, step._param_avals(params)).as_text()
        counts.append(text.count("stablehlo.dot_general"))
    assert counts[0] == counts[1] > 0


# --------------------------------------------------------------------------- errors
def test_bad_input_gets_typed_errors_and_the_step_keeps_working():
    mesh, num_stages = mesh_for("gpipe", data=False)
    stages, loss_fn, params, x, t = mlp_model(num_stages, fresh_key(), batch=16)
    step = pipeline(stages, loss_fn, schedule="gpipe", num_microbatches=4, mesh=mesh)
    with pytest.raises(InvalidValueError, match=r"shape \(10, 8\).*num_microbatches=4"):
        step(params, x[:10], t[:10])
    wide = [{"w": jnp.ones((8, 6)), "b": jnp.ones(6)}] + params[1:]
    with pytest.raises(StageMismatchError, match="stage 0 returns"):
        step(wide, x, t)
    with pytest.raises(InvalidInputError, match="one parameter tree per stage"):
        step(params[:1], x, t)
    loss, grads = step(params, x, t)  # still works
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 4)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


def test_meshes_the_compiled_step_cannot_use_are_refused():
    n = devices_available()
    stages = [mlp_stage, mlp_stage]
    one_axis = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("pipe",))
    with pytest.raises(InvalidValueError, match="no pipeline axis 'stage'"):
        pipeline(stages, mse, schedule="interleaved", num_microbatches=2, mesh=one_axis)
    step = pipeline(stages, mse, schedule="interleaved", num_microbatches=2, mesh=one_axis, stage_axis="pipe")
    assert step.executor == "compiled"
    extra = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("stage", "model"))
    specs = [{"w": P("stage", None), "b": None}] * 2
    step = pipeline(stages, mse, schedule="interleaved", num_microbatches=2, mesh=extra, param_specs=specs)
    params = [{"w": jnp.ones((8, 8)), "b": jnp.ones(8)}] * 2
    with pytest.raises(InvalidValueError, match="may only be sharded over the mesh's other axes"):
        step(params, jnp.ones((4, 8)), jnp.ones((4, 8)))
    with pytest.raises(InvalidInputError, match="param_specs needs the compiled executor"):
        pipeline(stages, mse, devices=[jax.devices()[0]] * 2, executor="python", param_specs=specs)
    with pytest.raises(InvalidValueError, match="distinct jax devices.*executor='python'"):
        pipeline(stages, mse, schedule="gpipe", num_microbatches=2, devices=[jax.devices()[0]] * 2)
    with pytest.raises(InvalidValueError, match="executor must be one of"):
        pipeline(stages, mse, executor="threads")
    if n >= 2:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("stage",))
        with pytest.raises(InvalidValueError, match="do not split evenly"):
            data = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("stage", "data"))
            pipeline([mlp_stage], mse, schedule="gpipe", num_microbatches=2, mesh=data)(
                [{"w": jnp.ones((8, 8)), "b": jnp.ones(8)}], jnp.ones((6, 8)), jnp.ones((6, 8)))
        three = Schedule(tuple(Action({0: 0, 1: 0, 2: 1}[a.stage], a.microbatch, a.stage, a.op) for a in
                               pipeline([mlp_stage] * 3, mse, schedule="gpipe", num_microbatches=2,
                                        executor="python", devices=[jax.devices()[0]] * 3).schedule.actions),
                         3, 2, 2)
        with pytest.raises(ScheduleError, match="ring of devices.*executor='python'"):
            pipeline([mlp_stage] * 3, mse, schedule=three.validate(), num_microbatches=2, mesh=mesh)


# --------------------------------------------------------------------------- the simulator of the compiled step
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_lockstep_simulation_sums_the_slowest_action_of_each_tick(schedule):
    from jaxaot._src.parallel import make_schedule
    rng = np.random.default_rng(len(schedule))
    stages, devices = (8, 4) if schedule == "interleaved" else (4, 4)
    sched = make_schedule(schedule, stages, 8, devices)
    times = OpTimes(*(tuple(rng.uniform(0.5, 2.0, stages)) for _ in range(3)))
    sim = simulate_lockstep(sched, times)
    p = plan(sched)
    per_op = times.stage_times(stages)
    want = sum(max(per_op[a.op][a.stage] for a, t in zip(sched.actions, p.ticks) if t == tick)
               for tick in range(p.num_ticks) if tick in set(p.ticks))
    assert sim.step_time == pytest.approx(want)
    assert sim.step_time >= simulate(sched, times).step_time - 1e-9


def test_stage_data_model_mesh_shards_each_stage_as_param_specs_say():
    """Tensor parallelism inside stages: a (stage, data, model) mesh, column-parallel weights over 'model'."""
    n = devices_available()
    if n < 8:
        pytest.skip(f"a 2 x 2 x 2 mesh needs 8 devices; {jax.device_count()} here")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("stage", "data", "model"))
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=16)
    specs = [{"w": P(None, "model"), "b": P("model")}] * 2
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh, param_specs=specs)
    packed = step.shard_params(params, x, t)
    w = packed.entries[packed.layout.places[0][1][0]]  # the entry holding the (8, 8) weights
    assert w.shape == (2, 1, 8, 8) and w.addressable_shards[0].data.shape == (1, 1, 8, 4)
    loss, grads = step(packed, x, t)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 2)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(step.unshard_params(grads), ref_grads, **TOL)
    assert all(g.sharding == p.sharding for g, p in zip(grads.entries, packed.entries))
    back = step.unshard_params(packed)
    assert back[1]["w"].sharding.spec == P(None, "model") and len(back[1]["w"].devices()) == 4


def test_param_specs_that_do_not_divide_a_parameter_and_params_packed_on_another_mesh_are_named():
    n = devices_available()
    if n < 4:
        pytest.skip(f"a 2 x 2 mesh needs 4 devices; {jax.device_count()} here")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("stage", "model"))
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=8)
    odd = [{"w_in": jnp.ones((8, 3)), "w_out": jnp.ones((3, 8))}] * 2  # a hidden width of 3 over 2 devices
    widening = pipeline([widening_stage] * 2, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh,
                        param_specs=[{"w_in": P(None, "model"), "w_out": P("model", None)}] * 2)
    with pytest.raises(InvalidValueError, match=r"param_specs\[0\]\['w_in'\].*\(8, 3\).*does not divide 3"):
        widening(odd, x, t)
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh,
                    param_specs=[{"w": P(None, "model"), "b": P("model")}] * 2)
    other = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2,
                     mesh=jax.sharding.Mesh(np.array(jax.devices()[:2]), ("stage",)))
    with pytest.raises(InvalidInputError, match="packed for another pipeline, mesh or signature"):
        other(step.shard_params(params, x, t), x, t)
    loss, grads = other(params, x, t)  # both steps keep working
    np.testing.assert_allclose(loss, unpipelined(stages, loss_fn, 2)(params, x, t)[0], **TOL)


def test_params_packed_on_another_device_order_are_not_unpacked_onto_the_wrong_stages():
    if devices_available() < 2:
        pytest.skip(f"two stages on two devices; {jax.device_count()} here")
    d = jax.devices()
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=8)
    step, swapped = (pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2,
                              mesh=jax.sharding.Mesh(np.array(order), ("stage",))) for order in ([d[0], d[1]], [d[1], d[0]]))
    packed = step.shard_params(params, x, t)
    with pytest.raises(InvalidInputError, match="packed for another pipeline or mesh: unpack them with that step's"):
        swapped.unshard_params(packed)
    with pytest.raises(InvalidInputError, match="takes the StageParams a step packed, got list"):
        swapped.unshard_params(params)
    assert_trees_close(step.unshard_params(packed), params, rtol=0, atol=0)


def test_op_times_take_packed_params_and_refuse_no_repeats():
    mesh, num_stages = mesh_for("zero_bubble", data=False)
    stages, loss_fn, params, x, t = mlp_model(num_stages, fresh_key(), batch=8)
    step = pipeline(stages, loss_fn, schedule="zero_bubble", num_microbatches=2, mesh=mesh)
    times = step.measure_op_times(step.shard_params(params, x, t), x, t, repeats=2)
    assert len(times.forward) == num_stages and all(v >= 0 for v in times.forward)  # tiny passes: noise
    for bad in (0, -1, 2.0, True):
        with pytest.raises(InvalidValueError, match=f"repeats must be a positive int, got {bad!r}"):
            step.measure_op_times(params, x, t, repeats=bad)


def test_compiled_pass_times_time_every_pass_of_every_stage():
    """Stage 0 takes integer tokens: its forward must still be timed inside the loop, not hoisted out of it."""
    mesh, num_stages = mesh_for("zero_bubble", data=False)

    def embed(p, x):
        return jnp.tanh(p["emb"][x] @ p["w"])

    stages = [embed] + [mlp_stage] * (num_stages - 1)
    k = jax.random.split(fresh_key(), num_stages + 1)
    width = 256  # passes of a fraction of a millisecond: well above the timer's noise
    params = [{"emb": jax.random.normal(k[0], (32, width)), "w": jax.random.normal(k[1], (width, width)) / 16}]
    params += [{"w": jax.random.normal(k[s + 1], (width, width)) / 16, "b": jnp.zeros(width)}
               for s in range(1, num_stages)]
    x = jax.random.randint(fresh_key(), (512,), 0, 32)
    t = jax.random.normal(fresh_key(), (512, width))
    step = pipeline(stages, mse, schedule="zero_bubble", num_microbatches=2, mesh=mesh)
    times = step.measure_op_times(params, x, t, repeats=5, source="compiled")
    for field in ("forward", "backward_weight", "backward"):
        assert all(v > 0 for v in getattr(times, field)), (field, times)
    assert all(v >= 0 for v in times.backward_input)  # stage 0's B has no input gradient to compute
    assert simulate_lockstep(step.schedule, times).step_time > 0


# --------------------------------------------------------------------------- meshes as users make them
@pytest.mark.parametrize("axis_type", ["Auto", "Explicit", "Manual"])
def test_meshes_of_every_axis_type_pipeline(axis_type):
    """``jax.make_mesh`` makes Explicit axes by default on recent JAX; every axis type serves as a pipeline mesh,
    with a tensor-parallel axis too. Inputs placed on the user's mesh and a ``jax.set_mesh`` context work as well
    (JAX itself allows neither on a Manual mesh)."""
    if devices_available() < 8:
        pytest.skip(f"a 2 x 2 x 2 mesh needs 8 devices; {jax.device_count()} here")
    kind = getattr(AxisType, axis_type)
    mesh = jax.make_mesh((2, 2, 2), ("stage", "data", "model"), axis_types=(kind,) * 3)
    stages, loss_fn, params, x, t = mlp_model(2, fresh_key(), batch=16)
    specs = [{"w": P(None, "model"), "b": P("model")}] * 2
    step = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=2, mesh=mesh, param_specs=specs)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 2)(params, x, t)
    runs = [lambda: step(params, x, t)]
    if kind != AxisType.Manual:
        runs.append(lambda: step(params, *jax.device_put((x, t), NamedSharding(mesh, P()))))

        def in_context():
            with jax.set_mesh(mesh):
                return step(params, x, t)
        runs.append(in_context)
    for run in runs:
        loss, grads = run()
        np.testing.assert_allclose(loss, ref_loss, **TOL)
        assert_trees_close(grads, ref_grads, **TOL)
    assert step.cache_info().misses == 1


DOCS = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "pipeline.md"


def test_the_pipeline_pages_first_example_runs():
    """The first block of docs/concepts/pipeline.md, on the ``jax.make_mesh`` mesh it builds, as written."""
    if devices_available() < 8:
        pytest.skip(f"the example's 4 x 2 mesh needs 8 devices; {jax.device_count()} here")
    block = re.search(r"## The step\n\n```python[^\n]*\n(.*?)```", DOCS.read_text(), flags=re.S).group(1)
    names: dict = {}
    exec(compile(block, str(DOCS), "exec"), names)
    ref_loss, ref_grads = unpipelined([names["layer"]] * 4, names["loss_fn"], 8)(
        names["params"], names["inputs"], names["targets"])
    np.testing.assert_allclose(names["loss"], ref_loss, **TOL)
    assert_trees_close(names["grads"], ref_grads, **TOL)


def test_without_a_mesh_the_schedule_is_built_once_and_sizes_the_mesh(monkeypatch):
    from jaxaot._src.parallel import training_pipeline

    built = []
    make = training_pipeline.make_schedule
    monkeypatch.setattr(training_pipeline, "make_schedule", lambda *a, **k: built.append(a) or make(*a, **k))
    stages = [mlp_stage] * 2
    if jax.device_count() >= 2:
        pipe = pipeline(stages, mse, "gpipe", num_microbatches=2)
        assert len(built) == 1 and pipe.mesh.devices.size == 2 == pipe.schedule.num_devices
    many = jax.device_count() + 1
    with pytest.raises(InvalidValueError, match=f"needs {many} devices, but JAX has {jax.device_count()}"):
        pipeline([mlp_stage] * many, mse, "1f1b", num_microbatches=2)


def test_the_persistent_cache_keys_the_pipeline_step(tmp_path):
    """The compiled step traces its stages on the pipeline's abstract mesh: the persistent cache keys them by its
    axes (no devices to name), and a second pipeline reads what the first wrote."""
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        for _ in range(2):
            check(mlp_model, "1f1b" if devices_available() > 1 else "interleaved", False, num_microbatches=2)
