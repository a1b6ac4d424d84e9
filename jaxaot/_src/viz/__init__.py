"""Pictures of the forward/backward split: a graph, a residual table, budget-sweep plots.

The graph shows the joint program as the partitioner split it: the forward
program's eqns, the values it saves for the backward (the residuals), and the
backward program's eqns, where those that recompute forward values are marked
apart from the ones that compute gradients. Colours:

* forward eqns: blue;  saved values (residuals): green boxes on the boundary;
* recomputed eqns: purple, dashed;  backward eqns: orange;
* inputs, outputs, cotangents and gradients: grey ellipses.

Graphviz's ``dot`` lays the graph out. Without it (or without the ``graphviz``
Python package) every renderer draws it with a built-in layered layout in pure
Python (:func:`plain_svg`: the same colours, simpler routing) and says so.
Large programs are collapsed so they stay readable: one node per eqn while
that fits in ``max_nodes``, else one node per source line, else one per function.

Modules, each importing only those above it:

* ``formatting``: byte sizes and source locations as short text;
* ``styles``: the colour and shape of each kind of node;
* ``model``: :class:`Node`, :class:`SplitGraph` and the node kinds;
* ``program``: what is read from a lowered function (partition, names, recomputed eqns);
* ``grouping``: :func:`collapse`, one node per source line or function;
* ``graph``: :func:`split_graph`;
* ``layout``: Graphviz (:func:`to_digraph`, :func:`layout_available`, :func:`why_no_layout`);
* ``plain_layout``: a layered layout in pure Python, for when Graphviz is missing;
* ``plain_svg``: :func:`plain_svg`, that layout drawn as SVG;
* ``picture``: :func:`draw_svg`, Graphviz's picture or else the built-in one;
* ``table``: :func:`residual_table_html`;
* ``page``: :func:`to_html`, the Jupyter view;
* ``output``: :func:`render`, to text or a file;
* ``plots``: :func:`plot_budget_sweep` and :func:`plot_pareto` (matplotlib);
* ``schedule_plot``: :func:`plot_schedule`, a pipeline schedule's timeline (matplotlib).

Importing this package registers :func:`to_html` and :func:`residual_table_html`
in :mod:`jaxaot._src.display`, through which ``AOTLowered._repr_html_`` and
``ResidualTable._repr_html_`` draw themselves in Jupyter (the package face
``jaxaot`` imports this package on the first such display).

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
from jaxaot._src.viz.formatting import aval_str, format_bytes, short_source
from jaxaot._src.viz.styles import STYLES, Style
from jaxaot._src.viz.model import EQN_KINDS, GROUP_LEVELS, Node, SplitGraph
from jaxaot._src.viz.program import backward_is_cotangent_dependent
from jaxaot._src.viz.grouping import collapse
from jaxaot._src.viz.graph import split_graph
from jaxaot._src.viz.layout import layout_available, to_digraph, why_no_layout
from jaxaot._src.viz.plain_svg import plain_svg
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
    "format_bytes",
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
