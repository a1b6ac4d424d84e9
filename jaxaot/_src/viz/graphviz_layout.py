"""Laying the split graph out with Graphviz: DOT source, SVG, and why no layout could run.

The forward eqns go in one cluster, the backward eqns in another, the saved
values in one row between them, with a legend on top. The ``graphviz`` Python
package builds the DOT source; Graphviz's ``dot`` binary lays it out as SVG,
within :data:`DOT_TIMEOUT` seconds (its time grows faster than the graph: a
thousand nodes take minutes). Both are optional: :func:`to_svg` says why it drew
nothing (missing, failed or too slow) instead of failing, and
:func:`jaxaot._src.viz.picture.draw_svg` then draws with the built-in layout.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.viz import split_graph
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> picture, why = to_svg(split_graph(low), "")
    >>> (picture is not None) == layout_available() and (picture is None) == bool(why)
    True
"""

from __future__ import annotations

import html
import shutil
import subprocess
from typing import Any

from jaxaot._src.viz.argument_checks import check_graph, check_text, require_extra
from jaxaot._src.viz.model import BACKWARD_SIDE, FORWARD_SIDE, Node, SplitGraph
from jaxaot._src.viz.styles import LEGEND_KINDS, STYLES

#: Seconds Graphviz's ``dot`` may take to lay a graph out before the built-in layout draws it instead.
DOT_TIMEOUT = 30.0


def layout_available() -> bool:
    """Whether the ``graphviz`` package and Graphviz's ``dot`` binary are both present.

    Example:
        >>> from jaxaot.viz import layout_available
        >>> isinstance(layout_available(), bool)
        True
    """
    return not why_no_layout()


def why_no_layout() -> str:
    """Why no layout engine can run, or ``""`` if one can."""
    try:
        import graphviz  # noqa: F401  (optional dependency: the 'viz' extra)
    except ImportError:
        return "the graphviz Python package is not installed (for Graphviz's picture: pip install graphviz)"
    if shutil.which("dot") is None:
        return ("Graphviz's dot was not found (for Graphviz's picture: apt-get install graphviz, "
                "or brew install graphviz)")
    return ""


def to_digraph(graph: SplitGraph, *, title: str = "") -> Any:
    """A ``graphviz.Digraph`` of ``graph``: forward cluster, residuals, backward cluster, legend.

    Each node carries its kind as its SVG ``class`` (``class="node saved"``) and
    its ``STYLES`` colour. Needs the ``graphviz`` Python package, not ``dot``.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> from jaxaot.viz import STYLES, split_graph, to_digraph
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> src = to_digraph(split_graph(low)).source
        >>> STYLES["saved"].fill in src and "cluster_forward" in src
        True
    """
    check_graph(graph, "to_digraph")
    check_text(title, "title", "to_digraph")
    graphviz = require_extra("graphviz", "to_digraph")

    g = graphviz.Digraph("split", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "fontsize": "11",
                                              "label": _dot_label(title), "labelloc": "t", "nodesep": "0.15",
                                              "ranksep": "0.3"},
                         node_attr={"fontname": "Helvetica", "fontsize": "10", "margin": "0.06,0.03"},
                         edge_attr={"color": "#777777", "arrowsize": "0.6"})
    g.node("legend", label=_legend_label(), shape="plaintext", **{"class": "legend"})
    for name, kinds, label in (("cluster_forward", FORWARD_SIDE, "forward"),
                               ("cluster_backward", BACKWARD_SIDE, "backward")):
        with g.subgraph(name=name) as sub:
            sub.attr(label=label, style="dashed", color="#999999", fontcolor="#555555")
            for n in graph.nodes:
                if n.kind in kinds:
                    _add_node(sub, n)
    with g.subgraph(name="residuals") as sub:
        sub.attr(rank="same")  # one row: the boundary the values cross
        for n in graph.of_kind("saved"):
            _add_node(sub, n)
    for a, b in graph.edges:
        g.edge(a, b)
    return g


def to_svg(graph: SplitGraph, title: str, timeout: float = DOT_TIMEOUT) -> tuple[str | None, str]:
    """``(svg, "")``, or ``(None, why)`` when no layout engine could run, failed, or took over ``timeout`` seconds.

    ``dot`` runs as a subprocess of its own, killed at the timeout, so a graph too large for it costs
    ``timeout`` seconds at most.
    """
    why = why_no_layout()
    if why:
        return None, why
    source = to_digraph(graph, title=title).source
    try:
        done = subprocess.run([shutil.which("dot") or "dot", "-Tsvg"], input=source.encode("utf-8"),
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, (f"Graphviz's dot took over {timeout:g} s to lay out {len(graph.nodes)} nodes (give it a "
                      "larger timeout, or draw fewer nodes: group_by='auto' and a smaller max_nodes)")
    except OSError as e:
        return None, f"Graphviz failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"Graphviz failed: dot exited with status {done.returncode}{': ' + err[0] if err else ''}"
    return done.stdout.decode("utf-8"), ""


def inline_svg(svg_text: str) -> str:
    """``svg_text`` without its XML prolog and DOCTYPE, which are not allowed inside HTML."""
    start = svg_text.find("<svg")
    return svg_text[start:] if start >= 0 else svg_text


def _add_node(sub: Any, n: Node) -> None:
    s = STYLES[n.kind]
    sub.node(n.id, label=_dot_label(n.label), tooltip=_dot_label(_tooltip(n.tooltip or n.label)), shape=s.shape,
             style=s.style, fillcolor=s.fill, **{"class": n.kind})


#: The longest tooltip given to Graphviz, whose ``dot`` refuses a quoted string over 16384 characters.
MAX_TOOLTIP = 4000


def _tooltip(text: str) -> str:
    """``text``, its lines cut where it would pass :data:`MAX_TOOLTIP` (a node merged from many values)."""
    if len(text) <= MAX_TOOLTIP:
        return text
    lines, kept, size = text.split("\n"), [], 0
    for line in lines:
        if size + len(line) + 1 > MAX_TOOLTIP - 40:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept) + f"\n… and {len(lines) - len(kept)} more"


def _dot_label(text: str) -> str:
    # Graphviz record/escape syntax treats backslashes specially; "\l" etc. must not leak in; and a text in angle
    # brackets (<lambda>) would be read as an HTML-like label.
    return require_extra("graphviz", "to_digraph").nohtml(text.replace("\\", "\\\\"))


def _legend_label() -> str:
    """A Graphviz HTML-like label: one coloured cell per node kind."""
    cells = "".join(
        f'<TD BGCOLOR="{STYLES[k].fill}">{html.escape(STYLES[k].legend)}</TD>'
        for k in LEGEND_KINDS
    )
    return f'<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="4"><TR>{cells}</TR></TABLE>>'
