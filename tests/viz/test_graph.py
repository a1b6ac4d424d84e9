"""jaxaot._src.viz.split_graph: nodes, edges, recomputed eqns, collapsing large graphs."""

import types

import pytest

from jaxaot._src import viz


def test_node_kinds_for_known_function(small):
    g = viz.split_graph(small)
    assert g.group_by == "eqn"
    assert [n.label for n in g.of_kind("input")] == ["arg[0]", "arg[1]"]
    assert {"dot_general", "tanh", "reduce_sum"} <= {n.ops[0] for n in g.of_kind("forward")}
    assert len(g.of_kind("saved")) == len(small.saved)
    assert {"saved: arg[0]", "saved: arg[1]"} <= {n.label.split("\n")[0] for n in g.of_kind("saved")}
    assert g.of_kind("output")[0].label == "output"
    assert [n.label for n in g.of_kind("cotangent")] == ["cotangent of output"]
    assert [n.label for n in g.of_kind("grad")] == ["gradient of arg[0]", "gradient of arg[1]"]
    assert g.of_kind("backward") and not g.of_kind("recomputed")
    assert g.num_eqns == len(small.forward.jaxpr.eqns) + len(small.backward.jaxpr.eqns)


def test_edges_connect_existing_nodes_and_saved_values_cross(small):
    g = viz.split_graph(small)
    kind = {n.id: n.kind for n in g.nodes}
    assert all(a in kind and b in kind for a, b in g.edges)
    for n in g.of_kind("saved"):
        assert any(b == n.id and kind[a] in ("input", "forward") for a, b in g.edges)  # made by the forward
        assert any(a == n.id and kind[b] in ("backward", "recomputed", "grad") for a, b in g.edges)  # read by the backward


def test_recomputed_eqns_are_marked(remat):
    g = viz.split_graph(remat)
    assert [r.source for r in remat.saved] == ["input"]
    ops = {op for n in g.of_kind("recomputed") for op in n.ops}
    assert {"sin", "exp"} <= ops
    deps = viz.backward_is_cotangent_dependent(remat.backward, 1)
    assert deps.count(False) == len(remat.recomputed)


def test_large_graph_is_collapsed(block):
    eqn = viz.split_graph(block, group_by="eqn")
    auto = viz.split_graph(block, max_nodes=80)
    assert len(eqn.nodes) > 80 and auto.group_by in ("line", "function") and len(auto.nodes) <= 80
    # Collapsing keeps every value node and merges only eqns (and saved values per producer).
    assert sum(n.count for n in auto.of_kind("saved")) == len(block.saved)
    assert sum(n.count for k in viz.EQN_KINDS for n in auto.of_kind(k)) == eqn.num_eqns
    assert len(auto.of_kind("input")) == len(eqn.of_kind("input"))
    assert all("(" in n.label or "\n" in n.label for n in auto.of_kind("forward"))
    # The two layer norms stay two groups each (runs, not all eqns of a line).
    ln_rows = [n for n in viz.split_graph(block, group_by="function").of_kind("forward")
               if n.label.startswith("_layer_norm")]
    assert len(ln_rows) >= 2


def test_collapse_levels_and_bad_options(block, small):
    sizes = [len(viz.split_graph(block, group_by=lvl).nodes) for lvl in viz.GROUP_LEVELS]
    assert sizes == sorted(sizes, reverse=True)
    with pytest.raises(ValueError, match="group_by"):
        viz.split_graph(small, group_by="module")
    with pytest.raises(TypeError, match="AOTLowered"):
        viz.split_graph(object())


def test_bare_partition_has_positional_names(small):
    g = viz.split_graph(small.partition)
    assert [n.label for n in g.of_kind("input")] == ["input[0]", "input[1]"]


def test_wrappers_with_a_lowered_attribute(small):
    # aot_module's ModuleLowered holds the AOTLowered as .lowered.
    wrapped = types.SimpleNamespace(lowered=small, meta=None)
    assert viz.split_graph(wrapped) == viz.split_graph(small)
