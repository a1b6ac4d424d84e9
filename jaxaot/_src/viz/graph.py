"""Building the split graph of ``aot_fn.lower(...)``: :func:`split_graph`.

One node per eqn of the forward and backward programs and per value crossing a
program boundary (inputs, outputs, saved values, cotangents, gradients); edges
are data dependencies. Backward eqns that depend on no cotangent are marked
``"recomputed"``. Large programs are collapsed (:mod:`jaxaot._src.viz.grouping`) so
they stay readable, and quick to lay out: one node per eqn while that fits in
``max_nodes``, else one per source line, else one per function, else blocks of
consecutive nodes (:func:`~jaxaot._src.viz.grouping.bound`).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.units import format_bytes
from jaxaot._src.viz.formatting import short_source
from jaxaot._src.viz.argument_checks import check_choice, check_max_nodes
from jaxaot._src.viz.grouping import bound, collapse
from jaxaot._src.viz.model import GROUP_LEVELS, Node, SplitGraph
from jaxaot._src.viz.lowered_parts import backward_is_cotangent_dependent, input_names, output_names, unwrap


def split_graph(lowered: Any, *, max_nodes: int = 80, group_by: str = "auto") -> SplitGraph:
    """The :class:`SplitGraph` of ``aot_fn.lower(...)``'s forward/backward split.

    Args:
      lowered: an :class:`jaxaot.AOTLowered` (also a ``ModuleLowered`` or a bare
        :class:`jaxaot.partition.Partition`, which lacks argument names).
      max_nodes: with ``group_by="auto"``, the finest grouping whose graph has at
        most this many nodes is used; where none fits, the one-per-function graph's
        consecutive nodes of one kind merge into blocks (``group_by == "block"``)
        until it fits, or down to one node per kind of node.
      group_by: ``"eqn"``, ``"line"``, ``"function"`` or ``"auto"``; a level given
        explicitly is used whatever its size.

    Raises:
      InvalidInputError: ``lowered`` is not a lowered function (or a Partition), or ``max_nodes`` is not an int.
      InvalidValueError: an unknown ``group_by``, or ``max_nodes`` below 1.

    Example:
        >>> from jaxaot.viz import split_graph
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: (x * x).sum()).lower(jnp.ones(3))
        >>> g = split_graph(low)
        >>> g.group_by, [n.label for n in g.of_kind("saved")]
        ('eqn', ['saved: arg[0]\\nf32[3] · 12 B'])
    """
    return split_for(lowered, max_nodes, group_by, "split_graph")


def split_for(lowered: Any, max_nodes: Any, group_by: Any, where: str) -> SplitGraph:
    """:func:`split_graph` for the public function ``where``, whose name its argument errors carry."""
    unwrap(lowered, where)
    max_nodes = check_max_nodes(max_nodes, where)
    check_choice(group_by, "group_by", GROUP_LEVELS + ("auto",), where)
    graph = _eqn_graph(lowered)
    if group_by != "auto":
        return collapse(graph, group_by)
    for level in GROUP_LEVELS:
        candidate = collapse(graph, level)
        if len(candidate.nodes) <= max_nodes:
            return candidate
    return bound(candidate, max_nodes)


class _Builder:
    """Accumulates nodes and edges; ``env`` maps each program var to the node that made it."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.edges: dict[tuple[str, str], None] = {}  # a dict: deduplicated, in order
        self.env: dict[Any, str] = {}

    def add(self, node: Node, reads: Iterable[Any] = (), makes: Iterable[Any] = ()) -> None:
        self.nodes.append(node)
        for v in reads:
            src = None if C.is_literal(v) else self.env.get(v)
            if src is not None:
                self.edges[(src, node.id)] = None
        self.env.update((v, node.id) for v in makes)


def _eqn_graph(lowered: Any) -> SplitGraph:
    """One node per eqn and per program input/output/residual."""
    part, joint = unwrap(lowered)
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    in_names, out_names = input_names(part, joint), output_names(part, joint)
    b = _Builder()

    for i, v in enumerate(fwd.invars):
        b.add(Node(f"in{i}", "input", in_names[i], format_aval(v.aval), argument=True), makes=[v])
    for i, eqn in enumerate(fwd.eqns):
        b.add(_eqn_node(f"f{i}", "forward", eqn), eqn.invars, eqn.outvars)
    for i, v in enumerate(fwd.outvars[: part.num_outputs]):
        b.add(Node(f"out{i}", "output", out_names[i], format_aval(v.aval)), [v])

    # Residuals, in the order the backward takes them: saved inputs, then forward outputs.
    # Matched by position, so a partition whose programs do not share vars still draws.
    n_ct = len(part.cotangent_outputs)
    for k, (r, bv) in enumerate(zip(part.residuals, bwd.invars[n_ct:])):
        src_var = fwd.invars[r.index] if r.source == "input" else fwd.outvars[r.index]
        label, tip = _saved_label(r, in_names)
        b.add(Node(f"saved{k}", "saved", label, tip, r.source_line, nbytes=r.nbytes, argument=r.source == "input"),
              [src_var], [bv])

    for k, (i, v) in enumerate(zip(part.cotangent_outputs, bwd.invars[:n_ct])):
        b.add(Node(f"ct{k}", "cotangent", f"cotangent of {out_names[i]}", format_aval(v.aval)), makes=[v])
    for i, (eqn, dep) in enumerate(zip(bwd.eqns, backward_is_cotangent_dependent(part.backward, n_ct))):
        b.add(_eqn_node(f"b{i}", "backward" if dep else "recomputed", eqn), eqn.invars, eqn.outvars)
    for k, (i, v) in enumerate(zip(part.grad_inputs, bwd.outvars)):
        b.add(Node(f"grad{k}", "grad", f"gradient of {in_names[i]}", format_aval(v.aval)), [v])
    return SplitGraph(tuple(b.nodes), tuple(b.edges), "eqn", len(fwd.eqns) + len(bwd.eqns))


def _eqn_node(nid: str, kind: str, eqn: Any) -> Node:
    outs = [format_aval(v.aval) for v in eqn.outvars]
    shown = outs[0] + (f" +{len(outs) - 1}" if len(outs) > 1 else "") if outs else ""
    source = C.eqn_source(eqn)
    line, fn = short_source(source)
    return Node(nid, kind, f"{eqn.primitive}\n{shown}", f"{eqn.primitive} -> {', '.join(outs)} @ {line} ({fn})",
                source, (str(eqn.primitive),))


def _saved_label(r: Any, in_names: Sequence[str]) -> tuple[str, str]:
    """``(label, tooltip)`` of a saved value: what it is, its aval and its size."""
    if r.source == "input":
        what = in_names[r.index] if r.index < len(in_names) else f"input[{r.index}]"
    else:
        what = f"{r.producer} @ {short_source(r.source_line)[0]}"
    size = f"{format_aval(r.aval)} · {format_bytes(r.nbytes)}"
    return f"saved: {what}\n{size}", f"{r.source}[{r.index}] {size} <- {r.producer} @ {r.source_line or 'input'}"
