"""Predicts a pipeline schedule's step time and idle time (bubble) from per-stage pass times.

An event simulation of the issue order: each action starts when its device is
free and the passes it depends on have ended (plus ``transfer`` across devices),
and lasts its stage's pass time. The bubble fraction is the share of device time
spent idle. It leaves out send contention, memory and dispatch, and costs one pass
over the actions.

Example:
    >>> from jaxaot.parallel import gpipe
    >>> sim = simulate(gpipe(4, 8), OpTimes.uniform(4))
    >>> sim.step_time, round(sim.bubble_fraction, 4), 3 / (8 + 4 - 1)
    (33.0, 0.2727, 0.2727272727272727)
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Sequence

import numpy as np

from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.parallel.schedule import Action, Schedule, dependencies, provides, unit_slots

Times = float | Sequence[float]


@dataclasses.dataclass(frozen=True)
class OpTimes:
    """How long each pass takes, in seconds, per stage (a tuple of ``num_stages``) or for all (a scalar).

    Attributes:
      forward: the forward pass (F).
      backward_input: the backward to the stage's input (B).
      backward_weight: the backward to the stage's weights (W).
      backward: the fused backward (BW); ``None`` means ``backward_input +
        backward_weight``.
      transfer: moving one activation or cotangent between two devices, charged
        to the receiving action's stage.

    Example:
        >>> from jaxaot.parallel import OpTimes
        >>> OpTimes.uniform(2, forward=1.0).stage_times(2)["BW"]
        (2.0, 2.0)
    """

    forward: Times
    backward_input: Times
    backward_weight: Times
    backward: Times | None = None
    transfer: Times = 0.0

    @classmethod
    def uniform(cls, num_stages: int, forward: float = 1.0, backward_input: float = 1.0,
                backward_weight: float = 1.0, transfer: float = 0.0) -> OpTimes:
        """The same times on every one of ``num_stages`` stages (the fused backward is B + W)."""
        def per_stage(x: float) -> tuple[float, ...]:
            return (float(x),) * num_stages
        return cls(per_stage(forward), per_stage(backward_input), per_stage(backward_weight), None,
                   per_stage(transfer))

    def stage_times(self, num_stages: int) -> dict[str, tuple[float, ...]]:
        """Each op's time per stage (keys ``"F"``, ``"B"``, ``"W"``, ``"BW"`` and ``"transfer"``).

        Raises:
          InvalidValueError: a tuple's length is not ``num_stages``, or a time is
            negative or not finite.
        """
        out = {}
        for key, name in (("F", "forward"), ("B", "backward_input"), ("W", "backward_weight"),
                          ("transfer", "transfer")):
            out[key] = _broadcast(name, getattr(self, name), num_stages)
        out["BW"] = (tuple(b + w for b, w in zip(out["B"], out["W"])) if self.backward is None
                     else _broadcast("backward", self.backward, num_stages))
        return out


def _real(v: Any) -> bool:
    """A real number of seconds: a Python, NumPy or 0-d JAX int or float (not a bool)."""
    return not isinstance(v, (bool, np.bool_)) and (isinstance(v, numbers.Real) or (
        getattr(v, "shape", None) == () and np.issubdtype(getattr(v, "dtype", object), np.number)))


def _broadcast(name: str, value: Times, num_stages: int) -> tuple[float, ...]:
    if _real(value):
        values = (value,) * num_stages
    elif isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        values = tuple(value)
    else:
        raise InvalidValueError(f"OpTimes.{name} must be seconds, a scalar or one per stage, got {value!r}")
    if len(values) != num_stages:
        raise InvalidValueError(f"OpTimes.{name} has {len(values)} entries, but the schedule has {num_stages} "
                                "stages: give one per stage, or a scalar")
    if not all(_real(v) and 0 <= float(v) < float("inf") for v in values):
        raise InvalidValueError(f"OpTimes.{name} must be finite non-negative seconds, got {value!r}")
    return tuple(float(v) for v in values)


def _check_arguments(who: str, schedule: Any, times: Any) -> None:
    if not isinstance(schedule, Schedule):
        raise InvalidInputError(f"{who} takes a Schedule (make_schedule('{schedule}', ...) builds one by name), got "
                                f"{type(schedule).__name__} {schedule!r}." if isinstance(schedule, str) else
                                f"{who} takes a Schedule, got {type(schedule).__name__}.")
    if not isinstance(times, OpTimes):
        raise InvalidInputError(f"{who} takes OpTimes (the passes' seconds per stage), got {type(times).__name__}.")


@dataclasses.dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` predicts.

    Attributes:
      step_time: when the last action ends (the first starts at 0).
      bubble_fraction: the share of device time spent idle, ``1 - sum(busy) /
        (num_devices * step_time)`` (0 when the step takes no time).
      busy: per device, the total time of its actions.
      timeline: ``(action, start, end)`` for every action, in issue order.
    """

    step_time: float
    bubble_fraction: float
    busy: tuple[float, ...]
    timeline: tuple[tuple[Action, float, float], ...]


def simulate(schedule: Schedule, times: OpTimes) -> Simulation:
    """Runs ``schedule`` in an event model and returns its timeline.

    Each action starts when its device is free and the passes it depends on have
    ended (plus ``transfer`` across devices), and lasts its stage's pass time
    (``docs/concepts/pipeline.md``, "The simulator").

    Args:
      schedule: a schedule; it is validated first.
      times: the passes' times per stage.

    Raises:
      ScheduleError: the schedule is invalid.
      InvalidValueError: ``times`` does not fit the schedule's stages.

    Example:
        >>> from jaxaot.parallel import OpTimes, one_f_one_b, simulate
        >>> sim = simulate(one_f_one_b(2, 2), OpTimes.uniform(2, transfer=0.5))
        >>> [(str(a), start) for a, start, _ in sim.timeline[:3]]
        [('F(stage=0, microbatch=0)', 0.0), ('F(stage=0, microbatch=1)', 1.0), ('F(stage=1, microbatch=0)', 1.5)]
    """
    _check_arguments("simulate", schedule, times)
    schedule.validate()
    t = times.stage_times(schedule.num_stages)
    free = [0.0] * schedule.num_devices
    busy = [0.0] * schedule.num_devices
    ended: dict[tuple[str, int, int], tuple[float, int]] = {}  # what an action provides -> (end, device)
    timeline = []
    for a in schedule.actions:
        start = free[a.device]
        for dep in dependencies(a, schedule.num_stages):
            end, device = ended[dep]
            start = max(start, end + (t["transfer"][a.stage] if device != a.device else 0.0))
        duration = t[a.op][a.stage]
        free[a.device] = start + duration
        busy[a.device] += duration
        for key in provides(a):
            ended[key] = (start + duration, a.device)
        timeline.append((a, start, start + duration))
    step = max(free)
    bubble = 1.0 - sum(busy) / (schedule.num_devices * step) if step > 0 else 0.0
    return Simulation(step, bubble, tuple(busy), tuple(timeline))


def simulate_lockstep(schedule: Schedule, times: OpTimes) -> Simulation:
    """The compiled pipeline's timeline: actions on a shared clock of ticks (``docs/concepts/pipeline.md``).

    In the compiled step every device runs at most one action per tick and
    then exchanges messages with its neighbours, so a tick lasts as long as its
    slowest action plus one transfer (when there are several devices). Each
    action takes the earliest tick its device and its inputs allow, every pass
    counted as one tick; the step time is the sum of the ticks.

    Example:
        >>> from jaxaot.parallel import OpTimes, one_f_one_b, simulate_lockstep
        >>> times = OpTimes(forward=1.0, backward_input=1.0, backward_weight=1.0)
        >>> simulate_lockstep(one_f_one_b(2, 2), times).step_time  # 6 ticks, 4 of them with a BW (2.0)
        10.0
    """
    _check_arguments("simulate_lockstep", schedule, times)
    schedule.validate()
    t = times.stage_times(schedule.num_stages)
    ticks, end = unit_slots(schedule)
    length = [0.0] * end
    for a, tick in zip(schedule.actions, ticks):
        length[tick] = max(length[tick], t[a.op][a.stage])
    if schedule.num_devices > 1:
        hop = max(t["transfer"], default=0.0)
        length = [x + hop for x in length]
    starts = [0.0]
    for x in length:
        starts.append(starts[-1] + x)
    busy = [0.0] * schedule.num_devices
    timeline = []
    for a, tick in zip(schedule.actions, ticks):
        duration = t[a.op][a.stage]
        busy[a.device] += duration
        timeline.append((a, starts[tick], starts[tick] + duration))
    step = starts[-1]
    bubble = 1.0 - sum(busy) / (schedule.num_devices * step) if step > 0 else 0.0
    return Simulation(step, bubble, tuple(busy), tuple(timeline))
