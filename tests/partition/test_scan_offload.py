"""Offloading inside ``lax.scan`` bodies, and residuals a JAX offload policy already put in host memory.

jax 0.10.2's CPU backend runs ``pinned_host`` programs for real (host-to-host
copies), so the offloaded programs run here; a synthetic
:class:`~jaxaot._src.partition.costs.device_model.DeviceModel` forces offloading, since the
measured CPU model has no separate host memory.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile.partition_codec import decode, encode
from jaxaot._src.partition import DeviceModel, Timeline
from jaxaot._src.partition import min_cut_rematerialization_partition as mincut
from jaxaot._src.partition.costs import MIN_OVERLAP
from jaxaot._src.partition.offload import scan_offload
from zoo import assert_trees_close
from zoo_models import MODELS

FAST = DeviceModel(host_bandwidth=2e10, device_flops=1e11, device_bandwidth=1e11)
SLOW = DeviceModel(host_bandwidth=1e6, device_flops=1e11, device_bandwidth=1e11)
NO_SCAN_OVERLAP = DeviceModel(host_bandwidth=2e10, device_flops=1e11, device_bandwidth=1e11, scan_overlap=0.1)
def close(actual, expected):
    """Equal to float32 precision: elementwise rtol 1e-5, and an atol of 1e-6 of the largest magnitude
    (gradients of ~1e3 summed in another order, as a GPU does, differ by ~1e-4 near zero)."""
    scale = max([1.0] + [float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(expected)])
    assert_trees_close(actual, expected, rtol=1e-5, atol=1e-6 * scale)


def layers(ws, h):
    def step(h, w):
        a = jnp.tanh(h @ w)
        return h + jax.nn.gelu(a @ w.T), None
    return jnp.sum(jax.lax.scan(step, h, ws)[0] ** 2)


def layers_args(n=6, width=256, seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (n, width, width)) / 16, jax.random.normal(k2, (width, width))


def scan_residuals(part):
    return [r for r in part.residuals if r.producer == "scan" and r.source == "temporary"]


# --------------------------------------------------------------------------- the plan
def _body_timeline(model):
    joint = jaxaot.partition.trace_joint(lambda w, h: jnp.sum(jax.nn.gelu(jnp.tanh(h @ w) @ w.T)),
                               jnp.ones((256, 256)), jnp.ones((256, 256)))
    tl = Timeline.of(joint, model)
    return tl, list(tl.produced)


def test_body_plan_fits_one_iteration_largest_first():
    tl, values = _body_timeline(FAST)
    plan = scan_offload.plan_body_offload(tl, values, FAST, min_bytes=0)
    assert plan.offloaded and not plan.note
    window = min(tl.forward_seconds, tl.backward_seconds)
    busy = sum(FAST.hidden_seconds(v.aval.size * v.aval.dtype.itemsize, in_scan=True) for v in plan.offloaded)
    assert busy <= window
    # maximal: no value left out would still fit, and none smaller went before a larger that fits
    left = [v for v in values if v not in plan.offloaded and v in tl.produced and v not in tl.outputs]
    for v in left:
        assert busy + FAST.hidden_seconds(v.aval.size * v.aval.dtype.itemsize, in_scan=True) > window


def test_body_plan_keeps_to_the_copy_slots():
    tl, values = _body_timeline(FAST)
    free = scan_offload.plan_body_offload(tl, values, FAST, min_bytes=0)
    assert len(free.offloaded) > 1
    one = scan_offload.plan_body_offload(tl, values, dataclasses.replace(FAST, copy_slots=1), min_bytes=0)
    size = lambda v: v.aval.size * v.aval.dtype.itemsize  # noqa: E731
    assert len(one.offloaded) == 1 and size(one.offloaded[0]) == max(map(size, free.offloaded))


def test_body_plan_offloads_nothing_on_a_slow_link_or_without_scan_overlap():
    for model in (SLOW, NO_SCAN_OVERLAP):
        tl, values = _body_timeline(model)
        plan = scan_offload.plan_body_offload(tl, values, model, min_bytes=0)
        assert plan.offloaded == ()
        assert plan.note.startswith("nothing offloaded")
    assert "inside a scan body" in NO_SCAN_OVERLAP.scan_offload_note
    assert NO_SCAN_OVERLAP.offload_note == ""  # between the programs it still may


def test_low_overlap_offloads_nothing_anywhere_and_says_why():
    model = DeviceModel(host_bandwidth=2e10, device_flops=1e11, overlap=MIN_OVERLAP / 2, scan_overlap=0.0)
    part = mincut(jaxaot.partition.trace_joint(layers, *layers_args()), offload=True, device_model=model)
    assert not any(r.offloaded for r in part.residuals)
    assert "hid only" in part.offload_note


# --------------------------------------------------------------------------- the partition
@pytest.mark.parametrize("budget", [1.0, 0.5, 0.0])
def test_scan_bodies_offload_and_gradients_equal_jax(budget):
    args = layers_args()
    part_fn = functools.partial(mincut, memory_budget=budget, offload=True, device_model=FAST)
    part = part_fn(jaxaot.partition.trace_joint(layers, *args))
    host = [r for r in scan_residuals(part) if r.offloaded]
    assert host and all(r.in_joint_host for r in host)
    assert part.device_saved_bytes == part.saved_bytes - sum(r.nbytes for r in part.residuals if r.offloaded)
    ref_v, ref_g = jax.value_and_grad(layers)(*args)
    g = jaxaot.aot_function(layers, partition_fn=part_fn)
    for fused in (True, False):
        v, grads = jaxaot.value_and_grad(g, fused=fused)(*args)
        close((v, grads), (ref_v, ref_g))
    close(jax.jit(jax.grad(g))(*args), ref_g)
    fresh = layers_args(seed=7)  # fresh inputs through the same compiled programs
    close(jaxaot.value_and_grad(g)(*fresh), jax.value_and_grad(layers)(*fresh))


def test_scan_offload_lowers_device_bytes_and_budget_sweeps_stay_monotone():
    joint = jaxaot.partition.trace_joint(layers, *layers_args())
    budgets = [1.0, 0.75, 0.5, 0.25, 0.0]
    with_offload = [mincut(joint, memory_budget=b, offload=True, device_model=FAST).device_saved_bytes for b in budgets]
    without = [mincut(joint, memory_budget=b).device_saved_bytes for b in budgets]
    assert all(a >= b for a, b in zip(with_offload, with_offload[1:]))
    assert all(w <= o for w, o in zip(with_offload, without))
    assert with_offload[0] < without[0]


def test_without_scan_overlap_only_the_top_level_may_offload():
    part = mincut(jaxaot.partition.trace_joint(layers, *layers_args()), offload=True, device_model=NO_SCAN_OVERLAP)
    assert not any(r.in_joint_host for r in part.residuals)


def test_lower_marks_scan_offloaded_residuals():
    pf = functools.partial(mincut, offload=True, device_model=FAST)
    low = jaxaot.aot_function(layers, partition_fn=pf).lower(*layers_args())
    text = low.details()
    assert "offloaded" in text and "bytes offloaded to host memory" in text
    assert low.device_saved_bytes < low.saved_bytes


def test_the_cache_codec_replays_the_offloaded_scan_plan():
    joint = jaxaot.partition.trace_joint(layers, *layers_args())
    part = mincut(joint, offload=True, device_model=FAST)
    assert any("offloaded" in rec for rec in part.primal_plan.values())
    again = decode(joint.recipe, encode(joint, part), lambda: joint)
    assert [(r.aval, r.offloaded, r.in_joint_host) for r in again.residuals] == \
        [(r.aval, r.offloaded, r.in_joint_host) for r in part.residuals]
    assert str(again.forward) == str(part.forward) and str(again.backward) == str(part.backward)


def test_nested_scans_offload_only_at_the_top_level():
    def nested(ws, h):
        def outer(h, w):
            def inner(h, _):
                return jnp.tanh(h @ w), None
            return jax.lax.scan(inner, h, None, length=3)[0], None
        return jnp.sum(jax.lax.scan(outer, h, ws)[0] ** 2)

    args = layers_args(n=3)
    pf = functools.partial(mincut, offload=True, device_model=FAST)
    g = jaxaot.aot_function(nested, partition_fn=pf)
    close(jaxaot.value_and_grad(g)(*args), jax.value_and_grad(nested)(*args))
    plan = pf(jaxaot.partition.trace_joint(nested, *args)).primal_plan
    assert plan and all(rec["nested"] for rec in plan.values())
    for rec in plan.values():
        assert all("offloaded" not in inner for inner in rec["nested"].values())


@pytest.mark.parametrize("name", ["gru_scan", "gpt_scanned"])
def test_zoo_scan_models_with_scan_offload_equal_jax(name):
    model = MODELS[name]
    args = model.make_args(jax.random.key(11))
    pf = functools.partial(mincut, offload=True, device_model=FAST)
    g = jaxaot.aot_function(model.loss, partition_fn=pf)
    got = jaxaot.value_and_grad(g, argnums=model.argnums)(*args)
    want = jax.value_and_grad(model.loss, argnums=model.argnums)(*args)
    assert_trees_close(got, want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- a JAX offload policy in user code
def policy_offloaded(ws, h):
    pol = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["a"], offload_src="device",
        offload_dst="pinned_host")

    def step(h, w):
        a = jax.ad_checkpoint.checkpoint_name(jnp.sin(h @ w), "a")
        return jnp.tanh(a) + h, None
    return jnp.sum(jax.lax.scan(jax.checkpoint(step, policy=pol), h, ws)[0])


@pytest.mark.parametrize("partition", ["default", "min_cut"])
def test_user_offload_policy_in_a_scan_runs_split_and_fused(partition):
    pf = jaxaot.partition.default_partition if partition == "default" else mincut
    args = layers_args(n=4, width=64)
    g = jaxaot.aot_function(policy_offloaded, partition_fn=pf)
    want = jax.value_and_grad(policy_offloaded)(*args)
    for fused in (True, False):  # split: the backward is compiled for the host-memory residual
        close(jaxaot.value_and_grad(g, fused=fused)(*args), want)
    part = pf(jaxaot.partition.trace_joint(policy_offloaded, *args))
    if partition == "default":
        (host,) = [r for r in part.residuals if r.offloaded]
        assert host.in_joint_host and part.device_saved_bytes == part.saved_bytes - host.nbytes


def test_host_values_cost_the_min_cut_no_device_bytes():
    from jaxaot._src.pytrees import device_nbytes, in_host_memory, nbytes
    x = jax.device_put(jnp.ones(8), jax.memory.Space.Host)
    aval = jax.typeof(x) if hasattr(jax, "typeof") else x.aval
    assert in_host_memory(aval) and device_nbytes(aval) == 0 and nbytes(aval) == 32
    assert not in_host_memory(jax.ShapeDtypeStruct((8,), np.float32))
