"""jaxaot.viz.render: formats, files, and the HTML page written instead of an SVG without dot."""

import pytest

from jaxaot import viz


def test_bad_format(small):
    with pytest.raises(ValueError, match="format"):
        viz.render(small, format="pdf")


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
