"""Reading a compiled schedule's copies: how many are in flight at once, and what runs beside each."""

from __future__ import annotations

import jax
import pytest

from jaxaot._src.partition import DeviceModel
from jaxaot._src.partition.costs import copy_slots


def schedule(*ops: str) -> str:
    """A scheduled HLO module whose entry computation runs ``ops`` in order: ``s:x`` starts copy x,
    ``d:x`` ends it, ``k`` is a kernel."""
    lines = ["HloModule m, is_scheduled=true", "", "%fused_f (p: f32[4]) -> f32[4] {",
             "  ROOT %c = f32[4] copy-start(%p)", "}", "", "ENTRY %main (a: f32[4]) -> f32[4] {"]
    for i, op in enumerate(ops):
        if op == "k":
            lines.append(f"  %fusion.{i} = f32[4]{{0}} fusion(%a), kind=kLoop, calls=%fused_f")
        elif op.startswith("s:"):
            lines.append(f"  %copy-start.{op[2:]} = (f32[4]{{0:S(5)}}, f32[4]{{0}}, u32[]) copy-start(%a), "
                         f'backend_config={{"operation_queue_id":"1"}}')
        else:
            lines.append(f"  %copy-done.{op[2:]} = f32[4]{{0}} copy-done(%copy-start.{op[2:]}), "
                         f'metadata={{scheduling_name="copy-done.{op[2:]}"}}')
    return "\n".join([*lines, "}"])


@pytest.mark.parametrize("ops, most, beside", [
    ((), 0, []),
    (("k", "k"), 0, []),
    (("s:1", "k", "k", "d:1", "s:2", "k", "d:2"), 1, [2, 1]),
    (("s:1", "s:2", "k", "d:1", "k", "d:2"), 2, [1, 2]),
    (("s:1", "s:2", "d:1", "s:3", "k", "k", "d:2", "d:3"), 2, [0, 2, 2]),  # a slot freed early: nothing beside it
    (("s:1", "s:2", "s:3", "k", "d:3", "d:2", "d:1"), 3, [1, 1, 1]),
])
def test_copies_in_flight_and_kernels_beside_them(ops, most, beside):
    text = schedule(*ops)
    assert copy_slots.copies_in_flight(text) == most
    assert copy_slots.kernels_beside_copies(text) == beside


def test_only_the_entry_computation_counts():
    # The helper computation above the entry holds a copy-start of its own; it is not in the schedule.
    assert copy_slots.copies_in_flight(schedule("k")) == 0


def test_measured_slots_on_this_backend():
    device = jax.devices()[0]
    slots = copy_slots.measure_copy_slots(device)
    if device.platform == "cpu":
        assert slots is None  # the CPU makes no asynchronous copies: no limit to plan around
    else:
        assert slots is None or 1 <= slots < copy_slots.PROBE_COPIES
    assert DeviceModel.measure(device).copy_slots == slots


def test_a_backend_that_cannot_compile_the_probe_sets_no_limit():
    assert copy_slots.measure_copy_slots(jax.devices()[0], host_memory_kind="no_such_memory") is None
