"""Pipeline-parallel schedules as data: which device runs which pass of which microbatch, in what order.

A pipeline cuts a model into ``num_stages`` consecutive stages, puts each stage
on one device and splits the batch into ``num_microbatches`` microbatches.
Stage ``s`` runs these passes on microbatch ``m``:

* ``F``, the forward: needs ``F(s-1, m)``'s activation; saves residuals;
* ``B``, the backward to the input: needs ``F(s, m)``'s residuals and the
  cotangent from the backward of ``(s+1, m)``; the previous stage waits for it;
* ``W``, the backward to the weights: needs only ``B(s, m)`` and nothing waits
  for it, so a schedule may defer it to fill idle time;
* ``BW``, B and W fused into one pass (what ``jax.vjp`` runs).

A :class:`Schedule` is a tuple of :class:`Action` in a **global issue order**
that respects every dependency. It is an issue order, not a timeline: each
device runs its own subsequence (:meth:`Schedule.per_device`) in that order,
and a real runtime dispatches the actions in the global order, so it never
waits on a pass not yet issued and no device deadlocks.
:meth:`Schedule.validate` checks this in one pass and names the first break.

The built-in schedules, for ``p`` stages, ``m`` microbatches and the same times
on every stage; "live" counts the microbatches whose residuals a stage holds
(:meth:`Schedule.peak_live_microbatches`):

* :func:`gpipe`: all forwards, then all fused backwards. Bubble
  ``(p-1)/(m+p-1)`` of the step; every stage holds all ``m`` microbatches.
* :func:`one_f_one_b` (PipeDream-flush): stage ``i`` warms up with ``p-i-1``
  forwards, alternates F and BW, drains. GPipe's bubble, but stage ``i`` holds
  at most ``p-i`` microbatches.
* :func:`interleaved` (Megatron-LM): ``v`` smaller stages per device, which
  cuts the idle time ``v``-fold (``m`` a multiple of the devices), for ``v``
  times more transfers.
* :func:`zero_bubble` (ZB-H1, arXiv 2401.10241): 1F1B with the backward split
  and W deferred into the drain. With ``t_F = t_B = t_W`` and ``m >= p`` a
  device idles ``p-1`` passes, not 1F1B's ``3(p-1)``, at 1F1B's peak memory.

Building a schedule makes ``2 p m`` or ``3 p m`` actions and merges them into
the issue order in ``O(p (m + p))``; validating costs ``O(number of actions)``.

Example:
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
      actions: the actions, in an order that respects every dependency (see the
        module docstring); each device runs its own subsequence in this order.
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
        _check_sizes(num_stages=self.num_stages, num_microbatches=self.num_microbatches,
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
        slot, end = _unit_slots(self)
        many = len(self.stage_device()) > len(set(self.stage_device().values()))
        cells = [["."] * end for _ in range(self.num_devices)]
        for a, t in zip(self.actions, slot):
            cells[a.device][t] = f"{a.op}{a.microbatch}" + (f"@{a.stage}" if many else "")
        width = max((len(c) for row in cells for c in row), default=1)
        label = len(f"device {self.num_devices - 1}")
        return "\n".join(f"{f'device {d}':<{label}} | " + " ".join(c.ljust(width) for c in row).rstrip()
                         for d, row in enumerate(cells))


# ---------------------------------------------------------------- checks
def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValueError(f"{name} must be a positive integer, got {value!r}")


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


def _unit_slots(s: Schedule) -> tuple[list[int], int]:
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


# ---------------------------------------------------------------- built-in schedules
def _merge(orders: list[list[Action]], num_stages: int, num_microbatches: int, name: str) -> Schedule:
    """Interleaves per-device orders into a global issue order, one step at a time, and validates it."""
    pos = [0] * len(orders)
    done: set[tuple[str, int, int]] = set()
    out: list[Action] = []
    total = sum(map(len, orders))
    while len(out) < total:
        step = [o[i] for o, i in zip(orders, pos)
                if i < len(o) and all(k in done for k in dependencies(o[i], num_stages))]
        if not step:  # a bug in a generator below, never a user's error
            raise AssertionError(f"{name}: the per-device orders deadlock after {len(out)} actions")
        for a in step:
            pos[a.device] += 1
            done.update(provides(a))
        out.extend(step)
    return Schedule(tuple(out), num_stages, num_microbatches, len(orders), name).validate()


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe: each stage runs every forward, then every fused backward in reverse microbatch order.

    The last microbatch's backward goes first, as in the GPipe paper's figure
    (the last stage starts with the microbatch it has just run forward); every
    stage holds all microbatches' residuals before its first backward.

    Example:
        >>> print(gpipe(2, 2))
        device 0 | F0  F1  .   .   BW1 BW0
        device 1 | .   F0  F1  BW1 BW0 .
    """
    _check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
    orders = [[Action(s, m, s, "F") for m in range(num_microbatches)]
              + [Action(s, m, s, "BW") for m in reversed(range(num_microbatches))] for s in range(num_stages)]
    return _merge(orders, num_stages, num_microbatches, "gpipe")


def _alternate(forward: list[Action], backward: list[Action], warmup: int) -> list[Action]:
    """``warmup`` forwards, then one forward and one backward in turn, then the remaining backwards."""
    order = forward[:warmup]
    for k, b in enumerate(backward):
        order += forward[warmup + k:warmup + k + 1] + [b]
    return order


def _one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int, backward: str) -> list[Action]:
    return _alternate([Action(stage, m, stage, "F") for m in range(num_microbatches)],
                      [Action(stage, m, stage, backward) for m in range(num_microbatches)],
                      min(num_stages - stage - 1, num_microbatches))


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B (PipeDream-flush): warm up, alternate one forward and one fused backward, drain.

    Stage ``i`` runs ``min(num_stages - i - 1, num_microbatches)`` forwards,
    then alternates F and BW, then runs the remaining backwards; it never holds
    more than ``num_stages - i`` microbatches' residuals.

    Example:
        >>> one_f_one_b(4, 8).peak_live_microbatches()
        [4, 3, 2, 1]
    """
    _check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
    orders = [_one_f_one_b_order(s, num_stages, num_microbatches, "BW") for s in range(num_stages)]
    return _merge(orders, num_stages, num_microbatches, "1f1b")


def interleaved(num_devices: int, num_microbatches: int, virtual_stages: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B: ``virtual_stages`` stages per device, stage ``s`` on device ``s % num_devices``.

    Each device cycles through its stages (model chunks) in groups of ``g =
    num_devices`` microbatches, forwards in stage order and backwards in
    reverse; device ``d`` warms up with ``2 (num_devices - d - 1) +
    (virtual_stages - 1) g`` forwards (``num_devices - d - 1`` with a single
    virtual stage, where this is plain 1F1B), then alternates one forward and
    one fused backward, then drains. Where ``num_microbatches`` is not a
    multiple of ``num_devices``, the first group takes the remainder too (``g``
    grows by it; a smaller last group instead would deadlock), and with fewer
    microbatches than devices there is one group of them all.

    Example:
        >>> s = interleaved(num_devices=2, num_microbatches=4, virtual_stages=2)
        >>> s.num_stages, s.stage_device()
        (4, {0: 0, 1: 1, 2: 0, 3: 1})
    """
    _check_sizes(num_devices=num_devices, num_microbatches=num_microbatches, virtual_stages=virtual_stages)
    p, v, m_total = num_devices, virtual_stages, num_microbatches
    first = p + m_total % p if m_total >= p else m_total  # the first group's size
    starts = [0] + list(range(first, m_total, p))
    forward = [(chunk, mb) for g in starts for chunk in range(v) for mb in range(g, g + (first if g == 0 else p))]
    backward = [(v - 1 - chunk, mb) for chunk, mb in forward]
    orders = [_alternate([Action(d, mb, chunk * p + d, "F") for chunk, mb in forward],
                         [Action(d, mb, chunk * p + d, "BW") for chunk, mb in backward],
                         (p - d - 1) if v == 1 else 2 * (p - d - 1) + (v - 1) * first) for d in range(p)]
    return _merge(orders, p * v, m_total, "interleaved")


def zero_bubble(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B with the backward split into B and W, W deferred.

    Stage ``i`` runs 1F1B's forwards and B passes in 1F1B's order, and keeps up
    to ``i`` W passes pending: after each B, it runs the oldest W once more than
    ``i`` are pending, and the rest at the end, where they fill the drain's idle
    time. Its peak of live microbatches is 1F1B's.

    Example:
        >>> print(zero_bubble(2, 2))
        device 0 | F0 F1 .  B0 W0 B1 W1
        device 1 | .  F0 B0 F1 B1 W0 W1
    """
    _check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
    orders = []
    for s in range(num_stages):
        order, pending = [], []
        for a in _one_f_one_b_order(s, num_stages, num_microbatches, "B"):
            order.append(a)
            if a.op == "B":
                pending.append(Action(s, a.microbatch, s, "W"))
                if len(pending) > s:
                    order.append(pending.pop(0))
        orders.append(order + pending)
    return _merge(orders, num_stages, num_microbatches, "zero_bubble")


def make_schedule(schedule: str | Schedule, num_stages: int, num_microbatches: int,
                  num_devices: int | None = None) -> Schedule:
    """The schedule a pipeline runs: a built-in one by name, or a given :class:`Schedule`, checked.

    Args:
      schedule: one of :data:`SCHEDULES` or a :class:`Schedule`.
      num_stages, num_microbatches: the pipeline's sizes.
      num_devices: the number of devices; by default ``num_stages`` (one stage
        per device), or ``num_stages // 2`` for ``"interleaved"`` (two stages
        per device). Only ``"interleaved"`` accepts fewer devices than stages.

    Raises:
      InvalidValueError: an unknown name, or sizes the schedule cannot have.
      InvalidInputError: ``schedule`` is neither a name nor a Schedule.
      ScheduleError: a given Schedule is invalid or built for other sizes.

    Example:
        >>> make_schedule("1f1b", 4, 8).name
        '1f1b'
        >>> make_schedule("interleaved", 4, 8).num_devices
        2
    """
    _check_sizes(num_stages=num_stages, num_microbatches=num_microbatches,
                 **({} if num_devices is None else {"num_devices": num_devices}))
    if isinstance(schedule, Schedule):
        schedule.validate()
        want = (num_stages, num_microbatches, schedule.num_devices if num_devices is None else num_devices)
        have = (schedule.num_stages, schedule.num_microbatches, schedule.num_devices)
        if have != want:
            raise ScheduleError(f"the schedule is for {have[0]} stages, {have[1]} microbatches and {have[2]} devices, "
                                f"but the pipeline has {want[0]}, {want[1]} and {want[2]}: build it for those")
        return schedule
    if not isinstance(schedule, str):
        raise InvalidInputError(f"schedule must be a name or a Schedule, got {type(schedule).__name__}")
    if schedule not in SCHEDULES:
        raise InvalidValueError(f"unknown schedule {schedule!r}: use one of {', '.join(map(repr, SCHEDULES))}, "
                                "or a Schedule")
    if schedule == "interleaved":
        devices = num_stages // 2 if num_devices is None else num_devices
        if devices < 1 or num_stages % devices:
            raise InvalidValueError(f"'interleaved' needs num_stages ({num_stages}) to be a multiple of num_devices "
                                    f"({devices}); pass num_devices")
        return interleaved(devices, num_microbatches, num_stages // devices)
    if num_devices not in (None, num_stages):
        raise InvalidValueError(f"{schedule!r} runs one stage per device, so num_devices ({num_devices}) must equal "
                                f"num_stages ({num_stages}); use 'interleaved' for several stages per device")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zero_bubble": zero_bubble}[schedule](num_stages, num_microbatches)
