"""The offload planner on synthetic device models: which residuals go to host memory, and the budget.

No GPU is needed: a :class:`DeviceModel` states the host link's bandwidth and
the device's FLOP/s, and the plan follows from the joint graph's timeline.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import PartitionError
from jaxaot._src.partition import DeviceModel, Timeline, offload
from jaxaot._src.partition import min_cut_rematerialization_partition as mincut
from zoo import deep_mlp, deep_mlp_args, transformer_args, transformer_block

BUDGETS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
FAST = DeviceModel(host_bandwidth=1e12, device_flops=1e12)
MID = DeviceModel(host_bandwidth=5e9, device_flops=1e12)
SLOW = DeviceModel(host_bandwidth=1e3, device_flops=1e12)
SLOTTED = DeviceModel(host_bandwidth=1e12, device_flops=1e12, copy_slots=2)  # FAST, two copies in flight at once
NO_HOST = DeviceModel(host_bandwidth=1e12, device_flops=1e12, has_host_memory=False, note="nothing offloaded: test")


# --------------------------------------------------------------------------- models
MODELS = {"deep_mlp": (deep_mlp, deep_mlp_args), "transformer_block": (transformer_block, transformer_args)}


@functools.lru_cache(maxsize=None)
def joint_of(name):
    fn, make_args = MODELS[name]
    return jaxaot.partition.trace_joint(fn, *make_args())


def offloaded_residuals(part):
    return [r for r in part.residuals if r.offloaded]


def plan_of(name, model, budget=1.0):
    joint = joint_of(name)
    part = mincut(joint, memory_budget=budget)
    saved = offload.saved_vars(part)
    timeline = Timeline.of(joint, model)
    return joint, part, saved, timeline, offload.plan_offload(timeline, saved, model)


def _fits(model, timeline, saved, chosen):
    need = timeline.needed_at(set(saved))
    items = [(timeline.produced[v], need[v], model.hidden_seconds(v.aval.size * v.aval.dtype.itemsize))
             for v in chosen]
    t = 0.0
    for produced, _, copy in sorted(items):
        t = max(t, produced) + copy
        if t > timeline.forward_seconds:
            return False
    t = 0.0
    for _, needed, copy in sorted(items, key=lambda it: it[1]):
        t += copy
        if t > needed:
            return False
    return True


# --------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("headroom", [1.0, 1.5])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_plan_fits_the_overlap_and_is_maximal(name, headroom):
    model = dataclasses.replace(MID, headroom=headroom)
    joint, part, saved, timeline, plan = plan_of(name, model)
    assert plan.offloaded, "the synthetic model leaves room to offload something"
    assert _fits(model, timeline, saved, plan.offloaded)
    alive_anyway = inputs_and_outputs(joint)
    candidates = [v for v in saved if v in timeline.produced and v not in alive_anyway
                  and v.aval.size * v.aval.dtype.itemsize >= offload.DEFAULT_MIN_BYTES]
    for v in candidates:
        if v not in plan.offloaded:  # each value left on the device would not fit beside the chosen ones
            assert not _fits(model, timeline, saved, plan.offloaded + (v,))
    assert plan.nbytes == sum(v.aval.size * v.aval.dtype.itemsize for v in plan.offloaded)


def inputs_and_outputs(joint):
    jaxpr = C.jaxpr_of(joint.jaxpr)
    return {v for v in (*jaxpr.invars[: joint.num_primals], *jaxpr.outvars[: joint.num_outputs])
            if not C.is_literal(v)}


def test_largest_residuals_go_first():
    # Room for 1.2 MiB of transfers: the first layer's 1 MiB activation goes, and nothing else fits.
    def widening(w1, w2, w3, w4, x):
        h = jnp.tanh(x @ w1)           # [256, 1024]: 1 MiB, produced first, needed last
        for w in (w2, w3, w4):
            h = jnp.tanh(h @ w)        # [256, 256]: 256 KiB each
        return jnp.sum(h ** 2)

    ks = jax.random.split(jax.random.key(2), 5)
    args = (jax.random.normal(ks[0], (256, 1024)) / 16, jax.random.normal(ks[1], (1024, 256)) / 32,
            jax.random.normal(ks[2], (256, 256)) / 16, jax.random.normal(ks[3], (256, 256)) / 16,
            jax.random.normal(ks[4], (256, 256)))
    joint = jaxaot.partition.trace_joint(widening, *args)
    saved = offload.saved_vars(mincut(joint))
    unit = Timeline.of(joint, FAST)
    large = [v for v in saved if v in unit.produced and v.aval.shape == (256, 1024)]
    assert len(large) == 1
    # Its copies have the rest of the forward, and the backward until layer 2's gradients.
    window = min(unit.forward_seconds - unit.produced[large[0]], unit.needed_at(set(saved))[large[0]])
    model = DeviceModel(host_bandwidth=1.2 * 2**20 / window, device_flops=FAST.device_flops)
    plan = offload.plan_offload(Timeline.of(joint, model), saved, model, min_bytes=0)
    assert plan.offloaded == (large[0],) and plan.nbytes == 2**20
    # With a link four times as fast, the smaller ones follow.
    model = DeviceModel(host_bandwidth=4.8 * 2**20 / window, device_flops=FAST.device_flops)
    plan = offload.plan_offload(Timeline.of(joint, model), saved, model, min_bytes=0)
    assert plan.offloaded[0] is large[0] and len(plan.offloaded) > 1


def test_fast_link_offloads_all_but_what_the_backward_needs_first():
    joint = joint_of("deep_mlp")
    part = mincut(joint, offload=True, device_model=FAST)
    temps = [r for r in part.residuals if r.source == "temporary"]
    assert len(offloaded_residuals(part)) == len(temps) - 1  # the last layer's is needed at once
    assert not temps[-1].offloaded and all(r.offloaded for r in temps[:-1])
    assert part.device_saved_bytes == part.saved_bytes - sum(r.nbytes for r in temps[:-1])
    assert part.offload_note == ""


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_more_values_than_copy_slots_and_the_largest_go(name, slots):
    model = dataclasses.replace(FAST, copy_slots=slots)
    joint, part, saved, timeline, free = plan_of(name, FAST)
    plan = offload.plan_offload(timeline, saved, model)
    assert len(free.offloaded) > slots, "the unlimited plan offloads more than the slots allow"
    assert len(plan.offloaded) == slots and set(plan.offloaded) <= set(free.offloaded)
    size = lambda v: v.aval.size * v.aval.dtype.itemsize  # noqa: E731
    assert min(map(size, plan.offloaded)) >= max(size(v) for v in free.offloaded if v not in plan.offloaded)
    # Through the partitioner too, and the budget still counts device bytes.
    for b in (1.0, 0.5):
        moved = mincut(joint, memory_budget=b, offload=True, device_model=model)
        assert (b < 1 or offloaded_residuals(moved)) and len(offloaded_residuals(moved)) <= slots
        assert moved.device_saved_bytes <= mincut(joint, memory_budget=b, op_costs=model.flop_costs).saved_bytes


@pytest.mark.parametrize("name", sorted(MODELS))
def test_headroom_past_every_window_offloads_nothing(name):
    # Each offloaded value alone: its windows (to the forward's end, to its first need) in copies.
    joint, part, saved, timeline, plan = plan_of(name, MID)
    windows = timeline.windows(set(saved))
    slack = [min(windows[v]) / MID.transfer_seconds(v.aval.size * v.aval.dtype.itemsize) for v in plan.offloaded]
    tight = dataclasses.replace(MID, headroom=0.99 * max(slack))
    assert tight.hidden_seconds(1 << 20) == pytest.approx(0.99 * max(slack) * MID.transfer_seconds(1 << 20))
    assert offload.plan_offload(timeline, saved, tight).offloaded, "the roomiest value still fits"
    none = offload.plan_offload(timeline, saved, dataclasses.replace(MID, headroom=1.01 * max(slack)))
    assert not none.offloaded and "fit" in none.note


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1.25", None])
def test_bad_headroom_is_refused(bad):
    from jaxaot.errors import InvalidValueError
    with pytest.raises(InvalidValueError, match="headroom"):
        DeviceModel(host_bandwidth=5e9, device_flops=1e12, headroom=bad)


def test_a_measured_device_plans_with_headroom():
    from jaxaot._src.partition.costs import MEASURED_HEADROOM
    assert MEASURED_HEADROOM > 1 and DeviceModel.measure().headroom == MEASURED_HEADROOM


@pytest.mark.parametrize("name", sorted(MODELS))
def test_slow_link_offloads_nothing(name):
    part = mincut(joint_of(name), offload=True, device_model=SLOW)
    assert not offloaded_residuals(part)
    assert part.device_saved_bytes == part.saved_bytes == mincut(joint_of(name)).saved_bytes
    assert "fit" in part.offload_note


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_host_memory_offloads_nothing_and_says_why(name):
    part = mincut(joint_of(name), memory_budget=0.5, offload=True, device_model=NO_HOST)
    assert not offloaded_residuals(part) and part.offload_note == "nothing offloaded: test"
    # Priced alike: a given device model prices eqns at its rates (on a GPU the plain plan would time them).
    assert part.saved_bytes == mincut(joint_of(name), memory_budget=0.5, op_costs=NO_HOST.flop_costs).saved_bytes


@pytest.mark.skipif(jax.devices()[0].platform != "cpu", reason="what the CPU backend does")
def test_auto_on_cpu_offloads_nothing_and_says_why():
    model = DeviceModel.measure()
    assert model is DeviceModel.measure()  # measured once per process
    assert jax.devices()[0].platform == "cpu" and not model.has_host_memory and "cpu" in model.note
    part = mincut(joint_of("deep_mlp"), offload="auto")
    assert not offloaded_residuals(part) and "cpu" in part.offload_note


def test_offload_options_are_checked():
    with pytest.raises(PartitionError, match="offload"):
        mincut(joint_of("deep_mlp"), offload="always")
    with pytest.raises(PartitionError, match="DeviceModel"):
        mincut(joint_of("deep_mlp"), offload=True, device_model={"host_bandwidth": 1})


def test_only_temporaries_can_be_offloaded():
    part = mincut(joint_of("deep_mlp"))
    with pytest.raises(PartitionError, match="temporaries"):
        offload.apply_offload(part, [0])  # a primal input


# --------------------------------------------------------------------------- the budget
@pytest.mark.parametrize("model", [FAST, MID, SLOTTED], ids=["fast", "mid", "two-slots"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_device_bytes_respect_the_budget_and_sweeps_are_monotone(name, model):
    joint = joint_of(name)
    device = []
    for b in BUDGETS:
        plain = mincut(joint, memory_budget=b, op_costs=model.flop_costs)  # priced as the offloading plan is
        part = mincut(joint, memory_budget=b, offload=True, device_model=model)
        # The budget counts device bytes: offloading never adds any, and recomputes no more.
        assert part.device_saved_bytes <= plain.saved_bytes
        assert part.saved_bytes >= part.device_saved_bytes
        device.append(part.device_saved_bytes)
    assert device == sorted(device), f"device bytes against {BUDGETS}: {device}"


def test_offloading_replaces_recomputation_below_budget_one():
    joint = joint_of("deep_mlp")
    plain = mincut(joint, memory_budget=0.5)
    part = mincut(joint, memory_budget=0.5, offload=True, device_model=FAST)
    assert len(part.recomputed) < len(plain.recomputed)  # met by offloading instead of recomputing matmuls
    assert part.device_saved_bytes <= plain.saved_bytes


def test_offload_partition_post_pass_keeps_the_saved_set():
    joint = joint_of("transformer_block")
    part = jaxaot.partition.default_partition(joint)
    moved = offload.offload_partition(joint, part, FAST)
    assert [r.aval for r in moved.residuals] == [r.aval for r in part.residuals]
    assert offloaded_residuals(moved) and moved.device_saved_bytes < part.saved_bytes
    assert all(r.source == "temporary" for r in offloaded_residuals(moved))


def test_transfer_eqns_per_offloaded_residual():
    joint = joint_of("transformer_block")
    part = mincut(joint, offload=True, device_model=MID)
    n = len(offloaded_residuals(part))
    assert n > 0
    fwd = [e for e in part.forward.jaxpr.eqns if e.primitive.name == "device_put"]
    bwd = [e for e in part.backward.jaxpr.eqns if e.primitive.name == "device_put"]
    assert len(fwd) == len(bwd) == n
    assert all(e.params["devices"] == (jax.memory.Space.Host,) for e in fwd)
    assert all(e.params["devices"] == (jax.memory.Space.Device,) for e in bwd)
    # The backward takes them in host memory.
    n_ct = len(part.cotangent_outputs)
    hosts = [a.memory_space == jax.memory.Space.Host for a in part.backward.in_avals[n_ct:]]
    assert hosts == [r.offloaded for r in part.residuals]


def test_saved_vars_see_through_the_copies_back():
    joint = joint_of("deep_mlp")
    plain = mincut(joint)
    part = mincut(joint, offload=True, device_model=FAST)
    assert offloaded_residuals(part)
    assert offload.saved_vars(part) == offload.saved_vars(plain)  # the same joint vars, offloaded or not
