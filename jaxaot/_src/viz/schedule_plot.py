"""A picture of a pipeline schedule: one row per device, one box per pass, placed by the simulator.

Each box is an action of the :class:`~jaxaot._src.parallel.schedule.Schedule`, from
its start to its end in :func:`~jaxaot._src.parallel.simulator.simulate`'s timeline,
coloured by op (F, B, W, BW) and labelled with its microbatch; where a device
runs several stages (``interleaved``), its later stages are drawn lighter. The
gaps are the bubble.

Needs matplotlib (the 'viz' extra); the Figure is built without pyplot.

Example:
    >>> from jaxaot._src.parallel.builtin import one_f_one_b
    >>> fig = plot_schedule(one_f_one_b(4, 8), title="1F1B")
    >>> ax, = fig.axes
    >>> len(ax.patches), ax.get_xlabel()
    (64, 'time (one forward = 1)')
"""

from __future__ import annotations

from typing import Any

from jaxaot.errors import InvalidInputError
from jaxaot._src.parallel import OpTimes, Schedule, Simulation, simulate
from jaxaot._src.viz.argument_checks import check_text, describe, require_extra

#: The fill colour of each op's boxes.
OP_COLORS = {"F": "#6baed6", "B": "#fd8d3c", "W": "#74c476", "BW": "#9e9ac8"}
#: Legend entries, in order.
OP_LABELS = {"F": "forward (F)", "B": "backward to input (B)", "W": "backward to weights (W)",
             "BW": "fused backward (BW)"}


def plot_schedule(schedule: Schedule, times: OpTimes | Simulation | None = None, *, title: str = "") -> Any:
    """A schedule's timeline as a matplotlib Figure: one row per device, one box per action.

    Args:
      schedule: the schedule to draw.
      times: the passes' times (:class:`~jaxaot.parallel.OpTimes`, in
        seconds), or a :class:`~jaxaot.parallel.Simulation` of this
        schedule already run; by default every F, B and W takes one unit (and a
        BW two).
      title: the figure's title; the step time and bubble fraction follow it.

    Returns:
      A ``matplotlib.figure.Figure`` with one axes: device 0 on top, time on the
      x-axis (seconds, or units of one forward by default).

    Raises:
      ScheduleError: the schedule is invalid.
      InvalidInputError: ``schedule`` is not a :class:`~jaxaot.parallel.Schedule`, or ``times`` is neither
        ``OpTimes``, a ``Simulation`` nor None.

    Example:
        >>> from jaxaot.parallel import OpTimes, zero_bubble
        >>> from jaxaot.viz import plot_schedule
        >>> fig = plot_schedule(zero_bubble(2, 3), OpTimes.uniform(2, 1e-3, 1e-3, 5e-4))
        >>> [t.get_text() for t in fig.axes[0].get_yticklabels()], fig.axes[0].get_xlabel()
        (['device 0', 'device 1'], 'time (s)')
    """
    if not isinstance(schedule, Schedule):
        raise InvalidInputError(f"plot_schedule expects a jaxaot.parallel.Schedule (say one_f_one_b(4, 8)), "
                                f"got {describe(schedule)}")
    if times is not None and not isinstance(times, (OpTimes, Simulation)):
        raise InvalidInputError(f"plot_schedule: times must be a jaxaot.parallel.OpTimes, a Simulation or None, "
                                f"got {describe(times)}")
    check_text(title, "title", "plot_schedule")
    Figure = require_extra("matplotlib.figure", "plot_schedule").Figure
    patches = require_extra("matplotlib.patches", "plot_schedule")
    Patch, Rectangle = patches.Patch, patches.Rectangle

    if isinstance(times, Simulation):
        sim, unit = times, "time (s)"
    else:
        unit = "time (s)" if times is not None else "time (one forward = 1)"
        sim = simulate(schedule, times if times is not None else OpTimes.uniform(schedule.num_stages))
    stages_of: dict[int, list[int]] = {}
    for stage, device in sorted(schedule.stage_device().items()):
        stages_of.setdefault(device, []).append(stage)
    width = min(4 + 0.25 * len(sim.timeline) / schedule.num_devices, 16)
    fig = Figure(figsize=(width, 1 + 0.45 * schedule.num_devices), layout="constrained")
    ax = fig.subplots()
    for action, start, end in sim.timeline:
        chunk = stages_of[action.device].index(action.stage)
        ax.add_patch(Rectangle((start, action.device - 0.4), end - start, 0.8, facecolor=OP_COLORS[action.op],
                               edgecolor="#444444", linewidth=0.5, alpha=1.0 / (1 + 0.6 * chunk)))
        if end > start:
            ax.text((start + end) / 2, action.device, str(action.microbatch), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, sim.step_time or 1.0)
    ax.set_ylim(schedule.num_devices - 0.5, -0.5)  # device 0 on top
    ax.set_yticks(range(schedule.num_devices), [f"device {d}" for d in range(schedule.num_devices)])
    ax.set_xlabel(unit)
    ops = [op for op in OP_COLORS if any(a.op == op for a in schedule.actions)]
    ax.legend(handles=[Patch(facecolor=OP_COLORS[op], edgecolor="#444444", label=OP_LABELS[op]) for op in ops],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(f"{title + ': ' if title else ''}{schedule.name}, step {sim.step_time:.4g}, "
                 f"bubble {sim.bubble_fraction:.1%}", fontsize=10)
    return fig
