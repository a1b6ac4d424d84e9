"""The picture of a split: Graphviz's layout where ``dot`` runs, else the built-in one, with a note.

:func:`draw_svg` is what every renderer asks for a picture (:func:`jaxaot._src.viz.render`,
the Jupyter view, ``jaxaot demo``): Graphviz's drawing (:func:`jaxaot._src.viz.graphviz_layout.to_svg`)
when the ``graphviz`` package and its ``dot`` binary are there and succeed within the
timeout, else :func:`~jaxaot._src.viz.plain_drawing.plain_svg`'s, whose note says why and how to get
Graphviz's. Both colour the nodes alike (:data:`~jaxaot._src.viz.styles.STYLES`).

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.viz import layout_available, split_graph
    >>> svg, note = draw_svg(split_graph(jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))))
    >>> "<svg" in svg and (note == "") == layout_available()
    True
"""

from __future__ import annotations

from jaxaot._src.viz.argument_checks import check_graph, check_text, check_timeout
from jaxaot._src.viz.graphviz_layout import DOT_TIMEOUT, to_svg
from jaxaot._src.viz.model import SplitGraph
from jaxaot._src.viz.plain_drawing import plain_svg


def draw_svg(graph: SplitGraph, title: str = "", *, timeout: float = DOT_TIMEOUT) -> tuple[str, str]:
    """``(svg, note)``: Graphviz's SVG and ``""``, or the built-in layout's SVG and why it was used.

    ``timeout``: seconds Graphviz's ``dot`` may run; a graph it cannot lay out in time is drawn by the
    built-in layout, and the note says so.
    """
    check_graph(graph, "draw_svg")
    check_text(title, "title", "draw_svg")
    svg, why = to_svg(graph, title, check_timeout(timeout, "draw_svg"))
    if svg is not None:
        return svg, ""
    note = f"drawn with jaxaot's built-in layout: {why}"
    return plain_svg(graph, title=title, note=note), note
