"""jaxaot._src.viz's Graphviz layout: DOT source, SVG node classes, and the fallbacks without Graphviz."""

import re
import shutil
import sys

import pytest

from jaxaot import viz


def test_dot_source_colours_and_classes(small):
    pytest.importorskip("graphviz")  # the Python package builds the dot source
    src = viz.render(small, format="dot")  # no binary needed
    assert src.startswith("digraph split") and "cluster_forward" in src and "cluster_backward" in src
    for kind in ("input", "forward", "saved", "backward", "output", "cotangent", "grad"):
        lines = [ln for ln in src.splitlines() if f"class={kind} " in ln or ln.rstrip().endswith(f"class={kind}]")]
        assert lines, kind
        assert all(viz.STYLES[kind].fill in ln for ln in lines), kind
    assert "legend" in src and viz.STYLES["recomputed"].fill in src  # in the legend even when unused


@pytest.mark.usefixtures("needs_dot")
def test_svg_has_node_classes(remat, tmp_path):
    svg = viz.render(remat)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    classes = set(re.findall(r'class="node ([a-z]+)"', svg))
    assert {"input", "forward", "saved", "recomputed", "backward", "grad"} <= classes
    assert viz.STYLES["recomputed"].fill in svg and viz.STYLES["saved"].fill in svg
    out = viz.render(remat, tmp_path / "split.svg")
    assert out == tmp_path / "split.svg" and out.read_text().count("<svg") == 1


def test_fallback_when_dot_fails(small, monkeypatch, tmp_path):
    pytest.importorskip("graphviz")
    monkeypatch.setattr(shutil, "which", lambda name: str(tmp_path / name))  # dot looks installed ...
    frag = viz.to_html(small)  # ... but cannot run: drawn with the built-in layout, which says why
    assert "<svg" in frag and "Graphviz failed: FileNotFoundError" in frag and "built-in layout" in frag
    assert "jaxaot-residuals" in frag
    with pytest.warns(UserWarning, match="Graphviz failed"):  # installed yet failing: the page warns too
        viz.render(small, format="html")


def test_fallback_without_graphviz_package(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    assert not viz.layout_available()
    frag = viz.to_html(small)
    assert "<svg" in frag and "graphviz Python package is not installed" in frag


@pytest.mark.usefixtures("needs_dot")
def test_dot_draws_a_merged_node_s_long_tooltip_and_a_title_in_angle_brackets():
    """``dot`` refuses a quoted string over 16384 characters (many values merged into one node's tooltip) and reads
    ``<...>`` as an HTML-like label: the tooltip is cut and the title drawn as written, not laid out by the fallback."""
    import warnings

    import jax.numpy as jnp
    import jaxaot

    def many(x):
        for _ in range(300):
            x = jnp.sin(x)
        return x.sum()

    low = jaxaot.aot_function(many).lower(jnp.ones(4))
    assert max(len(n.tooltip) for n in viz.split_graph(low).nodes) > 16384
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Graphviz failure warns
        svg = viz.render(low, title="<lambda> & co")
    assert "&lt;lambda&gt; &amp; co" in svg and "more" in svg
