"""How each kind of node looks: its Graphviz shape and colour, and its legend entry.

Example:
    >>> STYLES["saved"].fill, STYLES["output"] is STYLES["input"]
    ('#a1d99b', True)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Style:
    """How one kind of node looks, in Graphviz and in the HTML legend."""

    fill: str
    shape: str
    style: str
    legend: str


STYLES: dict[str, Style] = {
    "input": Style("#eeeeee", "ellipse", "filled", "input / output / cotangent / gradient"),
    "forward": Style("#9ecae1", "box", "rounded,filled", "forward eqn"),
    "saved": Style("#a1d99b", "box", "filled,bold", "saved for the backward (residual)"),
    "recomputed": Style("#bcbddc", "box", "rounded,filled,dashed", "recomputed in the backward"),
    "backward": Style("#fdae6b", "box", "rounded,filled", "backward eqn"),
}
# Program boundaries share the input style: the colour is for what crosses the split.
for _kind in ("output", "cotangent", "grad"):
    STYLES[_kind] = STYLES["input"]

#: The kinds the legend shows, in order (one entry stands for all program boundaries).
LEGEND_KINDS = ("forward", "saved", "recomputed", "backward", "input")
