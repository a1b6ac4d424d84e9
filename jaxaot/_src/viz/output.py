"""Rendering a split to text or to a file: SVG (the graph), an HTML page, or DOT source.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> render(low, format="html").startswith("<!doctype html>")
    True
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from jaxaot.errors import InvalidValueError
from jaxaot._src.viz.graph import split_graph
from jaxaot._src.viz.graphviz_layout import to_digraph
from jaxaot._src.viz.page import graph_html, standalone_page
from jaxaot._src.viz.picture import draw_svg

FORMATS = ("svg", "html", "dot")


def render(lowered: Any, path: str | Path | None = None, format: str = "svg", *, max_nodes: int = 80,
           group_by: str = "auto", title: str = "") -> str | Path:
    """Render the split of ``aot_fn.lower(...)``; return the text, or write it to ``path``.

    Args:
      lowered: an :class:`jaxaot.AOTLowered`.
      path: where to write (the format's suffix added unless the path ends in it); ``None`` returns the text instead.
      format: ``"svg"`` (the graph), ``"html"`` (a standalone page: graph,
        legend and residual table) or ``"dot"`` (Graphviz source; needs no binary).
      max_nodes, group_by: see :func:`jaxaot.viz.split_graph`.
      title: a caption for the graph.

    Without Graphviz's ``dot`` (or the ``graphviz`` package), ``"svg"`` and
    ``"html"`` draw the graph with jaxaot's built-in layered layout
    (:func:`jaxaot.viz.plain_svg`: the same colours, simpler routing) and say so:
    the picture's last line names what is missing, and ``"svg"`` warns
    (``UserWarning``) with how to get Graphviz's picture.

    Returns:
      the SVG/HTML/DOT text if ``path`` is None, else the :class:`~pathlib.Path` written.

    Example:
        >>> from jaxaot.viz import render
        >>> import jax.numpy as jnp, jaxaot, tempfile, os
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> render(low, format="dot").startswith("digraph split")
        True
        >>> out = render(low, os.path.join(tempfile.mkdtemp(), "split.html"), format="html")
        >>> out.suffix
        '.html'
    """
    if format not in FORMATS:
        raise InvalidValueError(f"format must be 'svg', 'html' or 'dot', got {format!r}")
    graph = split_graph(lowered, max_nodes=max_nodes, group_by=group_by)
    if format == "dot":
        text = to_digraph(graph, title=title).source
    elif format == "svg":
        text, note = draw_svg(graph, title)
        if note:
            warnings.warn(note, stacklevel=2)
    else:
        text = standalone_page(graph_html(lowered, graph), title or "jaxaot split")
    if path is None:
        return text
    path = Path(path)
    if path.suffix.lower() != f".{format}":  # "split_budget_0.5" keeps its ".5": the format's suffix is added
        path = path.with_name(f"{path.name}.{format}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
