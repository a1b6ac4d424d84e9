"""jaxaot._src.viz.plot_budget_sweep: saved bytes and step time against memory_budget."""

import pytest

from jaxaot import viz
from jaxaot.errors import InvalidValueError


def test_plot_budget_sweep():
    rows = [(1.0, 16384, 0.0012), (0.0, 4096, 0.002), (0.5, 8192, 0.0015)]
    fig = viz.plot_budget_sweep(rows, title="sweep")
    assert len(fig.axes) == 2
    (mem_line,), (time_line,) = (ax.get_lines() for ax in fig.axes)
    assert list(mem_line.get_xdata()) == [0.0, 0.5, 1.0]  # sorted by budget
    assert list(mem_line.get_ydata()) == [4.0, 8.0, 16.0]  # KiB
    assert list(time_line.get_ydata()) == pytest.approx([2.0, 1.5, 1.2])  # ms
    with_ref = viz.plot_budget_sweep(rows, reference=(20000, 0.001))
    assert [len(ax.get_lines()) for ax in with_ref.axes] == [2, 2]
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_budget_sweep([])
    with pytest.raises(InvalidValueError, match="budget must be a number, got str '1MiB'"):
        viz.plot_budget_sweep([("1MiB", 100, 0.1)])


def test_plot_pareto():
    rows = [("dots", 4096, 0.0012, "jax"), ("nothing", 2048, 0.002, "jax"), ("slow", 4096, 0.003, "jax"),
            ("budget", 3072, 0.0013, "jaxaot")]
    fig = viz.plot_pareto(rows, title="model")
    (ax,) = fig.axes
    assert len(ax.texts) == 4
    front = ax.get_lines()[-1]
    assert list(front.get_xdata()) == [2.0, 3.0, 4.0]  # KiB: "slow" is dominated by "dots"
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_pareto([])
    no_peak = viz.plot_pareto([*rows, ("no peak", None, 0.001, "jax")])  # a backend without peaks: no point
    assert len(no_peak.axes[0].texts) == 4
