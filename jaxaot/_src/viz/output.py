"""Rendering a split to text or to a file: SVG (the graph), an HTML page, or DOT source.

A path that names a folder gets ``split.<format>`` inside it, as ``jaxaot demo --out DIR`` writes.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> render(low, format="html").startswith("<!doctype html>")
    True
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from jaxaot.errors import InvalidValueError
from jaxaot._src.viz.argument_checks import check_choice, check_path, check_text, check_timeout
from jaxaot._src.viz.graph import split_for
from jaxaot._src.viz.graphviz_layout import DOT_TIMEOUT, layout_available, to_digraph
from jaxaot._src.viz.lowered_parts import unwrap
from jaxaot._src.viz.page import graph_html, standalone_page
from jaxaot._src.viz.picture import draw_svg

FORMATS = ("svg", "html", "dot")
#: The file name (before its suffix) :func:`render` writes inside a folder it is given.
DEFAULT_NAME = "split"


def render(lowered: Any, path: str | Path | None = None, format: str = "svg", *, max_nodes: int = 80,
           group_by: str = "auto", title: str = "", timeout: float = DOT_TIMEOUT) -> str | Path:
    """Render the split of ``aot_fn.lower(...)``; return the text, or write it to ``path``.

    Args:
      lowered: an :class:`jaxaot.AOTLowered` (or its ``AOTCompiled``, a ``ModuleLowered`` or a ``Partition``).
      path: where to write: a file (the format's suffix added unless the path ends in it), or a folder (one
        that exists, or a path ending in ``/``), which gets ``split.<format>``; ``None`` returns the text instead.
      format: ``"svg"`` (the graph), ``"html"`` (a standalone page: graph,
        legend and residual table) or ``"dot"`` (Graphviz source; needs no binary).
      max_nodes, group_by: see :func:`jaxaot.viz.split_graph`.
      title: a caption for the graph.
      timeout: seconds Graphviz's ``dot`` may take to lay the graph out; past them the built-in layout draws it.

    Without Graphviz's ``dot`` (or the ``graphviz`` package), ``"svg"`` and
    ``"html"`` draw the graph with jaxaot's built-in layered layout
    (:func:`jaxaot.viz.plain_svg`: the same colours, simpler routing) and say so:
    the picture's last line names what is missing, and ``"svg"`` warns
    (``UserWarning``) with how to get Graphviz's picture. Where Graphviz is
    installed but fails or runs past ``timeout``, both formats warn.

    Returns:
      the SVG/HTML/DOT text if ``path`` is None, else the :class:`~pathlib.Path` written.

    Raises:
      InvalidInputError: ``lowered`` is not a lowered function, or an argument is of the wrong type.
      InvalidValueError: an unknown ``format`` or ``group_by``, or ``max_nodes`` or ``timeout`` out of range.

    Example:
        >>> from jaxaot.viz import render
        >>> import jax.numpy as jnp, jaxaot, tempfile, os
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> render(low, format="dot").startswith("digraph split")
        True
        >>> out = render(low, os.path.join(tempfile.mkdtemp(), "split.html"), format="html")
        >>> out.suffix
        '.html'
        >>> render(low, tempfile.mkdtemp(), format="dot").name  # a folder: a file named split.dot in it
        'split.dot'
    """
    unwrap(lowered, "render")
    check_choice(format, "format", FORMATS, "render")
    check_path(path, "render")
    check_text(title, "title", "render")
    check_timeout(timeout, "render")
    target = None if path is None else _target(path, format)
    graph = split_for(lowered, max_nodes, group_by, "render")
    if format == "dot":
        text = to_digraph(graph, title=title).source
    elif format == "svg":
        text, note = draw_svg(graph, title, timeout=timeout)
        if note:
            warnings.warn(note, stacklevel=2)
    else:
        body, note = graph_html(lowered, graph, timeout)
        if note and layout_available():  # Graphviz is there but failed or was too slow: not a missing install
            warnings.warn(note, stacklevel=2)
        text = standalone_page(body, title or "jaxaot split")
    if target is None:
        return text
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def _target(path: str | os.PathLike, format: str) -> Path:
    """The file ``render`` writes: ``split.<format>`` inside a folder (an existing one, or a path ending in a
    separator), else ``path`` with the format's suffix added where it lacks it."""
    folder = str(path).endswith(("/", os.sep)) or Path(path).is_dir()
    out = Path(path)
    if folder:
        return out / f"{DEFAULT_NAME}.{format}"
    if out.suffix.lower() != f".{format}":  # "split_budget_0.5" keeps its ".5": the format's suffix is added
        out = out.with_name(f"{out.name}.{format}")
    if out.is_dir():
        raise InvalidValueError(f"render: {str(out)!r} is a folder; give a file name, or the folder itself "
                                f"({str(path)!r} gets {DEFAULT_NAME}.{format} inside it)")
    return out
