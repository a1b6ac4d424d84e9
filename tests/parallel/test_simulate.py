"""jaxaot._src.parallel.simulator: textbook bubbles in closed form, and a timeline that respects every dependency."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxaot.errors import InvalidValueError, ScheduleError
from jaxaot._src.parallel.builtin import gpipe, interleaved, one_f_one_b, zero_bubble
from jaxaot._src.parallel.schedule import Action, Schedule, dependencies, provides
from jaxaot._src.parallel.simulator import OpTimes, Simulation, simulate

SIZES = [(p, m) for p in range(1, 7) for m in range(1, 17)]


# ---------------------------------------------------------------- closed forms
# With the same times on every stage and no transfer cost, GPipe's forwards form a
# pipeline of m + p - 1 slots of t_F (the last stage finishes its m forwards after
# p - 1 slots of fill), and its backwards another of m + p - 1 slots of t_BW, so
#   step = (m + p - 1) (t_F + t_BW),   busy per device = m (t_F + t_BW),
#   bubble = 1 - m / (m + p - 1) = (p - 1) / (m + p - 1).
# 1F1B only reorders each device's work, and its critical path is the same
# chain: p - 1 forward hops, m (F + BW) on the last stage, p - 1 backward hops.
@pytest.mark.parametrize("build", [gpipe, one_f_one_b])
@pytest.mark.parametrize("t_f, t_bw", [(1.0, 2.0), (1.0, 1.0), (0.5, 3.0)])
def test_textbook_bubble(build, t_f, t_bw):
    for p, m in SIZES:
        sim = simulate(build(p, m), OpTimes(t_f, t_bw / 2, t_bw / 2))
        assert sim.step_time == pytest.approx((m + p - 1) * (t_f + t_bw))
        assert sim.busy == pytest.approx((m * (t_f + t_bw),) * p)
        assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_gpipe_pays_each_transfer_once_per_hop():
    """A forward and a backward crossing of p - 1 device boundaries: 2 (p - 1) transfers on the critical path."""
    for p, m in SIZES:
        sim = simulate(gpipe(p, m), OpTimes.uniform(p, transfer=0.25))
        assert sim.step_time == pytest.approx(3 * (m + p - 1) + 2 * (p - 1) * 0.25)


def test_zero_bubble_idles_p_minus_1_passes():
    """ZB-H1 with t_F = t_B = t_W = 1 and m >= p: the first device idles p - 1 units, then never again."""
    for p, m in SIZES:
        if m >= p:
            assert simulate(zero_bubble(p, m), OpTimes.uniform(p)).step_time == 3 * m + p - 1


def test_interleaved_divides_the_bubble_by_the_virtual_stages():
    """Megatron: with v stages per device, each 1/v of the work, the idle time is (p - 1)(t_F + t_BW) / v."""
    for v in (2, 3):
        for p in range(1, 7):
            for m in (p, 2 * p, 3 * p):
                sim = simulate(interleaved(p, m, v), OpTimes.uniform(p * v, 1 / v, 1 / v, 1 / v))
                assert sim.step_time == pytest.approx(3 * m + 3 * (p - 1) / v)


def test_bubbles_rank_zero_bubble_then_1f1b_then_gpipe():
    for p in range(2, 7):
        for m in range(8, 17):
            times = OpTimes.uniform(p)  # F = B = W = 1
            zb, ofob, gp = (simulate(build(p, m), times).bubble_fraction for build in (zero_bubble, one_f_one_b, gpipe))
            assert zb < ofob <= gp + 1e-12, (p, m, zb, ofob, gp)
            assert zb == pytest.approx((p - 1) / (3 * m + p - 1))


def test_one_stage_has_no_bubble():
    for build in (gpipe, one_f_one_b, zero_bubble):
        assert simulate(build(1, 5), OpTimes.uniform(1)).bubble_fraction == 0.0


# ---------------------------------------------------------------- the model
def test_transfer_only_between_devices():
    """interleaved(1, ...) keeps every stage on one device: transfers never apply."""
    s = interleaved(1, 3, virtual_stages=3)
    assert simulate(s, OpTimes.uniform(3, transfer=10.0)).step_time == simulate(s, OpTimes.uniform(3)).step_time == 27


def test_fused_backward_time_overrides_b_plus_w():
    sim = simulate(gpipe(2, 2), OpTimes(1.0, 1.0, 1.0, backward=5.0))
    assert {end - start for a, start, end in sim.timeline if a.op == "BW"} == {5.0}
    assert simulate(gpipe(2, 2), OpTimes(1.0, 1.0, 1.0)).step_time == 9.0


def test_per_stage_times():
    sim = simulate(one_f_one_b(2, 1), OpTimes((1.0, 2.0), (1.0, 3.0), (0.0, 0.0), transfer=(0.0, 0.5)))
    # F0: 0-1; transfer 0.5 into stage 1; F1: 1.5-3.5; BW1: 3.5-6.5; BW0 (transfer[0] = 0): 6.5-7.5
    assert [(str(a), s, e) for a, s, e in sim.timeline] == [
        ("F(stage=0, microbatch=0)", 0.0, 1.0), ("F(stage=1, microbatch=0)", 1.5, 3.5),
        ("BW(stage=1, microbatch=0)", 3.5, 6.5), ("BW(stage=0, microbatch=0)", 6.5, 7.5)]
    assert sim.busy == (2.0, 5.0) and sim.step_time == 7.5


def test_zero_times_give_no_bubble():
    sim = simulate(one_f_one_b(3, 3), OpTimes(0.0, 0.0, 0.0))
    assert (sim.step_time, sim.bubble_fraction) == (0.0, 0.0)


@pytest.mark.parametrize("times, match", [
    (OpTimes((1.0, 1.0), 1.0, 1.0), "forward has 2 entries, but the schedule has 3 stages"),
    (OpTimes(1.0, -1.0, 1.0), "backward_input must be finite non-negative"),
    (OpTimes(1.0, 1.0, 1.0, transfer=float("inf")), "transfer must be finite"),
    (OpTimes(1.0, 1.0, 1.0, backward=(1.0,)), "backward has 1 entries"),
])
def test_rejects_times_that_do_not_fit(times, match):
    with pytest.raises(InvalidValueError, match=match):
        simulate(gpipe(3, 2), times)


def test_numpy_and_jax_scalars_are_seconds_as_python_floats_are():
    import jax.numpy as jnp
    import numpy as np

    want = simulate(gpipe(2, 2), OpTimes(1.5, 1.0, 0.5)).step_time
    for scalar in (np.float32(1.5), jnp.float32(1.5), np.float64(1.5)):
        assert simulate(gpipe(2, 2), OpTimes(scalar, 1.0, 0.5)).step_time == want
    assert simulate(gpipe(2, 2), OpTimes(np.array([1.5, 1.5]), 1.0, 0.5)).step_time == want
    with pytest.raises(InvalidValueError, match="forward must be seconds, a scalar or one per stage, got 'fast'"):
        simulate(gpipe(2, 2), OpTimes("fast", 1.0, 0.5))


def test_a_schedule_by_name_or_times_of_another_type_are_typed_errors():
    from jaxaot.errors import InvalidInputError
    from jaxaot._src.parallel.simulator import simulate_lockstep

    for run in (simulate, simulate_lockstep):
        with pytest.raises(InvalidInputError, match=r"takes a Schedule \(make_schedule\('gpipe', \.\.\.\) builds one"):
            run("gpipe", OpTimes.uniform(2))
        with pytest.raises(InvalidInputError, match="takes OpTimes"):
            run(gpipe(2, 2), (1.0, 1.0, 1.0))


def test_rejects_an_invalid_schedule():
    with pytest.raises(ScheduleError):
        simulate(Schedule((Action(0, 0, 0, "BW"), Action(0, 0, 0, "F")), 1, 1, 1), OpTimes.uniform(1))


# ---------------------------------------------------------------- random times
BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "zero_bubble": zero_bubble,
            "interleaved": lambda p, m: interleaved(p, m, 2)}
_time = st.floats(0.0, 5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(BUILDERS)), p=st.integers(1, 5), m=st.integers(1, 8), data=st.data())
def test_random_times_never_start_an_action_before_its_inputs(name, p, m, data):
    s = BUILDERS[name](p, m)
    n = s.num_stages
    per_stage = st.lists(_time, min_size=n, max_size=n).map(tuple)
    times = OpTimes(data.draw(per_stage), data.draw(per_stage), data.draw(per_stage),
                    backward=data.draw(st.none() | per_stage), transfer=data.draw(per_stage))
    sim = simulate(s, times)
    assert isinstance(sim, Simulation) and [a for a, _, _ in sim.timeline] == list(s.actions)
    ended = {}
    device_free = [0.0] * s.num_devices
    for a, start, end in sim.timeline:
        assert start >= device_free[a.device]  # one action at a time, in the device's order
        for dep in dependencies(a, n):
            dep_end, dep_device = ended[dep]
            hop = times.stage_times(n)["transfer"][a.stage] if dep_device != a.device else 0.0
            assert start >= dep_end + hop
        device_free[a.device] = end
        for key in provides(a):
            ended[key] = (end, a.device)
    assert sim.step_time == max(device_free)
    assert sum(sim.busy) == pytest.approx(sum(e - s_ for _, s_, e in sim.timeline))
    assert 0.0 <= sim.bubble_fraction <= 1.0
