"""A partition as a cache entry: saved var positions that rebuild it."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile import partition_codec
from jaxaot._src.partition import DeviceModel, min_cut_rematerialization_partition


def _joint():
    return jaxaot.partition.trace_joint(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2), jnp.ones((6, 3)), jnp.ones((4, 6)))


def _decode(joint, payload):
    return partition_codec.decode(joint.recipe, payload, lambda: joint)


def test_a_partition_round_trips():
    joint = _joint()
    part = jaxaot.partition.default_partition(joint)
    payload = partition_codec.encode(joint, part)
    assert json.loads(payload)["saved"]
    back = _decode(joint, payload)
    assert back.saved_inputs == part.saved_inputs and back.saved_outputs == part.saved_outputs
    assert str(back.forward) == str(part.forward) and str(back.backward) == str(part.backward)


def test_payloads_that_do_not_rebuild_decode_to_none():
    joint = _joint()
    record = json.loads(partition_codec.encode(joint, jaxaot.partition.default_partition(joint)))
    for bad in ({**record, "format": 0}, {**record, "saved": [["x", 0]]}, {**record, "saved": [["e", 99999, 0]]},
                {**record, "summary": {}}):
        assert _decode(joint, json.dumps(bad).encode()) is None
    assert _decode(joint, b"not json") is None


def test_an_offloaded_partition_round_trips():
    """Offloaded residuals are stored as positions and re-applied: the same programs and offload flags."""
    ws = [jnp.asarray(np.random.default_rng(i).normal(size=(256, 256)), jnp.float32) for i in range(4)]
    x = jnp.asarray(np.random.default_rng(9).normal(size=(256, 256)), jnp.float32)

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    joint = jaxaot.partition.trace_joint(loss, ws, x)
    part = min_cut_rematerialization_partition(joint, offload=True,
                                               device_model=DeviceModel(host_bandwidth=1e12, device_flops=1e12))
    assert any(r.offloaded for r in part.residuals)
    payload = partition_codec.encode(joint, part)
    assert payload is not None and json.loads(payload)["offloaded"]
    back = _decode(joint, payload)
    assert [r.offloaded for r in back.residuals] == [r.offloaded for r in part.residuals]
    assert str(back.forward) == str(part.forward) and str(back.backward) == str(part.backward)
    assert back.device_saved_bytes == part.device_saved_bytes


def test_a_byte_budget_plan_keeps_its_measured_peak():
    """The runtime holds its fused step to ``step_peak.budget``: a cached plan must carry it."""
    joint = _joint()
    part = min_cut_rematerialization_partition(joint, memory_budget="1MB")
    assert part.step_peak is not None and part.step_peak.budget == 10**6
    back = _decode(joint, partition_codec.encode(joint, part))
    assert back.step_peak == part.step_peak
    assert _decode(joint, partition_codec.encode(joint, jaxaot.partition.default_partition(joint))).step_peak is None


def test_the_joint_graphs_own_errors_are_raised_not_blamed_on_the_entry():
    """An entry without a rewrite needs the caller's joint graph: a failure building it is the caller's error,
    raised, not a corrupt entry (which would be evicted and rebuilt)."""
    joint = _joint()
    payload = partition_codec.encode(joint, jaxaot.partition.default_partition(joint))

    def broken():
        raise ValueError("the joint graph could not be traced")

    with pytest.raises(ValueError, match="could not be traced"):
        partition_codec.decode(joint.recipe, payload, broken)
