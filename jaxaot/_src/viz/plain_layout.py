"""A layered layout of the split graph in pure Python, for when Graphviz's ``dot`` is not there.

It keeps Graphviz's arrangement (forward on top, saved values in one row, backward
below) with a plain Sugiyama-style drawing: layers by longest path on each side,
order within a layer by two barycenter sweeps, boxes packed and sized from their
labels. Edges are straight (:mod:`jaxaot._src.viz.plain_drawing`) and may cross boxes.

Example:
    >>> from jaxaot._src.viz.model import Node, SplitGraph
    >>> g = SplitGraph((Node("in0", "input", "x"), Node("f0", "forward", "sin"), Node("saved0", "saved", "s"),
    ...                 Node("b0", "backward", "cos")), (("in0", "f0"), ("f0", "saved0"), ("saved0", "b0")), "eqn", 2)
    >>> lay = layered_layout(g)
    >>> [lay.layer[i] for i in ("in0", "f0", "saved0", "b0")]
    [0, 1, 2, 3]
    >>> lay.boxes["in0"].y < lay.boxes["saved0"].y < lay.boxes["b0"].y
    True
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxaot._src.viz.model import BACKWARD_SIDE, FORWARD_SIDE, Node, SplitGraph
from jaxaot._src.viz.styles import STYLES

#: Pixels per label character (10 px Helvetica averages under 6), per label line, and around the text.
CHAR_WIDTH, LINE_HEIGHT, PAD_X, PAD_Y = 6.2, 13.0, 8.0, 5.0
#: Pixels between boxes of one layer, between layers, and around each program's cluster.
NODE_GAP, LAYER_GAP, CLUSTER_PAD = 12.0, 26.0, 10.0
#: Barycenter sweeps that order each layer.
SWEEPS = 2


@dataclasses.dataclass(frozen=True)
class Box:
    """Where one node is drawn: its centre and size, in pixels."""

    node: Node
    x: float
    y: float
    width: float
    height: float


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The dashed frame around one program's nodes."""

    label: str
    x0: float
    y0: float
    x1: float
    y1: float


@dataclasses.dataclass(frozen=True)
class Layout:
    """The boxes of every node, the program frames, and the drawing's size (origin at ``top``)."""

    boxes: dict[str, Box]
    layer: dict[str, int]
    clusters: tuple[Cluster, ...]
    width: float
    height: float


def node_size(node: Node) -> tuple[float, float]:
    """``(width, height)`` of ``node``'s box, from its label's longest line and line count.

    Example:
        >>> node_size(Node("f0", "forward", "sin\\nf32[3]"))
        (53.2, 36.0)
    """
    lines = node.label.split("\n")
    width = max(len(line) for line in lines) * CHAR_WIDTH + 2 * PAD_X
    if STYLES[node.kind].shape == "ellipse":
        width *= 1.2  # an ellipse's text needs room at its narrowing ends
    return round(width, 1), round(len(lines) * LINE_HEIGHT + 2 * PAD_Y, 1)


def layers(graph: SplitGraph) -> dict[str, int]:
    """Each node's layer (step 1 of the module docstring); predecessors not yet placed are ignored."""
    preds = _predecessors(graph)
    layer: dict[str, int] = {}
    for n in graph.nodes:
        if n.kind in FORWARD_SIDE:
            layer[n.id] = 1 + max((layer[p] for p in preds[n.id] if p in layer), default=-1)
    saved_row = 1 + max(layer.values(), default=-1)
    for n in graph.of_kind("saved"):
        layer[n.id] = saved_row
    for n in graph.nodes:
        if n.kind in BACKWARD_SIDE:
            layer[n.id] = 1 + max((layer[p] for p in preds[n.id] if p in layer and layer[p] >= saved_row),
                                  default=saved_row)
    return layer


def layered_layout(graph: SplitGraph, *, top: float = 0.0) -> Layout:
    """Lay ``graph`` out in layers (see the module docstring); ``top``: pixels left free above it."""
    layer = layers(graph)
    rows = _ordered_rows(graph, layer)
    sizes = {n.id: node_size(n) for n in graph.nodes}
    widths = [sum(sizes[n.id][0] for n in row) + NODE_GAP * max(len(row) - 1, 0) for row in rows]
    width = max(widths, default=0.0) + 4 * CLUSTER_PAD
    boxes: dict[str, Box] = {}
    y = top + 2 * CLUSTER_PAD + LINE_HEIGHT  # room for the forward frame's label
    saved_row = min((layer[n.id] for n in graph.of_kind("saved")), default=None)
    for k, (row, row_width) in enumerate(zip(rows, widths)):
        if k == saved_row or (saved_row is not None and k == saved_row + 1):
            y += 2 * CLUSTER_PAD + LINE_HEIGHT  # leave the frames' edges and the backward label clear
        height = max((sizes[n.id][1] for n in row), default=0.0)
        x = (width - row_width) / 2
        for n in row:
            w, h = sizes[n.id]
            boxes[n.id] = Box(n, x + w / 2, y + height / 2, w, h)
            x += w + NODE_GAP
        y += height + LAYER_GAP
    clusters = tuple(c for c in (_frame("forward", [b for b in boxes.values() if b.node.kind in FORWARD_SIDE]),
                                 _frame("backward", [b for b in boxes.values() if b.node.kind in BACKWARD_SIDE]))
                     if c is not None)
    bottom = max([c.y1 for c in clusters] + [b.y + b.height / 2 for b in boxes.values()], default=top)
    return Layout(boxes, layer, clusters, width, bottom + CLUSTER_PAD)


def _predecessors(graph: SplitGraph) -> dict[str, list[str]]:
    preds: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for a, b in graph.edges:
        if a in preds and b in preds:
            preds[b].append(a)
    return preds


def _ordered_rows(graph: SplitGraph, layer: dict[str, int]) -> list[list[Node]]:
    """The nodes of each layer, left to right (step 2 of the module docstring)."""
    rows: list[list[Node]] = [[] for _ in range(1 + max(layer.values(), default=-1))]
    for n in graph.nodes:
        rows[layer[n.id]].append(n)
    preds = _predecessors(graph)
    for _ in range(SWEEPS):
        pos: dict[str, float] = {}  # each placed node's place in its row, from 0 (left) to 1 (right)
        for row in rows:
            keys = []
            for i, n in enumerate(row):
                above = [pos[p] for p in preds[n.id] if p in pos]
                keys.append((sum(above) / len(above) if above else _place(i, row), i))
            row[:] = [row[i] for _, i in sorted(keys)]
            pos.update((n.id, _place(i, row)) for i, n in enumerate(row))
    return rows


def _place(i: int, row: Sequence[Node]) -> float:
    return i / max(len(row) - 1, 1) if len(row) > 1 else 0.5


def _frame(label: str, boxes: Sequence[Box]) -> Cluster | None:
    if not boxes:
        return None
    return Cluster(label,
                   min(b.x - b.width / 2 for b in boxes) - CLUSTER_PAD,
                   min(b.y - b.height / 2 for b in boxes) - CLUSTER_PAD - LINE_HEIGHT,
                   max(b.x + b.width / 2 for b in boxes) + CLUSTER_PAD,
                   max(b.y + b.height / 2 for b in boxes) + CLUSTER_PAD)
