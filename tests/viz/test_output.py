"""jaxaot._src.viz.render: formats, files, and the HTML page written instead of an SVG without dot."""

from pathlib import Path

import pytest

from jaxaot import viz
from jaxaot.errors import InvalidValueError


def test_bad_format(small):
    with pytest.raises(ValueError, match="format"):
        viz.render(small, format="pdf")


def test_fallback_without_dot(small, no_dot, tmp_path):
    pytest.importorskip("graphviz")  # without the package the message names the package, not dot
    frag = viz.to_html(small)
    assert "<svg" in frag and "built-in layout" in frag and "dot was not found" in frag
    assert "jaxaot-residuals" in frag
    with pytest.warns(UserWarning, match="built-in layout: Graphviz's dot was not found"):
        svg = viz.render(small)  # svg asked for: the built-in layout's
    assert svg.startswith("<?xml") and 'class="node saved"' in svg
    with pytest.warns(UserWarning, match="built-in layout"):
        out = viz.render(small, tmp_path / "split.svg")
    assert out == tmp_path / "split.svg" and out.read_text() == svg
    page = viz.render(small, tmp_path / "split.html", format="html")
    assert "<svg" in page.read_text() and "jaxaot-residuals" in page.read_text()
    assert viz.render(small, format="dot").startswith("digraph")  # still available


def test_a_path_keeps_its_name_and_gets_the_format_suffix_where_it_lacks_it(small, tmp_path):
    pytest.importorskip("graphviz")  # the dot source is written by the graphviz package
    assert viz.render(small, tmp_path / "split_budget_0.5", format="dot") == tmp_path / "split_budget_0.5.dot"
    assert viz.render(small, tmp_path / "split.DOT", format="dot") == tmp_path / "split.DOT"
    assert viz.render(small, tmp_path / "a.svg", format="dot") == tmp_path / "a.svg.dot"
    assert (tmp_path / "split_budget_0.5.dot").read_text().startswith("digraph split")


def test_a_folder_gets_a_file_named_split_inside_it(small, tmp_path):
    pytest.importorskip("graphviz")  # the dot source is written by the graphviz package
    folder = tmp_path / "pictures"
    folder.mkdir()
    for given in (folder, str(folder), str(tmp_path / "made") + "/"):  # an existing folder, or a path ending in /
        out = viz.render(small, given, format="dot")
        assert out.name == "split.dot" and out.parent == Path(given) and out.read_text().startswith("digraph")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made", "pictures"]  # nothing written beside them
    (tmp_path / "taken.dot").mkdir()  # the file name render would write is a folder: said, nothing written
    with pytest.raises(InvalidValueError, match="is a folder"):
        viz.render(small, tmp_path / "taken", format="dot")
    assert not list((tmp_path / "taken.dot").iterdir())
