"""jaxaot._src.parallel.schedule: built-in schedules are valid, validation names the first break, memory is as counted."""

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxaot.errors import InvalidInputError, InvalidValueError, JaxaotError, ScheduleError
from jaxaot._src.parallel.builtin import gpipe, interleaved, make_schedule, one_f_one_b, tuned_zero_bubble, zero_bubble
from jaxaot._src.parallel.schedule import OPS, SCHEDULES, Action, Schedule, dependencies, provides
from jaxaot._src.parallel.simulator import OpTimes, simulate

ONE_STAGE_PER_DEVICE = {"gpipe": gpipe, "1f1b": one_f_one_b, "zero_bubble": zero_bubble}
SIZES = [(p, m) for p in range(1, 7) for m in range(1, 17)]


def _check_complete(s: Schedule, split: bool):
    """Every (stage, microbatch) has one F and one BW (or one B and one W): no more, no less."""
    ops = ("F", "B", "W") if split else ("F", "BW")
    assert sorted((a.op, a.stage, a.microbatch) for a in s.actions) == sorted(
        (op, st_, m) for op in ops for st_ in range(s.num_stages) for m in range(s.num_microbatches))


@pytest.mark.parametrize("name", sorted(ONE_STAGE_PER_DEVICE))
def test_one_stage_per_device_schedules_validate(name):
    build = ONE_STAGE_PER_DEVICE[name]
    for p, m in SIZES:
        s = build(p, m)
        assert s.validate() is s and s.name == name
        assert (s.num_stages, s.num_microbatches, s.num_devices) == (p, m, p)
        assert s.stage_device() == {i: i for i in range(p)}
        _check_complete(s, split=name == "zero_bubble")
        assert make_schedule(name, p, m) == s


@pytest.mark.parametrize("virtual_stages", [1, 2, 3])
def test_interleaved_validates(virtual_stages):
    for d, m in SIZES:
        s = interleaved(d, m, virtual_stages)
        assert s.validate() is s
        assert (s.num_stages, s.num_devices) == (d * virtual_stages, d)
        assert s.stage_device() == {st_: st_ % d for st_ in range(d * virtual_stages)}
        _check_complete(s, split=False)


def test_interleaved_with_one_virtual_stage_is_one_f_one_b():
    for p, m in SIZES:
        assert interleaved(p, m, 1).actions == one_f_one_b(p, m).actions


def test_per_device_is_the_issue_order_split_by_device():
    s = zero_bubble(4, 6)
    rows = s.per_device()
    assert len(rows) == 4 and sum(map(len, rows)) == len(s.actions)
    for d, row in enumerate(rows):
        assert row == [a for a in s.actions if a.device == d]
    # 1F1B's shape on the first device: 3 warm-up forwards, then F/B alternating, then drain.
    assert [a.op for a in one_f_one_b(4, 6).per_device()[0]] == ["F"] * 4 + ["BW", "F"] * 2 + ["BW"] * 4


def test_str_is_one_row_per_device():
    text = str(interleaved(2, 4))
    rows = text.splitlines()
    assert len(rows) == 2 and rows[0].startswith("device 0 | F0@0")
    assert str(gpipe(1, 1)) == "device 0 | F0  BW0"


# ---------------------------------------------------------------- counted memory
def test_one_f_one_b_holds_at_most_num_stages_minus_i():
    for p, m in SIZES:
        peak = one_f_one_b(p, m).peak_live_microbatches()
        assert peak == [min(p - i, m) for i in range(p)]


def test_gpipe_holds_every_microbatch():
    for p, m in SIZES:
        assert gpipe(p, m).peak_live_microbatches() == [m] * p


def test_zero_bubble_holds_no_more_than_one_f_one_b():
    for p, m in SIZES:
        zb, ofob = zero_bubble(p, m).peak_live_microbatches(), one_f_one_b(p, m).peak_live_microbatches()
        assert all(z <= o for z, o in zip(zb, ofob)), (p, m, zb, ofob)


def test_zero_bubble_keeps_p_microbatches_in_flight_until_their_w():
    """ZB-H1: counted from F to W, every stage holds the same p microbatches (for m >= p)."""
    for p, m in SIZES:
        s = zero_bubble(p, m)
        live, peak = [0] * p, [0] * p
        for a in s.actions:
            live[a.stage] += {"F": 1, "B": 0, "W": -1}[a.op]
            peak[a.stage] = max(peak[a.stage], live[a.stage])
        assert peak == [min(p, m)] * p


# ---------------------------------------------------------------- validation
def _replace(s: Schedule, actions) -> Schedule:
    return dataclasses.replace(s, actions=tuple(actions), name="custom")


def test_rejects_a_missing_w():
    s = zero_bubble(3, 4)
    actions = [a for a in s.actions if (a.op, a.stage, a.microbatch) != ("W", 1, 2)]
    with pytest.raises(ScheduleError, match=re.escape("W(stage=1, microbatch=2) is missing")):
        _replace(s, actions).validate()


def test_rejects_b_before_its_f_naming_the_first_broken_dependency():
    s = zero_bubble(3, 4)
    actions = list(s.actions)
    i_f = actions.index(Action(1, 2, 1, "F"))
    f = actions.pop(i_f)
    actions.append(f)  # F(1, 2) now comes last: B(1, 2) and F(2, 2) run before it
    bad = _replace(s, actions)
    # F(stage=2, microbatch=2) comes before B(stage=1, ...) in the order: it is the first break.
    i_first = min(actions.index(Action(2, 2, 2, "F")), actions.index(Action(1, 2, 1, "B")))
    first = actions[i_first]
    with pytest.raises(ScheduleError) as info:
        bad.validate()
    assert str(info.value).startswith(f"action {i_first} {first} on device {first.device} runs before "
                                      f"F(stage=1, microbatch=2) (action {len(actions) - 1}): move it after")


def test_error_message_names_the_action_and_the_dependency():
    acts = [Action(0, 0, 0, "F"), Action(1, 0, 1, "B"), Action(1, 0, 1, "F"), Action(1, 0, 1, "W"),
            Action(0, 0, 0, "BW")]
    with pytest.raises(ScheduleError, match=re.escape(
            "action 1 B(stage=1, microbatch=0) on device 1 runs before F(stage=1, microbatch=0) (action 2)")):
        Schedule(acts, 2, 1, 2).validate()
    # The stage-0 backward waits for stage 1's backward (B here), which is not issued yet.
    acts = [Action(0, 0, 0, "F"), Action(1, 0, 1, "F"), Action(0, 0, 0, "BW"), Action(1, 0, 1, "BW")]
    with pytest.raises(ScheduleError, match=re.escape("action 2 BW(stage=0, microbatch=0) on device 0 runs before "
                                                      "BW(stage=1, microbatch=0) (action 3)")):
        Schedule(acts, 2, 1, 2).validate()


def test_rejects_a_duplicate():
    s = one_f_one_b(3, 4)
    actions = list(s.actions) + [s.actions[5]]
    with pytest.raises(ScheduleError, match=f"action {len(actions) - 1} .* duplicates action 5"):
        _replace(s, actions).validate()


def test_rejects_a_missing_pass():
    s = one_f_one_b(2, 2)
    no_bw = [a for a in s.actions if (a.op, a.stage, a.microbatch) != ("BW", 0, 1)]
    with pytest.raises(ScheduleError, match=re.escape("the backward of (stage=0, microbatch=1) is missing")):
        _replace(s, no_bw).validate()
    no_f = [a for a in s.actions if (a.stage, a.microbatch) != (1, 1)]  # F and BW of (1, 1) gone
    with pytest.raises(ScheduleError, match=re.escape("runs before the backward (B or BW) of stage=1, microbatch=1, "
                                                      "which the schedule lacks")):
        _replace(s, no_f).validate()


def test_rejects_fused_and_split_backward_together():
    s = one_f_one_b(1, 1)
    acts = list(s.actions) + [Action(0, 0, 0, "W")]
    with pytest.raises(ScheduleError, match="either fused .BW. or split"):
        _replace(s, acts).validate()


@pytest.mark.parametrize("bad, match", [
    (Action(2, 0, 0, "F"), "device 2, outside the schedule's range.2."),
    (Action(0, 0, 5, "F"), "stage 5, outside"),
    (Action(0, -1, 0, "F"), "microbatch -1, outside"),
    (Action(0, 0, 0, "X"), "op 'X': use one of F, B, W, BW"),
    ((0, 0, 0, "F"), "not an Action"),
])
def test_rejects_malformed_actions(bad, match):
    with pytest.raises(ScheduleError, match=match):
        Schedule((bad,), 2, 1, 2).validate()


def test_rejects_a_stage_on_two_devices():
    acts = [Action(0, 0, 0, "F"), Action(1, 1, 0, "F")]
    with pytest.raises(ScheduleError, match="each stage lives on one device"):
        Schedule(acts, 1, 2, 2).validate()


@pytest.mark.parametrize("call", [
    lambda: gpipe(0, 4), lambda: one_f_one_b(4, 0), lambda: zero_bubble(2, -1), lambda: interleaved(2, 4, 0),
    lambda: Schedule((), 1, 0, 1).validate(), lambda: make_schedule("1f1b", 4, 0),
])
def test_rejects_sizes_below_one(call):
    with pytest.raises(InvalidValueError, match="must be a positive integer"):
        call()


@pytest.mark.parametrize("call", [
    lambda: one_f_one_b(2.0, 4), lambda: gpipe(True, 4), lambda: interleaved(4, 8, 2.0),
    lambda: make_schedule("1f1b", 4, "8"), lambda: make_schedule("gpipe", 4, 8, num_devices=2.0),
])
def test_rejects_counts_of_the_wrong_kind_as_pipeline_does(call):
    """A count that is not an int is a ``TypeError`` (``InvalidInputError``), as ``pipeline``'s own
    ``num_microbatches`` check raises, so one ``except`` clause catches both."""
    with pytest.raises(InvalidInputError, match="must be a positive integer, got"):
        call()


@pytest.mark.parametrize("call", [
    lambda: gpipe(10**6, 10**6), lambda: one_f_one_b(2, 2**20), lambda: zero_bubble(2**11, 2**10),
    lambda: interleaved(2**10, 2**10, 2), lambda: make_schedule("1f1b", 10**6, 10**6),
    lambda: Schedule((), 2**11, 2**10, 1).validate(),
])
def test_rejects_schedules_too_large_to_list_at_once(call):
    """Stages times microbatches above MAX_CELLS is a wrong value, said at once, not minutes of listing actions."""
    with pytest.raises(InvalidValueError, match=r"\(stage, microbatch\) pairs, above the"):
        call()


def test_errors_are_value_errors():
    assert issubclass(ScheduleError, ValueError) and issubclass(ScheduleError, JaxaotError)


# ---------------------------------------------------------------- make_schedule
def test_make_schedule_by_name_and_by_value():
    assert make_schedule("interleaved", 6, 4).num_devices == 3
    assert make_schedule("interleaved", 6, 4, num_devices=2).stage_device()[5] == 1
    s = zero_bubble(3, 5)
    assert make_schedule(s, 3, 5) is s and make_schedule(s, 3, 5, num_devices=3) is s
    with pytest.raises(ScheduleError, match="is for 3 stages, 5 microbatches and 3 devices, but the pipeline has 3, 4"):
        make_schedule(s, 3, 4)
    with pytest.raises(ScheduleError, match="runs before"):
        make_schedule(_replace(s, reversed(s.actions)), 3, 5)


def test_make_schedule_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(InvalidValueError) as info:
        make_schedule("pipedream", 4, 8)
    for name in SCHEDULES:
        assert repr(name) in str(info.value)
    with pytest.raises(InvalidInputError):
        make_schedule(3, 4, 8)
    with pytest.raises(InvalidValueError, match="one stage per device"):
        make_schedule("1f1b", 4, 8, num_devices=2)
    with pytest.raises(InvalidValueError, match=r"multiple of the num_devices \(2\); pass num_devices"):
        make_schedule("interleaved", 5, 8)
    with pytest.raises(InvalidValueError, match=r"needs num_stages \(4\) to be a multiple of the num_devices given "
                                                r"\(8\)$"):
        make_schedule("interleaved", 4, 8, num_devices=8)
    assert make_schedule("interleaved", 1, 4).num_devices == 1  # one stage: one device, not none


# ---------------------------------------------------------------- any issue order that respects dependencies
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(ONE_STAGE_PER_DEVICE)), p=st.integers(1, 4), m=st.integers(1, 5),
       data=st.data())
def test_any_dependency_respecting_order_validates_and_any_other_names_a_real_break(name, p, m, data):
    s = ONE_STAGE_PER_DEVICE[name](p, m)
    # A random topological order: repeatedly issue a random action whose dependencies are all done.
    pending, done, order = list(s.actions), set(), []
    while pending:
        ready = [a for a in pending if all(k in done for k in dependencies(a, p))]
        a = data.draw(st.sampled_from(ready))
        pending.remove(a)
        done.update(provides(a))
        order.append(a)
    assert _replace(s, order).validate().peak_live_microbatches() is not None
    # A random permutation: valid, or the error's action really runs before something it needs.
    perm = data.draw(st.permutations(s.actions))
    try:
        _replace(s, perm).validate()
    except ScheduleError as e:
        i = int(re.match(r"action (\d+) ", str(e)).group(1))
        before = set().union(*(provides(a) for a in perm[:i]))
        assert not all(k in before for k in dependencies(perm[i], p))
    assert set(OPS) >= {a.op for a in perm}


@pytest.mark.parametrize("p, m", [(1, 3), (2, 1), (2, 8), (3, 5), (4, 16)])
@pytest.mark.parametrize("split", [0, 1, 3, 100])
def test_partial_split_is_valid_and_splits_the_last_microbatches(p, m, split):
    s = zero_bubble(p, m, split=split)
    for stage in range(p):
        k = min(m, max(split, stage))
        ops = {(a.microbatch, a.op) for a in s.actions if a.stage == stage}
        assert {mb for mb, op in ops if op == "B"} == {mb for mb, op in ops if op == "W"} == set(range(m - k, m))
        assert {mb for mb, op in ops if op == "BW"} == set(range(m - k))
    assert s.peak_live_microbatches() == one_f_one_b(p, m).peak_live_microbatches()
    assert zero_bubble(p, m, split=m).actions == zero_bubble(p, m).actions


def test_partial_split_rejects_bad_values():
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidValueError, match="split"):
            zero_bubble(2, 4, split=bad)


@pytest.mark.parametrize("p, m", [(2, 8), (4, 16), (3, 6)])
def test_tuning_follows_the_cost_of_splitting(p, m):
    """Free splits: the paper's schedule wins; a costly split: fused backwards except in the drain."""
    free = OpTimes.uniform(p, forward=1.0)
    assert simulate(tuned_zero_bubble(p, m, free), free).step_time == simulate(zero_bubble(p, m), free).step_time
    costly = OpTimes(forward=1.0, backward_input=1.0, backward_weight=1.0, backward=1.4)
    tuned = simulate(make_schedule("zero_bubble", p, m, op_times=costly), costly).step_time
    assert tuned < simulate(zero_bubble(p, m), costly).step_time
    assert tuned < simulate(one_f_one_b(p, m), costly).step_time
    assert tuned <= min(simulate(zero_bubble(p, m, split=k), costly).step_time for k in range(m + 1))
