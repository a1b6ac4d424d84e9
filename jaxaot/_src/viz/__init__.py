"""Pictures of the forward/backward split: a graph, a residual table, budget-sweep plots.

The graph shows the forward's eqns (blue), the residuals (green), the backward's
recomputation (purple, dashed) and gradient eqns (orange), laid out by Graphviz's
``dot`` or, without it, by a built-in layered layout (:func:`plain_svg`); large
programs collapse to one node per source line or function. Importing this package
registers the Jupyter views in :mod:`jaxaot._src.display`; ``jaxaot`` imports it on
the first display.

Example:
    >>> import jax.numpy as jnp, jaxaot, jaxaot._src.viz
    >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
    >>> low = f.lower(jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> g = jaxaot._src.viz.split_graph(low)
    >>> sorted({n.kind for n in g.nodes})
    ['backward', 'cotangent', 'forward', 'grad', 'input', 'output', 'saved']
    >>> "<table" in jaxaot._src.viz.residual_table_html(low)
    True
"""

from jaxaot._src import display as _display
from jaxaot._src.viz.formatting import aval_str, short_source
from jaxaot._src.viz.styles import STYLES, Style
from jaxaot._src.viz.model import EQN_KINDS, GROUP_LEVELS, Node, SplitGraph
from jaxaot._src.viz.lowered_parts import backward_is_cotangent_dependent
from jaxaot._src.viz.grouping import collapse
from jaxaot._src.viz.graph import split_graph
from jaxaot._src.viz.graphviz_layout import layout_available, to_digraph, why_no_layout
from jaxaot._src.viz.plain_drawing import plain_svg
from jaxaot._src.viz.picture import draw_svg
from jaxaot._src.viz.table import residual_table_html
from jaxaot._src.viz.page import to_html
from jaxaot._src.viz.output import render
from jaxaot._src.viz.plots import plot_budget_sweep, plot_pareto
from jaxaot._src.viz.schedule_plot import plot_schedule

# Jupyter's views of the runtime's objects: the runtime asks the registry (it sits below viz).
_display.register(_display.LOWERED, to_html)
_display.register(_display.RESIDUAL_TABLE, residual_table_html)

__all__ = [
    "EQN_KINDS",
    "GROUP_LEVELS",
    "Node",
    "STYLES",
    "SplitGraph",
    "Style",
    "aval_str",
    "backward_is_cotangent_dependent",
    "collapse",
    "draw_svg",
    "layout_available",
    "plain_svg",
    "plot_budget_sweep",
    "plot_pareto",
    "plot_schedule",
    "render",
    "residual_table_html",
    "short_source",
    "split_graph",
    "to_digraph",
    "to_html",
    "why_no_layout",
]
