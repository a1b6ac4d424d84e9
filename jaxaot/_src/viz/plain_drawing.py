"""The split graph as SVG without Graphviz: :func:`plain_svg`, drawn from :mod:`jaxaot._src.viz.plain_layout`.

The same picture as Graphviz's in simpler dress: a legend on top, the forward
program's dashed frame, the saved values' row, the backward program's frame;
nodes in their :data:`~jaxaot._src.viz.styles.STYLES` colours (forward blue, saved
green and bold, recomputed purple and dashed, backward orange, program
boundaries grey ellipses), each an SVG group ``class="node <kind>"`` with its
tooltip as ``<title>``, as Graphviz writes them; edges as straight arrows.
Written with string formatting and :func:`html.escape`: no dependency.

Example:
    >>> import xml.etree.ElementTree as ET
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.viz import split_graph
    >>> g = split_graph(jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3)))
    >>> root = ET.fromstring(plain_svg(g, title="sin"))
    >>> nodes = [e for e in root.iter("{http://www.w3.org/2000/svg}g") if "node" in e.get("class", "").split()]
    >>> len(nodes) == len(g.nodes)
    True
"""

from __future__ import annotations

import html

from jaxaot._src.viz.argument_checks import check_graph, check_text
from jaxaot._src.viz.model import SplitGraph
from jaxaot._src.viz.plain_layout import CHAR_WIDTH, LINE_HEIGHT, Box, Cluster, layered_layout
from jaxaot._src.viz.styles import LEGEND_KINDS, STYLES

#: Colours Graphviz uses in :func:`jaxaot._src.viz.to_digraph`: edges, frames, frame labels, outlines.
EDGE, FRAME, FRAME_TEXT, OUTLINE = "#777777", "#999999", "#555555", "#333333"
_FONT = "Helvetica,Arial,sans-serif"


def plain_svg(graph: SplitGraph, *, title: str = "", note: str = "") -> str:
    """An SVG document of ``graph``: legend, frames, nodes and edges (see the module docstring).

    ``title`` is drawn above the legend, ``note`` (say, why Graphviz did not
    draw it) in small grey text below the picture.
    """
    check_graph(graph, "plain_svg")
    check_text(title, "title", "plain_svg")
    check_text(note, "note", "plain_svg")
    legend_y = 8.0 + (LINE_HEIGHT + 6 if title else 0)
    lay = layered_layout(graph, top=legend_y + LINE_HEIGHT + 14)
    legend, legend_width = _legend(legend_y)
    width = max(lay.width, legend_width + 16, len(note) * CHAR_WIDTH * 0.85 + 16)
    height = lay.height + (LINE_HEIGHT + 4 if note else 0)
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt" '
        f'viewBox="0 0 {width:.1f} {height:.1f}" font-family="{_FONT}" font-size="10">',
        '<defs><marker id="jaxaot-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
        f'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{EDGE}"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    if title:
        parts.append(f'<text x="{width / 2:.1f}" y="{8 + LINE_HEIGHT - 3:.1f}" text-anchor="middle" '
                     f'font-size="11">{_esc(title)}</text>')
    parts.append(legend)
    parts.extend(_cluster(c) for c in lay.clusters)
    parts.extend(_edge(lay.boxes[a], lay.boxes[b]) for a, b in graph.edges if a in lay.boxes and b in lay.boxes)
    parts.extend(_node(lay.boxes[n.id]) for n in graph.nodes)
    if note:
        parts.append(f'<text class="note" x="8" y="{height - 6:.1f}" font-size="8" fill="{FRAME_TEXT}">'
                     f"{_esc(note)}</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _esc(text: str) -> str:
    return html.escape(text, quote=False)  # text and the class attribute (kinds hold no quotes)


def _legend(y: float) -> tuple[str, float]:
    """One coloured cell per legend kind, in a row from the left; and the row's width."""
    x, cells = 8.0, []
    for kind in LEGEND_KINDS:
        s = STYLES[kind]
        w = len(s.legend) * CHAR_WIDTH * 0.9 + 10
        cells.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{LINE_HEIGHT + 5:.1f}" '
                     f'fill="{s.fill}" stroke="{OUTLINE}" stroke-width="0.6"/>'
                     f'<text x="{x + 5:.1f}" y="{y + LINE_HEIGHT:.1f}">{_esc(s.legend)}</text>')
        x += w
    return f'<g class="legend">{"".join(cells)}</g>', x


def _cluster(c: Cluster) -> str:
    return (f'<g class="cluster"><rect x="{c.x0:.1f}" y="{c.y0:.1f}" width="{c.x1 - c.x0:.1f}" '
            f'height="{c.y1 - c.y0:.1f}" fill="none" stroke="{FRAME}" stroke-dasharray="5,3"/>'
            f'<text x="{(c.x0 + c.x1) / 2:.1f}" y="{c.y0 + LINE_HEIGHT:.1f}" text-anchor="middle" '
            f'fill="{FRAME_TEXT}">{_esc(c.label)}</text></g>')


def _edge(a: Box, b: Box) -> str:
    """A straight arrow from the bottom of ``a`` to the top of ``b`` (or side to side within a layer)."""
    if abs(a.y - b.y) < 1e-6:
        sign = 1 if b.x > a.x else -1
        x1, y1, x2, y2 = a.x + sign * a.width / 2, a.y, b.x - sign * b.width / 2, b.y
    else:
        down = 1 if b.y > a.y else -1
        x1, y1, x2, y2 = a.x, a.y + down * a.height / 2, b.x, b.y - down * b.height / 2
    return (f'<g class="edge"><line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{EDGE}" '
            f'stroke-width="0.8" marker-end="url(#jaxaot-arrow)"/></g>')


def _node(b: Box) -> str:
    n, s = b.node, STYLES[b.node.kind]
    dash = ' stroke-dasharray="4,2"' if "dashed" in s.style else ""
    stroke = "1.8" if "bold" in s.style else "0.8"
    paint = f'fill="{s.fill}" stroke="{OUTLINE}" stroke-width="{stroke}"{dash}'
    if s.shape == "ellipse":
        shape = f'<ellipse cx="{b.x:.1f}" cy="{b.y:.1f}" rx="{b.width / 2:.1f}" ry="{b.height / 2:.1f}" {paint}/>'
    else:
        rx = ' rx="4"' if "rounded" in s.style else ""
        shape = (f'<rect x="{b.x - b.width / 2:.1f}" y="{b.y - b.height / 2:.1f}" width="{b.width:.1f}" '
                 f'height="{b.height:.1f}"{rx} {paint}/>')
    lines = n.label.split("\n")
    first = b.y - (len(lines) - 1) * LINE_HEIGHT / 2 + 3.5  # baselines, the block centred on the box
    text = "".join(f'<tspan x="{b.x:.1f}" y="{first + i * LINE_HEIGHT:.1f}">{_esc(line)}</tspan>'
                   for i, line in enumerate(lines))
    return (f'<g class="node {_esc(n.kind)}"><title>{_esc(n.tooltip or n.label)}</title>{shape}'
            f'<text text-anchor="middle">{text}</text></g>')
