"""A schedule as a table of ticks: what each device does at each step of the compiled pipeline.

In a tick every device runs at most one action, then sends one activation forward
and one cotangent back; an action runs at the earliest tick its device and its
inputs allow, the schedule's issue order on a unit clock. Everything that lives
across ticks (residuals, weight arguments, the two inboxes) gets buffer slots
allocated here on the host by interval colouring, plus a trash slot, so the program
is a fixed-size loop driven by data and its buffers are what the schedule promises.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxaot.errors import ScheduleError
from jaxaot._src.parallel.schedule import OPS, Schedule, unit_slots

#: The table's columns, per tick and device.
COLUMNS = ("branch", "microbatch", "res_read", "res_write", "w_read", "w_write", "act_read", "recv_act",
           "ct_read", "recv_ct")
COL = {name: i for i, name in enumerate(COLUMNS)}
_OP_INDEX = {op: i for i, op in enumerate(OPS)}
KINDS = ("residuals", "weights", "activations", "cotangents")


def branch_of(stage: int, op: str) -> int:
    """The table's code for ``op`` on ``stage`` (0 is idle): ``1 + len(OPS) * stage + OPS.index(op)``."""
    return 1 + len(OPS) * stage + _OP_INDEX[op]


@dataclasses.dataclass(frozen=True)
class TickPlan:
    """A schedule laid out on ticks, with every buffer slot chosen.

    Attributes:
      schedule: the schedule.
      table: int32 ``[ticks, devices, len(COLUMNS)]``: per tick and device, the
        branch (:func:`branch_of`), the microbatch and the slots it reads and
        writes; unused slots are the trash slot (``slots[kind]``).
      slots: per kind (:data:`KINDS`), the slots each device's buffer has, the trash slot left out.
      ticks: each action's tick, in the schedule's order.
    """

    schedule: Schedule
    table: np.ndarray
    slots: dict
    ticks: tuple[int, ...]

    @property
    def num_ticks(self) -> int:
        return self.table.shape[0]


def check_ring(schedule: Schedule) -> None:
    """Raise unless stage ``s + 1`` runs on the device after stage ``s``'s (mod the device count).

    The compiled step moves activations one device forward around a ring and
    cotangents one device back, which is how every built-in schedule places stages.
    """
    where = schedule.stage_device()
    d = schedule.num_devices
    for s in range(schedule.num_stages - 1):
        if where[s + 1] != (where[s] + 1) % d:
            raise ScheduleError(
                f"stage {s} runs on device {where[s]} and stage {s + 1} on device {where[s + 1]}: the compiled "
                f"pipeline passes activations around a ring of devices, so stage {s + 1} must run on device "
                f"{(where[s] + 1) % d}. Place stage s on device s % {d}, or pass executor='python'.")


def _colour(intervals: list[tuple[int, int, object]]) -> tuple[dict, int]:
    """Slots for closed tick intervals ``(first, last, key)``: ``({key: slot}, slots used)``."""
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last, slot)
    out, used = {}, 0
    for first, last, key in sorted(intervals, key=lambda x: (x[0], x[1])):
        busy.sort()
        while busy and busy[0][0] < first:
            free.append(busy.pop(0)[1])
        if free:
            free.sort()
            slot = free.pop(0)
        else:
            slot, used = used, used + 1
        out[key] = slot
        busy.append((last, slot))
    return out, used


def plan(schedule: Schedule) -> TickPlan:
    """Lay ``schedule`` out on ticks and allocate every buffer slot (see the module docstring)."""
    check_ring(schedule)
    ticks, _ = unit_slots(schedule)
    at = {(a.op, a.stage, a.microbatch): t for a, t in zip(schedule.actions, ticks)}
    back = {(a.stage, a.microbatch): (a.op, t) for a, t in zip(schedule.actions, ticks) if a.op in ("B", "BW")}
    last = schedule.num_stages - 1
    per_device: dict[str, list[list]] = {k: [[] for _ in range(schedule.num_devices)] for k in KINDS}
    for a, t in zip(schedule.actions, ticks):
        s, m, d = a.stage, a.microbatch, a.device
        if a.op == "F":
            per_device["residuals"][d].append((t + 1, back[(s, m)][1], (s, m)))
            if s > 0:
                per_device["activations"][d].append((at[("F", s - 1, m)] + 1, t, (s, m)))
        elif a.op == "B":
            per_device["weights"][d].append((t + 1, at[("W", s, m)], (s, m)))
        if a.op in ("B", "BW") and s < last:
            per_device["cotangents"][d].append((back[(s + 1, m)][1] + 1, t, (s, m)))
    slot: dict[str, dict] = {}
    sizes: dict[str, int] = {}
    for kind in KINDS:
        slot[kind], sizes[kind] = {}, 0
        for intervals in per_device[kind]:
            chosen, used = _colour(intervals)
            slot[kind].update(chosen)
            sizes[kind] = max(sizes[kind], used)
    table = _table(schedule, ticks, slot, sizes)
    return TickPlan(schedule, table, sizes, tuple(ticks))


def _table(schedule: Schedule, ticks: list[int], slot: dict, sizes: dict) -> np.ndarray:
    trash = {k: sizes[k] for k in KINDS}
    t_end = max(ticks, default=-1) + 1
    table = np.zeros((t_end, schedule.num_devices, len(COLUMNS)), np.int32)
    for name, kind in (("res_read", "residuals"), ("res_write", "residuals"), ("w_read", "weights"),
                       ("w_write", "weights"), ("act_read", "activations"), ("recv_act", "activations"),
                       ("ct_read", "cotangents"), ("recv_ct", "cotangents")):
        table[:, :, COL[name]] = trash[kind]
    last = schedule.num_stages - 1
    d_count = schedule.num_devices
    for a, t in zip(schedule.actions, ticks):
        row = table[t, a.device]
        s, m = a.stage, a.microbatch
        row[COL["branch"]] = branch_of(s, a.op)
        row[COL["microbatch"]] = m
        if a.op == "F":
            row[COL["res_write"]] = slot["residuals"][(s, m)]
            if s > 0:
                row[COL["act_read"]] = slot["activations"][(s, m)]
            if s < last:  # the next device stores the activation this F sends
                table[t, (a.device + 1) % d_count, COL["recv_act"]] = slot["activations"][(s + 1, m)]
        elif a.op == "W":
            row[COL["w_read"]] = slot["weights"][(s, m)]
        else:
            row[COL["res_read"]] = slot["residuals"][(s, m)]
            if a.op == "B":
                row[COL["w_write"]] = slot["weights"][(s, m)]
            if s < last:
                row[COL["ct_read"]] = slot["cotangents"][(s, m)]
            if s > 0:  # the previous device stores the cotangent this backward sends
                table[t, (a.device - 1) % d_count, COL["recv_ct"]] = slot["cotangents"][(s - 1, m)]
    return table
