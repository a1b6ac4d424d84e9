"""Pictures of the forward/backward split: a graph, a residual table, budget-sweep plots.

The graph shows the joint program as the partitioner split it: the forward
program's eqns, the values it saves for the backward (the residuals), and the
backward program's eqns, where those that recompute forward values are marked
apart from the ones that compute gradients. Colours:

* forward eqns: blue;  saved values (residuals): green boxes on the boundary;
* recomputed eqns: purple, dashed;  backward eqns: orange;
* inputs, outputs, cotangents and gradients: grey ellipses.

Graphviz's ``dot`` lays the graph out. Without it (or without the ``graphviz``
Python package) every renderer falls back to the residual table and says so.
Large programs are collapsed so they stay readable: one node per eqn while
that fits in ``max_nodes``, else one node per source line, else one per function.

Example:
    >>> import jax.numpy as jnp, jaxaot, jaxaot.viz
    >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
    >>> low = f.lower(jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> g = jaxaot.viz.split_graph(low)
    >>> sorted({n.kind for n in g.nodes})
    ['backward', 'cotangent', 'forward', 'grad', 'input', 'output', 'saved']
    >>> "<table" in jaxaot.viz.residual_table_html(low)
    True
"""

from __future__ import annotations

import collections
import dataclasses
import html
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from jaxaot import _compat as C
from jaxaot._pytrees import leaf_paths


# --------------------------------------------------------------------------- styles
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
for _k in ("output", "cotangent", "grad"):
    STYLES[_k] = STYLES["input"]

FORWARD_SIDE = ("input", "forward", "output")
BACKWARD_SIDE = ("cotangent", "recomputed", "backward", "grad")
EQN_KINDS = ("forward", "recomputed", "backward")
LEGEND_KINDS = ("forward", "saved", "recomputed", "backward", "input")
GROUP_LEVELS = ("eqn", "line", "function")

_DTYPE_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
                "int64": "i64", "int8": "i8", "uint8": "u8", "uint32": "u32", "bool": "bool",
                "complex64": "c64", "float0": "float0"}


# --------------------------------------------------------------------------- small formatting helpers
def aval_str(aval: Any) -> str:
    """``f32[8,16]``: the short form of an aval's dtype and shape.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> aval_str(jax.ShapeDtypeStruct((8, 16), jnp.float32))
        'f32[8,16]'
    """
    name = np.dtype(aval.dtype).name
    return f"{_DTYPE_SHORT.get(name, name)}[{','.join(map(str, aval.shape))}]"


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1.

    Example:
        >>> format_bytes(512), format_bytes(65536), format_bytes(3 * 2**20)
        ('512 B', '64.0 KiB', '3.0 MiB')
    """
    size, unit = _byte_scale(abs(n))
    return f"{int(n)} B" if unit == "B" else f"{n / size:.1f} {unit}"


def _byte_scale(n: float) -> tuple[int, str]:
    """The largest binary unit not above ``n``: ``(bytes per unit, name)``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return size, unit
    return 1, "B"


_SOURCE_RE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)? \((?P<fn>.*)\)$")


def short_source(source: str) -> tuple[str, str]:
    """``("examples.py:74", "block_apply")`` from ``eqn_source``'s ``/path/examples.py:74:15 (block_apply)``.

    Example:
        >>> short_source("/work/jaxaot/examples.py:74:15 (block_apply)")
        ('examples.py:74', 'block_apply')
        >>> short_source("<unknown>")
        ('<unknown>', '<unknown>')
    """
    m = _SOURCE_RE.match(source or "")
    if not m:
        return source or "<unknown>", source or "<unknown>"
    return f"{Path(m['file']).name}:{m['line']}", m["fn"]


# --------------------------------------------------------------------------- the graph as data
@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a :class:`SplitGraph`.

    Attributes:
      id: unique within the graph.
      kind: a key of :data:`STYLES` (``"forward"``, ``"saved"``, ``"backward"``, ...).
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
      group_by: ``"eqn"``, ``"line"`` or ``"function"``: what one eqn node stands for.
      num_eqns: eqns in the forward and backward programs together.
    """

    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]
    group_by: str
    num_eqns: int

    def of_kind(self, kind: str) -> list[Node]:
        """The nodes of one kind, in program order."""
        return [n for n in self.nodes if n.kind == kind]


def _unwrap(lowered: Any) -> tuple[Any, Any]:
    """``(partition, joint or None)`` of an AOTLowered, a ModuleLowered or a bare Partition."""
    if not hasattr(lowered, "partition") and hasattr(lowered, "lowered"):
        lowered = lowered.lowered
    if hasattr(lowered, "partition"):
        return lowered.partition, getattr(lowered, "joint", None)
    if hasattr(lowered, "residuals") and hasattr(lowered, "backward"):
        return lowered, None
    raise TypeError(f"expected the AOTLowered of aot_fn.lower(...) (or a Partition), got {type(lowered).__name__}")


def _names(treedef: Any, prefix: str, count: int) -> list[str]:
    # The partition may come from a re-traced joint: trust the pytree only if it fits.
    names = leaf_paths(treedef, prefix) if treedef is not None else []
    return names if len(names) == count else [f"{prefix}[{i}]" for i in range(count)]


def backward_is_cotangent_dependent(backward: Any, num_cotangents: int) -> list[bool]:
    """Per eqn of the backward program: does it depend on a cotangent?

    Those that do not are forward work the backward repeats (recomputation).

    Example:
        >>> import jax.numpy as jnp, jaxaot, functools
        >>> part = jaxaot.min_cut_rematerialization_partition(
        ...     jaxaot.trace_joint(lambda x: jnp.sin(jnp.sin(x)).sum(), jnp.ones(3)))
        >>> backward_is_cotangent_dependent(part.backward, 1)
        [False, False, False, True, True, True]
    """
    jaxpr = C.jaxpr_of(backward)
    tainted = set(jaxpr.invars[:num_cotangents])
    out = []
    for eqn in jaxpr.eqns:
        dep = any(not C.is_literal(v) and v in tainted for v in eqn.invars)
        if dep:
            tainted.update(eqn.outvars)
        out.append(dep)
    return out


def _eqn_node(nid: str, kind: str, eqn: Any) -> Node:
    outs = [aval_str(v.aval) for v in eqn.outvars]
    shown = outs[0] + (f" +{len(outs) - 1}" if len(outs) > 1 else "") if outs else ""
    source = C.eqn_source(eqn)
    line, fn = short_source(source)
    return Node(nid, kind, f"{eqn.primitive}\n{shown}", f"{eqn.primitive} -> {', '.join(outs)} @ {line} ({fn})",
                source, (str(eqn.primitive),))


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


def _saved_label(r: Any, input_names: Sequence[str]) -> tuple[str, str]:
    if r.source == "input":
        what = input_names[r.index] if r.index < len(input_names) else f"input[{r.index}]"
    else:
        what = f"{r.producer} @ {short_source(r.source_line)[0]}"
    size = f"{aval_str(r.aval)} · {format_bytes(r.nbytes)}"
    return f"saved: {what}\n{size}", f"{r.source}[{r.index}] {size} <- {r.producer} @ {r.source_line or 'input'}"


def _eqn_graph(lowered: Any) -> SplitGraph:
    """One node per eqn and per program input/output/residual."""
    part, joint = _unwrap(lowered)
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    in_names = _names(joint.in_tree if joint is not None else None, "input", len(fwd.invars))
    out_names = _names(joint.out_tree if joint is not None else None, "output", part.num_outputs)
    b = _Builder()

    for i, v in enumerate(fwd.invars):
        b.add(Node(f"in{i}", "input", in_names[i], aval_str(v.aval), argument=True), makes=[v])
    for i, eqn in enumerate(fwd.eqns):
        b.add(_eqn_node(f"f{i}", "forward", eqn), eqn.invars, eqn.outvars)
    for i, v in enumerate(fwd.outvars[: part.num_outputs]):
        b.add(Node(f"out{i}", "output", out_names[i], aval_str(v.aval)), [v])

    # Residuals, in the order the backward takes them: saved inputs, then forward outputs.
    # Matched by position, so a partition whose programs do not share vars still draws.
    n_ct = len(part.cotangent_outputs)
    for k, (r, bv) in enumerate(zip(part.residuals, bwd.invars[n_ct:])):
        src_var = fwd.invars[r.index] if r.source == "input" else fwd.outvars[r.index]
        label, tip = _saved_label(r, in_names)
        b.add(Node(f"saved{k}", "saved", label, tip, r.source_line, nbytes=r.nbytes, argument=r.source == "input"),
              [src_var], [bv])

    for k, (i, v) in enumerate(zip(part.cotangent_outputs, bwd.invars[:n_ct])):
        b.add(Node(f"ct{k}", "cotangent", f"cotangent of {out_names[i]}", aval_str(v.aval)), makes=[v])
    for i, (eqn, dep) in enumerate(zip(bwd.eqns, backward_is_cotangent_dependent(part.backward, n_ct))):
        b.add(_eqn_node(f"b{i}", "backward" if dep else "recomputed", eqn), eqn.invars, eqn.outvars)
    for k, (i, v) in enumerate(zip(part.grad_inputs, bwd.outvars)):
        b.add(Node(f"grad{k}", "grad", f"gradient of {in_names[i]}", aval_str(v.aval)), [v])
    return SplitGraph(tuple(b.nodes), tuple(b.edges), "eqn", len(fwd.eqns) + len(bwd.eqns))


def _group_key(node: Node, level: str) -> tuple[str, str] | None:
    if node.kind not in EQN_KINDS:
        return None
    line, fn = short_source(node.source)
    return (node.kind, line if level == "line" else fn)


def _runs(graph: SplitGraph, level: str) -> list[list[Node]]:
    """Runs of consecutive eqn nodes with one group key; every other node alone.

    Runs, not all eqns of a key, so a helper called twice (two layer norms)
    stays two nodes. A run also ends where an eqn reads an argument with a
    primitive the run already holds: that is the next layer of a Python loop
    over layers, whose eqns all share the loop body's line.
    """
    argument = {n.id for n in graph.nodes if n.argument}
    reads_argument = {b for a, b in graph.edges if a in argument}
    runs: list[list[Node]] = []
    prev = None
    for n in graph.nodes:
        key = _group_key(n, level)
        if key is not None and key == prev and not (n.id in reads_argument and _repeats(runs[-1], n)):
            runs[-1].append(n)
        else:
            runs.append([n])
        prev = key
    return runs


def _repeats(run: Sequence[Node], node: Node) -> bool:
    return any(op in m.ops for m in run for op in node.ops)


def _group_label(members: Sequence[Node], level: str) -> tuple[str, str]:
    ops = collections.Counter(op for n in members for op in n.ops)
    top = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in ops.most_common(3))
    more = " …" if len(ops) > 3 else ""
    line, fn = short_source(members[0].source)
    where = "(no source line)" if line == "<unknown>" else f"{fn} · {line}" if level == "line" else fn
    n = len(members)
    label = f"{where}\n{top}{more}" + (f"\n({n} eqns)" if n > 1 else "")
    tip = "; ".join(f"{op}×{c}" for op, c in ops.most_common())
    return label, f"{where}: {tip}"


def collapse(graph: SplitGraph, level: str) -> SplitGraph:
    """Merge runs of consecutive eqn nodes of one kind and one source line (or function).

    ``level`` is ``"line"`` or ``"function"`` (``"eqn"`` returns ``graph``).
    Values (inputs, residuals, outputs, ...) stay one node each. Edges are
    mapped onto the merged nodes; those inside a merged node disappear.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(jnp.cos(x)).sum()).lower(jnp.ones(3))
        >>> g = collapse(split_graph(low, group_by="eqn"), "function")
        >>> [n.label.split("\\n")[0] for n in g.of_kind("forward")]
        ['<lambda>']
    """
    if level == "eqn":
        return graph
    if level not in GROUP_LEVELS:
        raise ValueError(f"group_by must be one of {GROUP_LEVELS} or 'auto', got {level!r}")
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    for i, run in enumerate(_runs(graph, level)):
        first = run[0]
        if _group_key(first, level) is None:
            nodes.append(first)
            continue
        gid = f"g{i}"
        rename.update((n.id, gid) for n in run)
        label, tip = _group_label(run, level)
        nodes.append(Node(gid, first.kind, label, tip, first.source, tuple(op for n in run for op in n.ops),
                          count=len(run)))
    return _merge_saved(_with_nodes(graph, nodes, rename, level))


def _with_nodes(graph: SplitGraph, nodes: Sequence[Node], rename: dict[str, str], level: str) -> SplitGraph:
    """``graph`` with new nodes; edges follow ``rename``, those inside a merged node vanish."""
    edges = {(rename.get(a, a), rename.get(b, b)): None for a, b in graph.edges}
    return SplitGraph(tuple(nodes), tuple(e for e in edges if e[0] != e[1]), level, graph.num_eqns)


def _merge_saved(graph: SplitGraph) -> SplitGraph:
    """One saved node per producing group node: the residuals a merged eqn node hands over.

    Saved inputs stay separate (each is a different argument).
    """
    by_id = {n.id: n for n in graph.nodes}
    producer = {b: a for a, b in graph.edges if by_id[b].kind == "saved" and by_id[a].kind in EQN_KINDS}
    members: dict[str, list[Node]] = {}
    for n in graph.of_kind("saved"):
        if n.id in producer:
            members.setdefault(producer[n.id], []).append(n)
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    for n in graph.nodes:
        group = members.get(producer.get(n.id, ""), [])
        if len(group) < 2:
            nodes.append(n)
            continue
        rename[n.id] = group[0].id
        if group[0] is n:
            total = sum(m.nbytes for m in group)
            where = by_id[producer[n.id]].label.split("\n")[0]
            nodes.append(Node(n.id, "saved", f"saved: {len(group)} values of\n{where}\n{format_bytes(total)}",
                              "\n".join(m.tooltip for m in group), n.source, nbytes=total, count=len(group)))
    return _with_nodes(graph, nodes, rename, graph.group_by)


def split_graph(lowered: Any, *, max_nodes: int = 80, group_by: str = "auto") -> SplitGraph:
    """The :class:`SplitGraph` of ``aot_fn.lower(...)``'s forward/backward split.

    Args:
      lowered: an :class:`jaxaot.AOTLowered` (also a ``ModuleLowered`` or a bare
        :class:`jaxaot.Partition`, which lacks argument names).
      max_nodes: with ``group_by="auto"``, the finest grouping whose graph has at
        most this many nodes is used (the coarsest if none fits).
      group_by: ``"eqn"``, ``"line"``, ``"function"`` or ``"auto"``.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: (x * x).sum()).lower(jnp.ones(3))
        >>> g = split_graph(low)
        >>> g.group_by, [n.label for n in g.of_kind("saved")]
        ('eqn', ['saved: arg[0]\\nf32[3] · 12 B'])
    """
    graph = _eqn_graph(lowered)
    if group_by != "auto":
        return collapse(graph, group_by)
    for level in GROUP_LEVELS:
        candidate = collapse(graph, level)
        if len(candidate.nodes) <= max_nodes:
            return candidate
    return candidate


# --------------------------------------------------------------------------- Graphviz
def _dot_label(text: str) -> str:
    # Graphviz record/escape syntax treats backslashes specially; "\l" etc. must not leak in.
    return text.replace("\\", "\\\\")


def _legend_html() -> str:
    """A Graphviz HTML-like label: one coloured cell per node kind."""
    cells = "".join(
        f'<TD BGCOLOR="{STYLES[k].fill}">{html.escape(STYLES[k].legend)}</TD>'
        for k in LEGEND_KINDS
    )
    return f'<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="4"><TR>{cells}</TR></TABLE>>'


def to_digraph(graph: SplitGraph, *, title: str = "") -> Any:
    """A ``graphviz.Digraph`` of ``graph``: forward cluster, residuals, backward cluster, legend.

    Each node carries its kind as its SVG ``class`` (``class="node saved"``) and
    its :data:`STYLES` colour. Needs the ``graphviz`` Python package, not ``dot``.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> src = to_digraph(split_graph(low)).source
        >>> STYLES["saved"].fill in src and "cluster_forward" in src
        True
    """
    import graphviz

    g = graphviz.Digraph("split", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "fontsize": "11",
                                              "label": title, "labelloc": "t", "nodesep": "0.15",
                                              "ranksep": "0.3"},
                         node_attr={"fontname": "Helvetica", "fontsize": "10", "margin": "0.06,0.03"},
                         edge_attr={"color": "#777777", "arrowsize": "0.6"})
    g.node("legend", label=_legend_html(), shape="plaintext", **{"class": "legend"})

    def add(sub: Any, n: Node) -> None:
        s = STYLES[n.kind]
        sub.node(n.id, label=_dot_label(n.label), tooltip=_dot_label(n.tooltip or n.label), shape=s.shape,
                 style=s.style, fillcolor=s.fill, **{"class": n.kind})

    for name, kinds, label in (("cluster_forward", FORWARD_SIDE, "forward"),
                               ("cluster_backward", BACKWARD_SIDE, "backward")):
        with g.subgraph(name=name) as sub:
            sub.attr(label=label, style="dashed", color="#999999", fontcolor="#555555")
            for n in graph.nodes:
                if n.kind in kinds:
                    add(sub, n)
    with g.subgraph(name="residuals") as sub:
        sub.attr(rank="same")  # one row: the boundary the values cross
        for n in graph.of_kind("saved"):
            add(sub, n)
    for a, b in graph.edges:
        g.edge(a, b)
    return g


def layout_available() -> bool:
    """Whether the ``graphviz`` package and Graphviz's ``dot`` binary are both present.

    Example:
        >>> isinstance(layout_available(), bool)
        True
    """
    return not _why_no_layout()


def _why_no_layout() -> str:
    """Why no layout engine can run, or ``""`` if one can."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return "the graphviz Python package is not installed (pip install graphviz)"
    if shutil.which("dot") is None:
        return "Graphviz's dot was not found (install the Debian/Ubuntu package graphviz)"
    return ""


def _svg(graph: SplitGraph, title: str) -> tuple[str | None, str]:
    """``(svg, "")``, or ``(None, why)`` when no layout engine could run."""
    if not layout_available():
        return None, _why_no_layout()
    import graphviz

    try:
        return to_digraph(graph, title=title).pipe(format="svg", encoding="utf-8"), ""
    except (graphviz.ExecutableNotFound, graphviz.CalledProcessError, OSError) as e:
        return None, f"Graphviz failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _inline_svg(svg: str) -> str:
    # The XML prolog and DOCTYPE are not allowed inside HTML.
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


# --------------------------------------------------------------------------- HTML
def _summary(part: Any) -> str:
    recomputed = len(part.recomputed)
    return (f"{len(part.residuals)} saved values, {format_bytes(part.saved_bytes)} "
            f"({part.saved_bytes} bytes); {recomputed} eqn{'s' if recomputed != 1 else ''} recomputed "
            "in the backward")


def _legend_div() -> str:
    spans = "".join(
        f'<span style="background:{STYLES[k].fill};padding:1px 6px;margin-right:6px;border:1px solid #999">'
        f"{html.escape(STYLES[k].legend)}</span>"
        for k in LEGEND_KINDS
    )
    return f'<div class="jaxaot-legend" style="margin:4px 0">{spans}</div>'


def _text(s: str) -> str:
    # Element text, not an attribute: quotes stay readable (arg[0]['w']).
    return html.escape(s, quote=False)


def _source_html(source: str) -> str:
    """``file.py:12 (fn)`` with the full path as hover text."""
    line, fn = short_source(source)
    if line == "<unknown>":
        return "(no source line)"
    return f'<span title="{html.escape(source)}">{_text(line)} ({_text(fn)})</span>'


def _recomputed_rows(part: Any) -> list[str]:
    bwd = C.jaxpr_of(part.backward)
    deps = backward_is_cotangent_dependent(part.backward, len(part.cotangent_outputs))
    rows = []
    for eqn, dep in zip(bwd.eqns, deps):
        if not dep:
            outs = ", ".join(aval_str(v.aval) for v in eqn.outvars)
            rows.append(f"<li><code>{_text(str(eqn.primitive))}</code> → {_text(outs)} "
                        f"<small>@ {_source_html(C.eqn_source(eqn))}</small></li>")
    return rows


def residual_table_html(lowered: Any) -> str:
    """The residual table as an HTML fragment: value, shape, dtype, bytes, producer, source line.

    One row per saved value (``lowered.saved``), a total row, and the list of
    eqns the backward recomputes (collapsed, in a ``<details>``).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.tanh(x).sum()).lower(jnp.ones(3))
        >>> t = residual_table_html(low)
        >>> "tanh" in t and "f32[3]" not in t and "<td>[3]</td>" in t
        True
    """
    part, joint = _unwrap(lowered)
    in_names = _names(joint.in_tree if joint is not None else None, "input", len(C.jaxpr_of(part.forward).invars))
    head = "".join(f"<th>{h}</th>" for h in ("#", "value", "shape", "dtype", "bytes", "producer", "source line"))
    rows = []
    for i, r in enumerate(part.residuals):
        value = f"{r.source}[{r.index}]"
        if r.source == "input" and r.index < len(in_names):
            value += f" {in_names[r.index]}"
        cells = (str(i), _text(value), _text(str(list(r.aval.shape))), _text(str(r.aval.dtype)),
                 f'<span title="{r.nbytes} bytes">{format_bytes(r.nbytes)}</span>', _text(r.producer),
                 _source_html(r.source_line) if r.source_line else "")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    rows.append(f'<tr style="font-weight:bold"><td></td><td>total</td><td></td><td></td>'
                f'<td title="{part.saved_bytes} bytes">{format_bytes(part.saved_bytes)}</td><td></td><td></td></tr>')
    recomputed = _recomputed_rows(part)
    details = (f"<details><summary>{len(recomputed)} eqns recomputed in the backward</summary>"
               f"<ul>{''.join(recomputed)}</ul></details>") if recomputed else ""
    return (f'<table class="jaxaot-residuals" style="border-collapse:collapse;font-size:90%">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{details}")


def to_html(lowered: Any, *, max_nodes: int = 80, group_by: str = "auto") -> str:
    """An HTML fragment: summary, legend, the graph as inline SVG, the residual table.

    What ``AOTLowered._repr_html_`` shows in Jupyter. Without Graphviz the
    graph is replaced by a note saying why.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> frag = to_html(low)
        >>> "jaxaot-residuals" in frag and ("<svg" in frag or "Graphviz" in frag)
        True
    """
    part, _ = _unwrap(lowered)
    graph = split_graph(lowered, max_nodes=max_nodes, group_by=group_by)
    svg, why = _svg(graph, "")
    if svg is not None:
        grouped = "" if graph.group_by == "eqn" else (
            f"<p><small>{graph.num_eqns} eqns, shown grouped by source {graph.group_by}; "
            "hover a node for its operations.</small></p>")
        picture = f'<div style="max-width:100%;overflow:auto">{_inline_svg(svg)}</div>{grouped}'
    else:
        picture = f'<p class="jaxaot-note"><em>No graph: {html.escape(why)}. Residual table only.</em></p>'
    return (f'<div class="jaxaot-split"><p><b>jaxaot split</b>: {html.escape(_summary(part))}</p>'
            f"{_legend_div()}{picture}{residual_table_html(lowered)}</div>")


def _page(body: str, title: str) -> str:
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            '<style>body{font-family:sans-serif} td,th{border:1px solid #ccc;padding:2px 6px}</style>'
            f"</head><body>{body}</body></html>\n")


# --------------------------------------------------------------------------- render
def render(lowered: Any, path: str | Path | None = None, format: str = "svg", *, max_nodes: int = 80,
           group_by: str = "auto", title: str = "") -> str | Path:
    """Render the split of ``aot_fn.lower(...)``; return the text, or write it to ``path``.

    Args:
      lowered: an :class:`jaxaot.AOTLowered`.
      path: where to write; ``None`` returns the text instead.
      format: ``"svg"`` (the graph), ``"html"`` (a standalone page: graph,
        legend and residual table) or ``"dot"`` (Graphviz source; needs no binary).
      max_nodes, group_by: see :func:`split_graph`.
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
    if format not in ("svg", "html", "dot"):
        raise ValueError(f"format must be 'svg', 'html' or 'dot', got {format!r}")
    graph = split_graph(lowered, max_nodes=max_nodes, group_by=group_by)
    text, suffix = None, f".{format}"
    if format == "dot":
        text = to_digraph(graph, title=title).source
    elif format == "svg":
        text, _ = _svg(graph, title)
    if text is None:  # html asked for, or svg without a layout engine
        text, suffix = _page(to_html(lowered, max_nodes=max_nodes, group_by=group_by), title or "jaxaot split"), ".html"
    if path is None:
        return text
    path = Path(path)
    if path.suffix != suffix:
        if format == "svg":
            warnings.warn(f"no Graphviz layout engine: writing the residual table to {path.with_suffix(suffix)} "
                          f"instead of an SVG graph to {path}", stacklevel=2)
        path = path.with_suffix(suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- budget sweep
def plot_budget_sweep(results: Iterable[Sequence[float]], *, reference: Sequence[float] | None = None,
                      label: str = "min-cut", reference_label: str = "reference", title: str = "") -> Any:
    """Saved bytes and step time against ``memory_budget``: a matplotlib Figure with two axes.

    Args:
      results: ``(budget, saved_bytes, step_time_seconds)`` rows, any order.
      reference: optional ``(saved_bytes, step_time_seconds)`` of a baseline
        (say the default partition), drawn as a dashed line on each axis.
      label, reference_label: legend entries of the sweep and of the baseline.
      title: the figure's title.

    The Figure is built without pyplot (no global state); in Jupyter,
    ``%matplotlib inline`` (or importing pyplot) makes it display itself.

    Example:
        >>> fig = plot_budget_sweep([(0.0, 4096, 0.002), (0.5, 8192, 0.0015), (1.0, 16384, 0.0012)],
        ...                         reference=(20000, 0.0011), reference_label="default partition")
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['saved (KiB)', 'step time (ms)']
    """
    from matplotlib.figure import Figure

    rows = sorted((float(b), float(s), float(t)) for b, s, t in results)
    if not rows:
        raise ValueError("plot_budget_sweep needs at least one (budget, saved_bytes, step_time) row")
    budgets, saved, times = (list(col) for col in zip(*rows))
    scale, unit = _byte_scale(max(saved + ([reference[0]] if reference else [])))
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax_mem, ax_time = fig.subplots(1, 2)
    ax_mem.plot(budgets, [s / scale for s in saved], "o-", color="#31a354", label=label)
    ax_time.plot(budgets, [t * 1e3 for t in times], "o-", color="#3182bd", label=label)
    if reference is not None:
        ax_mem.axhline(reference[0] / scale, ls="--", color="#777777", label=reference_label)
        ax_time.axhline(reference[1] * 1e3, ls="--", color="#777777", label=reference_label)
    for ax, ylabel in ((ax_mem, f"saved ({unit})"), (ax_time, "step time (ms)")):
        ax.set_xlabel("memory_budget")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if reference is not None:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


__all__ = [
    "Node",
    "STYLES",
    "SplitGraph",
    "Style",
    "aval_str",
    "backward_is_cotangent_dependent",
    "collapse",
    "format_bytes",
    "layout_available",
    "plot_budget_sweep",
    "render",
    "residual_table_html",
    "short_source",
    "split_graph",
    "to_digraph",
    "to_html",
]
