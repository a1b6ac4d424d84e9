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
from jaxaot.viz.graph import split_graph
from jaxaot.viz.layout import to_digraph, to_svg
from jaxaot.viz.page import graph_html, standalone_page

FORMATS = ("svg", "html", "dot")


def render(lowered: Any, path: str | Path | None = None, format: str = "svg", *, max_nodes: int = 80,
           group_by: str = "auto", title: str = "") -> str | Path:
    """Render the split of ``aot_fn.lower(...)``; return the text, or write it to ``path``.

    Args:
      lowered: an :class:`jaxaot.AOTLowered`.
      path: where to write; ``None`` returns the text instead.
      format: ``"svg"`` (the graph), ``"html"`` (a standalone page: graph,
        legend and residual table) or ``"dot"`` (Graphviz source; needs no binary).
      max_nodes, group_by: see :func:`jaxaot.viz.split_graph`.
      title: a caption for the graph.

    Without Graphviz's ``dot``, ``"svg"`` falls back to the HTML page with the
    residual table and a note; written to a file, its suffix becomes ``.html``
    (with a warning) so the file's name says what it holds.

    Returns:
      the SVG/HTML/DOT text if ``path`` is None, else the :class:`~pathlib.Path` written.

    Example:
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
    text, suffix = None, f".{format}"
    if format == "dot":
        text = to_digraph(graph, title=title).source
    elif format == "svg":
        text, _ = to_svg(graph, title)
    if text is None:  # html asked for, or svg without a layout engine
        text, suffix = standalone_page(graph_html(lowered, graph), title or "jaxaot split"), ".html"
    if path is None:
        return text
    return _write(Path(path), suffix, text, fell_back=format == "svg" and suffix == ".html")


def _write(path: Path, suffix: str, text: str, *, fell_back: bool) -> Path:
    """Write ``text`` to ``path`` with ``suffix``; warn if an SVG became the HTML fallback."""
    if path.suffix != suffix:
        if fell_back:
            warnings.warn(f"no Graphviz layout engine: writing the residual table to {path.with_suffix(suffix)} "
                          f"instead of an SVG graph to {path}", stacklevel=3)
        path = path.with_suffix(suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
