"""The split graph as data: :class:`Node`, :class:`SplitGraph` and the kinds of node.

A node is an eqn of the forward or backward program (or a group of them), or a
value crossing a program boundary: an input, an output, a saved value
(residual), a cotangent or a gradient. Nothing here knows how it is drawn.

Example:
    >>> g = SplitGraph((Node("in0", "input", "x"), Node("f0", "forward", "sin")), (("in0", "f0"),), "eqn", 1)
    >>> [n.id for n in g.of_kind("forward")]
    ['f0']
"""

from __future__ import annotations

import dataclasses

#: Node kinds drawn in the forward cluster and in the backward cluster ("saved" sits between).
FORWARD_SIDE = ("input", "forward", "output")
BACKWARD_SIDE = ("cotangent", "recomputed", "backward", "grad")
#: Kinds whose nodes stand for eqns (the others stand for values).
EQN_KINDS = ("forward", "recomputed", "backward")
#: What one eqn node may stand for, finest first.
GROUP_LEVELS = ("eqn", "line", "function")


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a :class:`SplitGraph`.

    Attributes:
      id: unique within the graph.
      kind: ``"forward"``, ``"saved"``, ``"backward"``, ... (a key of :data:`jaxaot.viz.STYLES`).
      label: the text shown, lines separated by ``\\n``.
      tooltip: the longer description (SVG hover text).
      source: the eqn's ``file:line:col (function)``, for eqn nodes.
      ops: primitive names of the eqns the node stands for (empty for values).
      nbytes: for saved values, the bytes they hold.
      count: how many eqns (or saved values) the node stands for.
      argument: a primal input, or the saved value of one.
    """

    id: str
    kind: str
    label: str
    tooltip: str = ""
    source: str = ""
    ops: tuple[str, ...] = ()
    nbytes: int = 0
    count: int = 1
    argument: bool = False


@dataclasses.dataclass(frozen=True)
class SplitGraph:
    """The split program as nodes and edges, before any layout.

    Attributes:
      nodes: every :class:`Node`.
      edges: ``(from_id, to_id)`` data dependencies, deduplicated.
      group_by: ``"eqn"``, ``"line"`` or ``"function"``: what one eqn node stands for; ``"block"``: runs of
        consecutive nodes of one kind, merged to fit ``max_nodes`` (:func:`jaxaot.viz.split_graph`).
      num_eqns: eqns in the forward and backward programs together.
    """

    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]
    group_by: str
    num_eqns: int

    def of_kind(self, kind: str) -> list[Node]:
        """The nodes of one kind, in program order."""
        return [n for n in self.nodes if n.kind == kind]
