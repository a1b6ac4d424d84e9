"""jaxaot.viz: the split graph, its Graphviz rendering and fallback, the residual table, the sweep plot."""

import functools
import re
import types

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.cli import main as cli
from jaxaot.cli import demo_models as examples
from jaxaot.viz import drawing as viz

needs_dot = pytest.mark.skipif(not viz.layout_available(), reason="Graphviz's dot is not installed")


def tanh_loss(w, x):
    return jnp.tanh(x @ w).sum()


@pytest.fixture(scope="module")
def small():
    """A known function under the default partition: it saves w, x and a tanh-derived value."""
    return jaxaot.aot_function(tanh_loss).lower(jnp.ones((3, 2)), jnp.ones((4, 3)))


@pytest.fixture(scope="module")
def remat():
    """min-cut at budget 0 saves only the input and recomputes sin/exp in the backward."""
    f = jaxaot.aot_function(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) ** 2),
                            partition_fn=functools.partial(jaxaot.min_cut_rematerialization_partition,
                                                           memory_budget=0.0))
    return f.lower(jnp.ones(100))


@pytest.fixture(scope="module")
def block():
    p = examples.block_init(jax.random.key(0), width=32, heads=2, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (2, 8, 32))
    # compilers.nop: the picture needs the programs, not XLA executables (saves seconds).
    f = jaxaot.aot_function(lambda p, x: jnp.mean(examples.block_apply(p, x, heads=2) ** 2),
                            fw_compiler=jaxaot.compilers.nop)
    return f.lower(p, x)


@pytest.fixture
def no_dot(monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    assert not viz.layout_available()


# --------------------------------------------------------------------------- the graph as data
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
    with pytest.raises(ValueError, match="format"):
        viz.render(small, format="pdf")
    with pytest.raises(TypeError, match="AOTLowered"):
        viz.split_graph(object())


def test_bare_partition_has_positional_names(small):
    g = viz.split_graph(small.partition)
    assert [n.label for n in g.of_kind("input")] == ["input[0]", "input[1]"]


def test_wrappers_with_a_lowered_attribute(small):
    # aot_module's ModuleLowered holds the AOTLowered as .lowered.
    wrapped = types.SimpleNamespace(lowered=small, meta=None)
    assert viz.split_graph(wrapped) == viz.split_graph(small)


# --------------------------------------------------------------------------- Graphviz
def test_dot_source_colours_and_classes(small):
    pytest.importorskip("graphviz")  # the Python package builds the dot source
    src = viz.render(small, format="dot")  # no binary needed
    assert src.startswith("digraph split") and "cluster_forward" in src and "cluster_backward" in src
    for kind in ("input", "forward", "saved", "backward", "output", "cotangent", "grad"):
        lines = [ln for ln in src.splitlines() if f"class={kind} " in ln or ln.rstrip().endswith(f"class={kind}]")]
        assert lines, kind
        assert all(viz.STYLES[kind].fill in ln for ln in lines), kind
    assert "legend" in src and viz.STYLES["recomputed"].fill in src  # in the legend even when unused


@needs_dot
def test_svg_has_node_classes(remat, tmp_path):
    svg = viz.render(remat)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    classes = set(re.findall(r'class="node ([a-z]+)"', svg))
    assert {"input", "forward", "saved", "recomputed", "backward", "grad"} <= classes
    assert viz.STYLES["recomputed"].fill in svg and viz.STYLES["saved"].fill in svg
    out = viz.render(remat, tmp_path / "split.svg")
    assert out == tmp_path / "split.svg" and out.read_text().count("<svg") == 1


@needs_dot
def test_html_embeds_svg(small):
    frag = viz.to_html(small)
    assert "<svg" in frag and "<?xml" not in frag and "jaxaot-residuals" in frag


def test_fallback_without_dot(small, no_dot, tmp_path):
    pytest.importorskip("graphviz")  # without the package the message names the package, not dot
    frag = viz.to_html(small)
    assert "<svg" not in frag and "No graph" in frag and "dot was not found" in frag
    assert "jaxaot-residuals" in frag
    page = viz.render(small)  # svg asked for: the page with the table instead
    assert page.startswith("<!doctype html>") and "No graph" in page
    with pytest.warns(UserWarning, match="no Graphviz layout engine"):
        out = viz.render(small, tmp_path / "split.svg")
    assert out == tmp_path / "split.html" and "jaxaot-residuals" in out.read_text()
    assert viz.render(small, format="dot").startswith("digraph")  # still available


def test_fallback_when_dot_fails(small, monkeypatch):
    graphviz = pytest.importorskip("graphviz")
    monkeypatch.setattr(viz, "layout_available", lambda: True)

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(["dot", "-Tsvg"])

    monkeypatch.setattr(graphviz.Digraph, "pipe", missing)
    frag = viz.to_html(small)
    assert "<svg" not in frag and "ExecutableNotFound" in frag and "jaxaot-residuals" in frag


def test_fallback_without_graphviz_package(small, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "graphviz", None)
    assert not viz.layout_available()
    assert "graphviz Python package is not installed" in viz.to_html(small)


# --------------------------------------------------------------------------- table, repr, plot
def test_residual_table_lists_every_residual(block):
    table = viz.residual_table_html(block)
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1].split("</tbody>")[0])
    assert len(rows) == len(block.saved)
    for row, r in zip(rows, block.saved):
        assert f"{r.source}[{r.index}]" in row
        assert str(list(r.aval.shape)) in row and str(r.aval.dtype) in row
        assert f'title="{r.nbytes} bytes"' in row
        assert r.producer in row
        if r.source_line:
            assert viz.short_source(r.source_line)[0] in row
    assert f'title="{block.saved_bytes} bytes"' in table  # the total row
    assert "arg[0]['qkv']" in table  # inputs carry their pytree path


def test_recomputed_list_in_table(remat):
    table = viz.residual_table_html(remat)
    assert f"{len(remat.recomputed)} eqns recomputed in the backward" in table and "<code>sin</code>" in table


def test_repr_html(small, remat):
    for low in (small, remat):
        out = low._repr_html_()
        assert out.startswith('<div class="jaxaot-split">') and "jaxaot-residuals" in out
        assert f"{len(low.saved)} saved values" in out


def test_repr_html_without_dot(small, no_dot):
    assert "No graph" in small._repr_html_()


def test_plot_budget_sweep():
    rows = [(1.0, 16384, 0.0012), (0.0, 4096, 0.002), (0.5, 8192, 0.0015)]
    fig = viz.plot_budget_sweep(rows, title="sweep")
    assert len(fig.axes) == 2
    (mem_line,), (time_line,) = (ax.get_lines() for ax in fig.axes)
    assert list(mem_line.get_xdata()) == [0.0, 0.5, 1.0]  # sorted by budget
    assert list(mem_line.get_ydata()) == [4.0, 8.0, 16.0]  # KiB
    assert list(time_line.get_ydata()) == pytest.approx([2.0, 1.5, 1.2])  # ms
    with_ref = viz.plot_budget_sweep(rows, reference=(20000, 0.001))
    assert [len(ax.get_lines()) for ax in with_ref.axes] == [2, 2]
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_budget_sweep([])


def test_formatting_helpers():
    assert viz.format_bytes(100) == "100 B" and viz.format_bytes(2048) == "2.0 KiB"
    assert viz.short_source("/a/b/model.py:12:3 (f)") == ("model.py:12", "f")
    assert viz.aval_str(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)) == "bf16[2,3]"


# --------------------------------------------------------------------------- jaxaot demo --out
def test_demo_out_writes_rendered_split(tmp_path, capsys):
    assert cli.main(["demo", "--width", "16", "--depth", "2", "--batch", "4", "--out", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (tmp_path / "split.html").read_text()
    assert "jaxaot-residuals" in page
    assert (tmp_path / "split.svg").exists() == viz.layout_available()
