"""jaxaot._src.viz.plot_schedule: one row per device, one box per action, placed by the simulator."""

import pytest

from jaxaot import viz
from jaxaot.errors import ScheduleError
from jaxaot._src.parallel.schedule import Action, Schedule
from jaxaot._src.parallel.builtin import gpipe, interleaved, one_f_one_b, zero_bubble
from jaxaot._src.parallel.simulator import OpTimes, simulate


@pytest.mark.parametrize("schedule", [gpipe(3, 4), one_f_one_b(4, 6), zero_bubble(3, 5), interleaved(2, 4, 3)],
                         ids=lambda s: s.name)
def test_one_row_per_device_and_one_box_per_action(schedule):
    fig = viz.plot_schedule(schedule, title="t")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"device {d}" for d in range(schedule.num_devices)]
    assert len(ax.patches) == len(schedule.actions)
    assert len(ax.texts) == len(schedule.actions)  # the microbatch in each box
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == len({a.op for a in schedule.actions})
    assert ax.get_title().startswith(f"t: {schedule.name}")


def test_boxes_are_placed_by_the_simulation():
    s = zero_bubble(3, 4)
    times = OpTimes((1.0, 2.0, 1.0), 0.5, 0.25, transfer=0.1)
    sim = simulate(s, times)
    ax = viz.plot_schedule(s, times).axes[0]
    assert ax.get_xlabel() == "time (s)"
    assert ax.get_xlim() == pytest.approx((0.0, sim.step_time))
    for patch, (action, start, end) in zip(ax.patches, sim.timeline):
        assert patch.get_x() == pytest.approx(start) and patch.get_width() == pytest.approx(end - start)
        assert patch.get_y() + patch.get_height() / 2 == pytest.approx(action.device)
    colors = {a.op: p.get_facecolor()[:3] for p, (a, _, _) in zip(ax.patches, sim.timeline)}
    assert len(set(colors.values())) == 3  # F, B, W


def test_accepts_a_simulation():
    s = one_f_one_b(2, 3)
    sim = simulate(s, OpTimes.uniform(2, forward=2.0))
    ax = viz.plot_schedule(s, sim).axes[0]
    assert ax.get_xlim()[1] == sim.step_time == 16.0  # (m + p - 1)(t_F + t_BW)
    assert "bubble" in ax.get_title()
    assert viz.plot_schedule(s).axes[0].get_xlabel() == "time (one forward = 1)"


def test_rejects_an_invalid_schedule():
    with pytest.raises(ScheduleError):
        viz.plot_schedule(Schedule((Action(0, 0, 0, "F"),), 1, 1, 1))
