"""Pictures of the forward/backward split, the residuals, budget sweeps and pipeline schedules."""

import typing as _typing

from jaxaot._src import deprecations as _deprecations
from jaxaot._src.viz import (
    render as render,
    split_graph as split_graph,
    SplitGraph as SplitGraph,
    Node as Node,
    Style as Style,
    STYLES as STYLES,
    collapse as collapse,
    draw_svg as draw_svg,
    plain_svg as plain_svg,
    to_digraph as to_digraph,
    to_html as to_html,
    layout_available as layout_available,
    why_no_layout as why_no_layout,
    residual_table_html as residual_table_html,
    plot_budget_sweep as plot_budget_sweep,
    plot_pareto as plot_pareto,
    plot_schedule as plot_schedule,
)

__all__ = [
    "render", "split_graph", "SplitGraph", "Node", "Style", "STYLES", "collapse", "draw_svg", "plain_svg",
    "to_digraph", "to_html", "layout_available", "why_no_layout", "residual_table_html",
    "plot_budget_sweep", "plot_pareto", "plot_schedule",
]

# The old layout's paths, for one release: ``import jaxaot.viz.<module>`` and names its package exported.
__path__: list[str] = []
if not _typing.TYPE_CHECKING:
    __getattr__ = _deprecations.face_getattr("jaxaot.viz", "jaxaot._src.viz")
