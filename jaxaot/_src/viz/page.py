"""The HTML view of a split: summary, legend, the graph as inline SVG, the residual table.

:func:`to_html` is what ``AOTLowered._repr_html_`` shows in Jupyter;
:func:`standalone_page` wraps it as a file of its own. Without Graphviz the
graph is drawn with the built-in layout (:func:`jaxaot._src.viz.picture.draw_svg`),
whose last line says why.
"""

from __future__ import annotations

import html
from typing import Any

from jaxaot._src.units import format_bytes
from jaxaot._src.viz.argument_checks import check_timeout
from jaxaot._src.viz.graph import split_for
from jaxaot._src.viz.graphviz_layout import DOT_TIMEOUT, inline_svg
from jaxaot._src.viz.model import SplitGraph
from jaxaot._src.viz.picture import draw_svg
from jaxaot._src.viz.lowered_parts import unwrap
from jaxaot._src.viz.styles import LEGEND_KINDS, STYLES
from jaxaot._src.viz.table import residual_table_html


def to_html(lowered: Any, *, max_nodes: int = 80, group_by: str = "auto", timeout: float = DOT_TIMEOUT) -> str:
    """An HTML fragment: summary, legend, the graph as inline SVG, the residual table.

    What ``AOTLowered._repr_html_`` shows in Jupyter. Without Graphviz (or where
    its ``dot`` takes over ``timeout`` seconds) the graph is drawn with the
    built-in layout, whose last line says why. ``max_nodes`` and ``group_by``: see
    :func:`jaxaot.viz.split_graph`.

    Example:
        >>> from jaxaot.viz import to_html
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> frag = to_html(low)
        >>> "jaxaot-residuals" in frag and "<svg" in frag
        True
    """
    check_timeout(timeout, "to_html")
    return graph_html(lowered, split_for(lowered, max_nodes, group_by, "to_html"), timeout)[0]


def graph_html(lowered: Any, graph: SplitGraph, timeout: float = DOT_TIMEOUT) -> tuple[str, str]:
    """``(html, note)``: :func:`to_html` of ``lowered`` with its split graph already built, and
    :func:`~jaxaot._src.viz.picture.draw_svg`'s note (``""`` where Graphviz drew it)."""
    part, _ = unwrap(lowered)
    svg, note = draw_svg(graph, "", timeout=timeout)  # without Graphviz, the picture's own last line says why
    how = ("in blocks of consecutive nodes of one kind" if graph.group_by == "block"
           else f"grouped by source {graph.group_by}")
    grouped = "" if graph.group_by == "eqn" else (
        f"<p><small>{graph.num_eqns} eqns, shown {how}; hover a node for its operations.</small></p>")
    picture = f'<div style="max-width:100%;overflow:auto">{inline_svg(svg)}</div>{grouped}'
    return (f'<div class="jaxaot-split"><p><b>jaxaot split</b>: {html.escape(_summary(part))}</p>'
            f"{_legend_div()}{picture}{residual_table_html(lowered)}</div>", note)


def standalone_page(body: str, title: str) -> str:
    """A complete HTML document around the fragment ``body``."""
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            '<style>body{font-family:sans-serif} td,th{border:1px solid #ccc;padding:2px 6px}</style>'
            f"</head><body>{body}</body></html>\n")


def _summary(part: Any) -> str:
    recomputed = len(part.recomputed)
    return (f"{len(part.residuals)} saved values, {format_bytes(part.saved_bytes)} "
            f"({part.saved_bytes} bytes); {recomputed} eqn{'s' if recomputed != 1 else ''} recomputed "
            "in the backward")


def _legend_div() -> str:
    spans = "".join(
        f'<span style="background:{STYLES[k].fill};padding:1px 6px;margin-right:6px;border:1px solid #999">'
        f"{html.escape(STYLES[k].legend)}</span>"
        for k in LEGEND_KINDS
    )
    return f'<div class="jaxaot-legend" style="margin:4px 0">{spans}</div>'
