"""Plots of a memory-budget sweep: saved bytes and step time against ``memory_budget``.

Needs matplotlib (the 'viz' extra); the Figure is built without pyplot.

Example:
    >>> fig = plot_budget_sweep([(0.0, 4096, 0.002), (1.0, 16384, 0.0012)])
    >>> [ax.get_xlabel() for ax in fig.axes]
    ['memory_budget', 'memory_budget']
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from jaxaot.errors import InvalidValueError
from jaxaot.viz.formatting import byte_scale


def plot_budget_sweep(results: Iterable[Sequence[float]], *, reference: Sequence[float] | None = None,
                      label: str = "min-cut", reference_label: str = "reference", title: str = "") -> Any:
    """Saved bytes and step time against ``memory_budget``: a matplotlib Figure with two axes.

    Args:
      results: ``(budget, saved_bytes, step_time_seconds)`` rows, any order.
      reference: optional ``(saved_bytes, step_time_seconds)`` of a baseline
        (say the default partition), drawn as a dashed line on each axis.
      label, reference_label: legend entries of the sweep and of the baseline.
      title: the figure's title.

    The Figure is built without pyplot (no global state); in Jupyter,
    ``%matplotlib inline`` (or importing pyplot) makes it display itself.

    Example:
        >>> fig = plot_budget_sweep([(0.0, 4096, 0.002), (0.5, 8192, 0.0015), (1.0, 16384, 0.0012)],
        ...                         reference=(20000, 0.0011), reference_label="default partition")
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['saved (KiB)', 'step time (ms)']
    """
    from matplotlib.figure import Figure  # optional dependency: the 'viz' extra

    rows = sorted((float(b), float(s), float(t)) for b, s, t in results)
    if not rows:
        raise InvalidValueError("plot_budget_sweep needs at least one (budget, saved_bytes, step_time) row")
    budgets, saved, times = (list(col) for col in zip(*rows))
    scale, unit = byte_scale(max(saved + ([reference[0]] if reference else [])))
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax_mem, ax_time = fig.subplots(1, 2)
    ax_mem.plot(budgets, [s / scale for s in saved], "o-", color="#31a354", label=label)
    ax_time.plot(budgets, [t * 1e3 for t in times], "o-", color="#3182bd", label=label)
    if reference is not None:
        ax_mem.axhline(reference[0] / scale, ls="--", color="#777777", label=reference_label)
        ax_time.axhline(reference[1] * 1e3, ls="--", color="#777777", label=reference_label)
    for ax, ylabel in ((ax_mem, f"saved ({unit})"), (ax_time, "step time (ms)")):
        ax.set_xlabel("memory_budget")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if reference is not None:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig
