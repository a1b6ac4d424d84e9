"""Plots of memory budgets: a sweep's saved bytes and step time against ``memory_budget``, and the
(peak, time) Pareto plane of every policy and budget of one model.

Needs matplotlib (the 'viz' extra); the Figure is built without pyplot.

Example:
    >>> fig = plot_budget_sweep([(0.0, 4096, 0.002), (1.0, 16384, 0.0012)])
    >>> [ax.get_xlabel() for ax in fig.axes]
    ['memory_budget', 'memory_budget']
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.units import byte_scale
from jaxaot._src.viz.argument_checks import check_text, describe, require_extra


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
        >>> from jaxaot.viz import plot_budget_sweep
        >>> fig = plot_budget_sweep([(0.0, 4096, 0.002), (0.5, 8192, 0.0015), (1.0, 16384, 0.0012)],
        ...                         reference=(20000, 0.0011), reference_label="default partition")
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['saved (KiB)', 'step time (ms)']
    """
    where, columns = "plot_budget_sweep", "(budget, saved_bytes, step_time_seconds)"
    for text, name in ((label, "label"), (reference_label, "reference_label"), (title, "title")):
        check_text(text, name, where)
    rows = sorted((_number(b, "budget"), _number(s, "saved_bytes"), _number(t, "step_time"))
                  for b, s, t in _rows(results, (3,), columns, where))
    if reference is not None:
        reference = tuple(_number(v, name) for v, name in
                          zip(_row(reference, (2,), "(saved_bytes, step_time_seconds)", f"{where}: reference"),
                              ("saved_bytes", "step_time")))
    Figure = require_extra("matplotlib.figure", where).Figure

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


def plot_pareto(rows: Iterable[Sequence[Any]], *, title: str = "") -> Any:
    """Step time against compiled peak memory, one point per policy or budget, the Pareto front drawn.

    Args:
      rows: ``(label, peak_bytes, step_time_seconds)`` or ``(label, peak_bytes, step_time_seconds, group)``;
        points of one ``group`` (say ``"jax"`` and ``"jaxaot"``) share a colour and a legend entry. A row whose
        peak or time is None (a backend that reports no peak) has no point.
      title: the figure's title.

    A point is on the front when no other point is at most as high on both axes and lower on one; the
    front is the dashed line through those points.

    Example:
        >>> from jaxaot.viz import plot_pareto
        >>> fig = plot_pareto([("dots", 4096, 0.0012, "jax"), ("nothing", 2048, 0.002, "jax"),
        ...                    ("budget 3 KiB", 3000, 0.0013, "jaxaot")])
        >>> ax = fig.axes[0]
        >>> ax.get_xlabel(), len(ax.texts)
        ('compiled peak (KiB)', 3)
    """
    rows = _rows(rows, (3, 4), "(label, peak_bytes, step_time_seconds[, group])", "plot_pareto")
    check_text(title, "title", "plot_pareto")
    points = [(str(r[0]), _number(r[1], "peak_bytes"), _number(r[2], "step_time"), str(r[3]) if len(r) > 3 else "")
              for r in rows if r[1] is not None and r[2] is not None]  # a backend without a peak: no point
    Figure = require_extra("matplotlib.figure", "plot_pareto").Figure

    if not points:
        raise InvalidValueError("plot_pareto needs at least one (label, peak_bytes, step_time) row")
    scale, unit = byte_scale(max(p[1] for p in points))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    colours = ["#3182bd", "#31a354", "#e6550d", "#756bb1", "#636363"]
    for k, group in enumerate(dict.fromkeys(p[3] for p in points)):
        mine = [p for p in points if p[3] == group]
        ax.plot([p[1] / scale for p in mine], [p[2] * 1e3 for p in mine], "o", color=colours[k % len(colours)],
                label=group or None)
    for label, peak, seconds, _ in points:
        ax.annotate(label, (peak / scale, seconds * 1e3), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = sorted((peak, seconds) for _, peak, seconds, _ in points
                   if not any(q[1] <= peak and q[2] <= seconds and (q[1], q[2]) != (peak, seconds) for q in points))
    ax.plot([f[0] / scale for f in front], [f[1] * 1e3 for f in front], "--", color="#777777", lw=1)
    ax.set_xlabel(f"compiled peak ({unit})")
    ax.set_ylabel("step time (ms)")
    ax.grid(alpha=0.3)
    if any(p[3] for p in points):
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return fig


def _number(value: Any, what: str) -> float:
    """``value`` as a float, or :class:`~jaxaot.errors.InvalidValueError` naming the column (a budget given as
    text, ``"1MiB"``, has no place on a numeric axis beside fractions)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidValueError(f"{what} must be a number, got {type(value).__name__} {value!r}"
                                + (": give budgets as numbers (fractions, or bytes as ints)" if what == "budget" else "")
                                ) from None


def _rows(rows: Any, widths: tuple[int, ...], columns: str, where: str) -> list[tuple]:
    """``rows`` as a list of tuples of one of ``widths``, or :class:`~jaxaot.errors.InvalidInputError` saying
    what was passed and which columns a row has (a numpy array of rows is rows too)."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable) or getattr(rows, "ndim", 1) == 0:
        raise InvalidInputError(f"{where} expects an iterable of {columns} rows, got {describe(rows)}")
    return [_row(r, widths, columns, f"{where}: row {i}") for i, r in enumerate(rows)]


def _row(row: Any, widths: tuple[int, ...], columns: str, where: str) -> tuple:
    if isinstance(row, (str, bytes)) or not isinstance(row, Iterable) or getattr(row, "ndim", 1) == 0:
        raise InvalidInputError(f"{where} must be a sequence {columns}, got {describe(row)}")
    row = tuple(row)
    if len(row) not in widths:
        raise InvalidInputError(f"{where} must be a sequence {columns}, got {len(row)} values: {row!r:.80}")
    return row
