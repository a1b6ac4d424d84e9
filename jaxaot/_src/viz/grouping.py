"""Collapsing a large split graph: one node per source line or per function instead of per eqn.

Runs of consecutive eqn nodes of one kind and one source line (or function)
merge into one node; the saved values one merged node hands to the backward
merge too. Values (inputs, outputs, cotangents, gradients, saved inputs) stay
one node each. Where even that is too many nodes, :func:`bound` merges
consecutive nodes of one kind, values included, into blocks that fit.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.viz import split_graph
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(jnp.cos(x)).sum()).lower(jnp.ones(3))
    >>> g = collapse(split_graph(low, group_by="eqn"), "function")
    >>> [n.label.split("\\n")[0] for n in g.of_kind("forward")]
    ['<lambda>']
"""

from __future__ import annotations

import collections
from typing import Sequence

from jaxaot._src.units import format_bytes
from jaxaot._src.viz.argument_checks import check_choice, check_graph
from jaxaot._src.viz.formatting import short_source
from jaxaot._src.viz.model import EQN_KINDS, GROUP_LEVELS, Node, SplitGraph


def collapse(graph: SplitGraph, level: str) -> SplitGraph:
    """Merge runs of consecutive eqn nodes of one kind and one source line (or function).

    ``level`` is ``"line"`` or ``"function"`` (``"eqn"`` returns ``graph``).
    Values (inputs, residuals, outputs, ...) stay one node each. Edges are
    mapped onto the merged nodes; those inside a merged node disappear.
    """
    check_graph(graph, "collapse")
    if check_choice(level, "level", GROUP_LEVELS, "collapse") == "eqn":
        return graph
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


def bound(graph: SplitGraph, max_nodes: int) -> SplitGraph:
    """``graph`` merged further until it has at most ``max_nodes`` nodes: its ``group_by`` is ``"block"``.

    For programs so long that one node per function is still too many (and Graphviz's ``dot`` would take
    minutes to lay them out): consecutive nodes of one kind merge ``k`` at a time, ``k`` the smallest that
    fits; values merge too (``arg[0] … arg[24]``). Where even one node per run of a kind is too many (the
    backward alternates with recomputation), all nodes of a kind merge into one: the graph then has one node
    per kind, which ``max_nodes`` below that number cannot shrink. ``graph`` itself is returned if it fits.
    """
    if len(graph.nodes) <= max_nodes:
        return graph
    runs: list[list[Node]] = []
    for n in graph.nodes:
        if runs and runs[-1][0].kind == n.kind:
            runs[-1].append(n)
        else:
            runs.append([n])
    if len(runs) > max_nodes:  # one node per kind, in order of first appearance
        by_kind: dict[str, list[Node]] = {}
        for n in graph.nodes:
            by_kind.setdefault(n.kind, []).append(n)
        chunks = list(by_kind.values())
    else:
        k = 2
        while sum(-(-len(run) // k) for run in runs) > max_nodes:
            k += max(1, k // 4)
        chunks = [run[i:i + k] for run in runs for i in range(0, len(run), k)]
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    for i, chunk in enumerate(chunks):
        if len(chunk) == 1:
            nodes.append(chunk[0])
            continue
        rename.update((n.id, f"k{i}") for n in chunk)
        nodes.append(_block_node(f"k{i}", chunk))
    return _with_nodes(graph, nodes, rename, "block")


def _block_node(nid: str, members: Sequence[Node]) -> Node:
    """One node standing for ``members`` (consecutive nodes of one kind): what they are, and how many."""
    first, last, kind = members[0], members[-1], members[0].kind
    count = sum(n.count for n in members)
    if kind in EQN_KINDS:
        ops = collections.Counter(op for n in members for op in n.ops)
        top = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in ops.most_common(3))
        fns = dict.fromkeys(short_source(n.source)[1] for n in members)
        where = " … ".join([next(iter(fns)), list(fns)[-1]] if len(fns) > 1 else list(fns))
        label = f"{where}\n{top}{' …' if len(ops) > 3 else ''}\n({count} eqns)"
        tip = f"{len(fns)} functions: " + "; ".join(f"{op}×{c}" for op, c in ops.most_common())
        return Node(nid, kind, label, tip, first.source, tuple(op for n in members for op in n.ops), count=count)
    names = [n.label.split("\n")[0] for n in (first, last)]
    nbytes = sum(n.nbytes for n in members)
    label = f"{names[0]} …\n{names[1]}\n({count} values{', ' + format_bytes(nbytes) if nbytes else ''})"
    tip = "\n".join(n.tooltip or n.label for n in members)
    return Node(nid, kind, label, tip, first.source, nbytes=nbytes, count=count,
                argument=all(n.argument for n in members))
