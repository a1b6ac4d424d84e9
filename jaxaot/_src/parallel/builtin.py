"""The built-in schedules, and :func:`make_schedule`, which picks one by name.

Each generator builds one order per device and merges them into a global issue
order (:func:`_merge`), which :meth:`~jaxaot._src.parallel.schedule.Schedule.validate`
checks. See :mod:`jaxaot._src.parallel.schedule` for what the schedules cost.
"""

from __future__ import annotations

from jaxaot.errors import InvalidInputError, InvalidValueError, ScheduleError
from jaxaot._src.parallel.schedule import SCHEDULES, Action, Schedule, check_sizes, dependencies, provides
from jaxaot._src.parallel.simulator import OpTimes, simulate


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
        >>> from jaxaot.parallel import gpipe
        >>> print(gpipe(2, 2))
        device 0 | F0  F1  .   .   BW1 BW0
        device 1 | .   F0  F1  BW1 BW0 .
    """
    check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
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
        >>> from jaxaot.parallel import one_f_one_b
        >>> one_f_one_b(4, 8).peak_live_microbatches()
        [4, 3, 2, 1]
    """
    check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
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
        >>> from jaxaot.parallel import interleaved
        >>> s = interleaved(num_devices=2, num_microbatches=4, virtual_stages=2)
        >>> s.num_stages, s.stage_device()
        (4, {0: 0, 1: 1, 2: 0, 3: 1})
    """
    check_sizes(num_devices=num_devices, num_microbatches=num_microbatches, virtual_stages=virtual_stages)
    p, v, m_total = num_devices, virtual_stages, num_microbatches
    first = p + m_total % p if m_total >= p else m_total  # the first group's size
    starts = [0] + list(range(first, m_total, p))
    forward = [(chunk, mb) for g in starts for chunk in range(v) for mb in range(g, g + (first if g == 0 else p))]
    backward = [(v - 1 - chunk, mb) for chunk, mb in forward]
    orders = [_alternate([Action(d, mb, chunk * p + d, "F") for chunk, mb in forward],
                         [Action(d, mb, chunk * p + d, "BW") for chunk, mb in backward],
                         (p - d - 1) if v == 1 else 2 * (p - d - 1) + (v - 1) * first) for d in range(p)]
    return _merge(orders, p * v, m_total, "interleaved")


def zero_bubble(num_stages: int, num_microbatches: int, split: int | None = None) -> Schedule:
    """ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B with the backward split into B and W, W deferred.

    Stage ``i`` runs 1F1B's forwards and backwards in 1F1B's order. The
    backwards of its last ``k_i`` microbatches are split: B first (the previous
    stage waits only for it), W deferred, keeping up to ``i`` W passes pending
    (after each B it runs the oldest W once more than ``i`` are pending, and the
    rest at the end, where they fill the drain's idle time). The other
    microbatches run the fused BW. ``split=None`` splits every microbatch
    (``k_i = m``, the paper's schedule); ``split=k`` splits ``k_i = min(m,
    max(k, i))``, so ``split=0`` splits only what fills the drain. Splitting
    pays when B + W costs about what BW does; each split microbatch costs the
    difference. Its peak of live microbatches is 1F1B's.

    Example:
        >>> from jaxaot.parallel import zero_bubble
        >>> print(zero_bubble(2, 2))
        device 0 | F0 F1 .  B0 W0 B1 W1
        device 1 | .  F0 B0 F1 B1 W0 W1
        >>> print(zero_bubble(2, 3, split=0))
        device 0 | F0  F1  .   BW0 F2  BW1 .   BW2
        device 1 | .   F0  BW0 F1  BW1 F2  B2  W2
    """
    check_sizes(num_stages=num_stages, num_microbatches=num_microbatches)
    if split is not None and (not isinstance(split, int) or isinstance(split, bool) or split < 0):
        raise InvalidValueError(f"split must be None or a non-negative int, got {split!r}")
    orders = []
    for s in range(num_stages):
        k = num_microbatches if split is None else min(num_microbatches, max(split, s))
        order, pending = [], []
        for a in _one_f_one_b_order(s, num_stages, num_microbatches, "B"):
            if a.op == "B" and a.microbatch < num_microbatches - k:
                order.append(Action(s, a.microbatch, s, "BW"))
                continue
            order.append(a)
            if a.op == "B":
                pending.append(Action(s, a.microbatch, s, "W"))
                if len(pending) > s:
                    order.append(pending.pop(0))
        orders.append(order + pending)
    return _merge(orders, num_stages, num_microbatches, "zero_bubble")


def tuned_zero_bubble(num_stages: int, num_microbatches: int, op_times: OpTimes) -> Schedule:
    """The :func:`zero_bubble` whose ``split`` :func:`~jaxaot.parallel.simulate` finds fastest.

    Tries ``split`` = 0, 1, 2, 4, ... and every microbatch; ties go to fewer
    splits (less memory held for W). Costs one simulation per candidate,
    ``O(log m)`` of them.

    Example:
        >>> from jaxaot.parallel import OpTimes, tuned_zero_bubble
        >>> split_costs = OpTimes(forward=1.0, backward_input=1.0, backward_weight=1.0, backward=1.5)
        >>> tuned = tuned_zero_bubble(2, 8, split_costs)
        >>> sum(a.op == "BW" for a in tuned.actions)   # all but the last stage's last: 1.5 < 1 + 1
        15
    """
    candidates = sorted({0, num_microbatches, *(2 ** j for j in range(num_microbatches.bit_length()))})
    best = None
    for k in (c for c in candidates if c <= num_microbatches):
        s = zero_bubble(num_stages, num_microbatches, split=k)
        t = simulate(s, op_times).step_time
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, s)
    return best[1]


def make_schedule(schedule: str | Schedule, num_stages: int, num_microbatches: int,
                  num_devices: int | None = None, op_times: OpTimes | None = None) -> Schedule:
    """The schedule a pipeline runs: a built-in one by name, or a given :class:`Schedule`, checked.

    Args:
      schedule: one of :data:`SCHEDULES` or a :class:`Schedule`.
      num_stages, num_microbatches: the pipeline's sizes.
      num_devices: the number of devices; by default ``num_stages`` (one stage
        per device), or ``num_stages // 2`` for ``"interleaved"`` (two stages
        per device). Only ``"interleaved"`` accepts fewer devices than stages.
      op_times: measured per-op times (``Pipeline.measure_op_times``): with
        ``"zero_bubble"``, how many backwards to split is chosen by simulation
        (:func:`tuned_zero_bubble`); other schedules ignore them.

    Raises:
      InvalidValueError: an unknown name, or sizes the schedule cannot have.
      InvalidInputError: ``schedule`` is neither a name nor a Schedule.
      ScheduleError: a given Schedule is invalid or built for other sizes.

    Example:
        >>> from jaxaot.parallel import make_schedule
        >>> make_schedule("1f1b", 4, 8).name
        '1f1b'
        >>> make_schedule("interleaved", 4, 8).num_devices
        2
    """
    check_sizes(num_stages=num_stages, num_microbatches=num_microbatches,
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
        devices = max(num_stages // 2, 1) if num_devices is None else num_devices
        if devices < 1 or num_stages % devices:
            given = "" if num_devices is None else " given"
            raise InvalidValueError(f"'interleaved' needs num_stages ({num_stages}) to be a multiple of the "
                                    f"num_devices{given} ({devices})" + ("; pass num_devices" if not given else ""))
        return interleaved(devices, num_microbatches, num_stages // devices)
    if num_devices not in (None, num_stages):
        raise InvalidValueError(f"{schedule!r} runs one stage per device, so num_devices ({num_devices}) must equal "
                                f"num_stages ({num_stages}); use 'interleaved' for several stages per device")
    if schedule == "zero_bubble" and op_times is not None:
        return tuned_zero_bubble(num_stages, num_microbatches, op_times)
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zero_bubble": zero_bubble}[schedule](num_stages, num_microbatches)
