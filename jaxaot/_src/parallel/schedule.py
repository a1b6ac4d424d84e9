"""Pipeline-parallel schedules as data: which device runs which pass of which microbatch, in what order.

Stage ``s`` runs ``F`` (forward), ``B`` (backward to the input), ``W`` (backward to
the weights, deferrable) or ``BW`` (both) on each microbatch. A :class:`Schedule`
is a tuple of :class:`Action` in a global issue order that respects every
dependency, so a runtime dispatching in that order never deadlocks;
:meth:`Schedule.validate` checks it and names the first break. The built-in
schedules (GPipe, 1F1B, interleaved, zero-bubble) are in
:mod:`jaxaot._src.parallel.builtin`.

Example:
    >>> from jaxaot._src.parallel.builtin import one_f_one_b
    >>> s = one_f_one_b(num_stages=3, num_microbatches=4)
    >>> s.peak_live_microbatches()
    [3, 2, 1]
    >>> print(s)
    device 0 | F0  F1  F2  .   .   BW0 F3  BW1 .   BW2 .   BW3
    device 1 | .   F0  F1  .   BW0 F2  BW1 F3  BW2 .   BW3 .
    device 2 | .   .   F0  BW0 F1  BW1 F2  BW2 F3  BW3 .   .
"""

from __future__ import annotations

import dataclasses

from jaxaot.errors import InvalidInputError, InvalidValueError, ScheduleError

#: The passes: forward, backward to the input, backward to the weights, fused backward.
OPS = ("F", "B", "W", "BW")
#: The names :func:`make_schedule` accepts.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")


@dataclasses.dataclass(frozen=True)
class Action:
    """One pass of one microbatch through one stage, on one device.

    Attributes:
      device: the device that runs it, in ``range(num_devices)``.
      microbatch: the microbatch, in ``range(num_microbatches)``.
      stage: the stage, in ``range(num_stages)``.
      op: one of :data:`OPS`.
    """

    device: int
    microbatch: int
    stage: int
    op: str

    def __str__(self) -> str:
        return f"{self.op}(stage={self.stage}, microbatch={self.microbatch})"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: every pass of every microbatch through every stage, in a global issue order.

    Attributes:
      actions: the actions, in an order that respects every dependency (``docs/concepts/pipeline.md``,
        "Schedules are data"); each device runs its own subsequence in this order.
      num_stages, num_microbatches, num_devices: the pipeline's sizes.
      name: what built it (``"gpipe"``, ``"1f1b"``, ... or ``"custom"``).

    Constructing a Schedule checks nothing; call :meth:`validate`.
    """

    actions: tuple[Action, ...]
    num_stages: int
    num_microbatches: int
    num_devices: int
    name: str = "custom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(self.actions))

    def per_device(self) -> list[list[Action]]:
        """Each device's actions, in issue order (a list per device, some maybe empty)."""
        out: list[list[Action]] = [[] for _ in range(self.num_devices)]
        for a in self.actions:
            out[a.device].append(a)
        return out

    def stage_device(self) -> dict[int, int]:
        """The device each stage runs on, as ``{stage: device}``."""
        return {a.stage: a.device for a in self.actions}

    def validate(self) -> Schedule:
        """Checks the schedule and returns it.

        Checked: positive sizes; actions in range with an op in :data:`OPS`; one
        device per stage; in the order of ``actions``, ``F(s, m)`` after
        ``F(s-1, m)``, the backward (B or BW) of ``(s, m)`` after ``F(s, m)`` and
        the backward of ``(s+1, m)``, ``W(s, m)`` after ``B(s, m)``; for each
        ``(s, m)``, one ``F`` and either one ``BW`` or one ``B`` and one ``W``.

        Raises:
          InvalidValueError: a size is not a positive integer.
          ScheduleError: anything else; the message names the first offending
            (or missing) action and says how to fix it.
        """
        check_sizes(num_stages=self.num_stages, num_microbatches=self.num_microbatches,
                     num_devices=self.num_devices)
        stage_device: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            _check_action(i, a, self)
            if stage_device.setdefault(a.stage, a.device) != a.device:
                raise ScheduleError(
                    f"action {i} {a} runs on device {a.device}, but earlier actions run stage {a.stage} on "
                    f"device {stage_device[a.stage]}: each stage lives on one device; move it there")
        first: dict[tuple[str, int, int], int] = {}
        for i, a in reversed(list(enumerate(self.actions))):
            first[(a.op, a.stage, a.microbatch)] = i
        done: set[tuple[str, int, int]] = set()
        for i, a in enumerate(self.actions):
            _check_order(i, a, done, first, self)
            done.update(provides(a))
        for s in range(self.num_stages):
            for m in range(self.num_microbatches):
                _check_complete(s, m, done)
        return self

    def peak_live_microbatches(self) -> list[int]:
        """Per stage, the most microbatches whose residuals were alive at once.

        A microbatch is live on stage ``s`` from its ``F`` until its ``B`` or
        ``BW``, counted by walking the issue order. (``W`` needs the stage's
        inputs too, which this count leaves out: they are usually much smaller
        than the residuals ``B`` frees.)
        """
        live = [0] * self.num_stages
        peak = [0] * self.num_stages
        for a in self.actions:
            if a.op == "F":
                live[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], live[a.stage])
            elif a.op in ("B", "BW"):
                live[a.stage] -= 1
        return peak

    def __str__(self) -> str:
        """One row per device, one column per time step when every pass takes one step.

        A cell is the op and microbatch (``F3``), with ``@stage`` where a device
        runs several stages; ``.`` is idle.
        """
        slot, end = unit_slots(self)
        many = len(self.stage_device()) > len(set(self.stage_device().values()))
        cells = [["."] * end for _ in range(self.num_devices)]
        for a, t in zip(self.actions, slot):
            cells[a.device][t] = f"{a.op}{a.microbatch}" + (f"@{a.stage}" if many else "")
        width = max((len(c) for row in cells for c in row), default=1)
        label = len(f"device {self.num_devices - 1}")
        return "\n".join(f"{f'device {d}':<{label}} | " + " ".join(c.ljust(width) for c in row).rstrip()
                         for d, row in enumerate(cells))


# ---------------------------------------------------------------- checks
#: The most (stage, microbatch) pairs a schedule may have: its actions are listed one by one (about 10 us
#: each to build and check), so a pipeline this size already takes seconds to schedule.
MAX_CELLS = 1 << 20


def check_sizes(**sizes: int) -> None:
    """A count that is not an int is the wrong kind (``InvalidInputError``, a ``TypeError``); one below 1 a wrong
    value (``InvalidValueError``), as ``pipeline``'s own checks and ``docs/errors.md`` have it; so are stages
    (or devices times virtual stages) times microbatches above :data:`MAX_CELLS`."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"{name} must be a positive integer, got {type(value).__name__} {value!r}")
        if value < 1:
            raise InvalidValueError(f"{name} must be a positive integer, got {value!r}")
    stages = sizes.get("num_stages", sizes.get("num_devices", 1) * sizes.get("virtual_stages", 1))
    if stages * sizes.get("num_microbatches", 1) > MAX_CELLS:
        raise InvalidValueError(
            f"a schedule of {stages} stages and {sizes['num_microbatches']} microbatches has "
            f"{stages * sizes['num_microbatches']} (stage, microbatch) pairs, above the {MAX_CELLS} a schedule may "
            "have: its actions are listed one by one. Use fewer microbatches (larger ones) or fewer stages.")


def _check_action(i: int, a: object, s: Schedule) -> None:
    if not isinstance(a, Action):
        raise ScheduleError(f"action {i} is {a!r}, not an Action(device, microbatch, stage, op)")
    if a.op not in OPS:
        raise ScheduleError(f"action {i} {a} has op {a.op!r}: use one of {', '.join(OPS)}")
    for field, bound in (("device", s.num_devices), ("stage", s.num_stages), ("microbatch", s.num_microbatches)):
        value = getattr(a, field)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            raise ScheduleError(f"action {i} {a} has {field} {value!r}, outside the schedule's range({bound})")


def provides(a: Action) -> list[tuple[str, int, int]]:
    """What running ``a`` makes available, as ``(op, stage, microbatch)`` keys.

    ``"back"`` stands for either backward (B or BW): the previous stage's
    backward waits for it, whichever it is.

    Example:
        >>> provides(Action(device=0, microbatch=2, stage=1, op="B"))
        [('B', 1, 2), ('back', 1, 2)]
    """
    return [(a.op, a.stage, a.microbatch)] + ([("back", a.stage, a.microbatch)] if a.op in ("B", "BW") else [])


def dependencies(a: Action, num_stages: int) -> list[tuple[str, int, int]]:
    """The keys (see :func:`provides`) ``a`` waits for: ``[('F', s, m), ('back', s+1, m)]`` for a BW, say."""
    s, m = a.stage, a.microbatch
    if a.op == "F":
        return [("F", s - 1, m)] if s > 0 else []
    if a.op == "W":
        return [("B", s, m)]
    return [("F", s, m)] + ([("back", s + 1, m)] if s + 1 < num_stages else [])


def _describe(key: tuple[str, int, int], first: dict[tuple[str, int, int], int]) -> tuple[str, int | None]:
    """A dependency's name and the index of the action that provides it (None if none does)."""
    op, s, m = key
    if op != "back":
        return f"{op}(stage={s}, microbatch={m})", first.get(key)
    for candidate in ("BW", "B"):
        if (candidate, s, m) in first:
            return f"{candidate}(stage={s}, microbatch={m})", first[(candidate, s, m)]
    return f"the backward (B or BW) of stage={s}, microbatch={m}", None


def _check_order(i: int, a: Action, done: set, first: dict, s: Schedule) -> None:
    where, key = f"action {i} {a} on device {a.device}", (a.op, a.stage, a.microbatch)
    if key in done:
        raise ScheduleError(f"{where} duplicates action {first[key]}: each pass of a (stage, microbatch) "
                            "runs once; remove one")
    rivals = {"F": (), "B": ("BW",), "W": ("BW",), "BW": ("B", "W")}[a.op]
    clash = [(op, a.stage, a.microbatch) for op in rivals if (op, a.stage, a.microbatch) in done]
    if clash:
        raise ScheduleError(f"{where} comes after {_describe(clash[0], first)[0]}: a (stage, microbatch) runs its "
                            "backward either fused (BW) or split (B then W), not both; remove one")
    for dep in dependencies(a, s.num_stages):
        if dep not in done:
            name, j = _describe(dep, first)
            fix = (f", which the schedule lacks: add it before action {i}" if j is None
                   else f" (action {j}): move it after that action in the issue order")
            raise ScheduleError(f"{where} runs before {name}{fix}")


def _check_complete(s: int, m: int, done: set) -> None:
    at = f"stage={s}, microbatch={m}"
    for missing, why in ((("F", s, m) not in done, f"F({at}) is missing: every (stage, microbatch) needs one"),
                         (("back", s, m) not in done, f"the backward of ({at}) is missing: add BW({at}), or B then W"),
                         (("B", s, m) in done and ("W", s, m) not in done, f"W({at}) is missing: every B needs its W")):
        if missing:
            raise ScheduleError(f"{why}; add it after the actions it depends on")


def unit_slots(s: Schedule) -> tuple[list[int], int]:
    """Each action's time step when every pass takes one step (as soon as its device and inputs allow)."""
    free = [0] * s.num_devices
    at: dict[tuple[str, int, int], int] = {}
    slots = []
    for a in s.actions:
        t = max([free[a.device]] + [at[k] + 1 for k in dependencies(a, s.num_stages) if k in at])
        slots.append(t)
        free[a.device] = t + 1
        for k in provides(a):
            at[k] = t
    return slots, max(free, default=0)
