"""``jaxaot demo``: the report, its timings' spread, the gradient check, and what it writes where."""

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot import viz
from jaxaot._src.cli import demo as demo_mod
from jaxaot._src.cli import demo_models as examples
from jaxaot._src.cli import main as cli

SMALL = ["--width", "16", "--depth", "2", "--batch", "4", "--rounds", "3"]


def test_demo_default_writes_to_a_fresh_temporary_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with jaxaot.config.override(quiet=True):
        assert cli.main(["demo", *SMALL]) == 0
    captured = capsys.readouterr()
    assert list(tmp_path.iterdir()) == []  # nothing in the current folder
    assert " ..." not in captured.err and "done (" not in captured.err  # no progress under config.quiet
    out = Path(re.search(r"writing to (\S+) \(a new temporary folder", captured.err)[1])
    try:
        assert out.is_dir() and out.name.startswith("jaxaot-demo-")
        assert (out / "split.html").exists() and (out / "artifact" / "manifest.json").exists()
        assert str(out / "split.html") in captured.out
        params, data = examples.mlp_init(jax.random.key(0), width=16, depth=2, batch=4)
        got = jax.grad(jaxaot.export.load(out / "artifact"))(params, data)
        want = jax.grad(examples.mlp_loss)(params, data)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_demo_report_gives_median_and_spread_and_checks_gradients(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as if Graphviz's dot were not installed
    with jaxaot.config.override(quiet=False):
        assert cli.main(["demo", *SMALL, "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "step ms: median (min-max)" in captured.out and "step times over 3 rounds" in captured.out
    for label in ("jaxaot (default partition)", "jaxaot (min-cut partition)", "jax.fwd_and_bwd"):
        row = next(line for line in captured.out.splitlines() if line.startswith(label))
        lo, hi = map(float, re.search(r"\(([\d.]+)-([\d.]+)\)", row).groups())
        med = float(re.search(r"KiB\s+([\d.]+) \(", row)[1])
        assert lo <= med <= hi, row
        assert re.search(r"[\d.]+x \([\d.]+x-[\d.]+x\)$", row), row
    assert re.search(r"gradients match jax.value_and_grad: max abs difference (\S+)", captured.out)
    err = float(re.search(r"max abs difference (\S+)", captured.out)[1])
    assert err < 1e-5
    pytest.importorskip("graphviz")  # without the package the line names the package, not dot
    notes = [line for line in captured.err.splitlines() if "built-in layout" in line]
    assert notes == ["jaxaot demo: drawing the split with jaxaot's built-in layout: Graphviz's dot was not found "
                     "(for Graphviz's picture: apt-get install graphviz, or brew install graphviz)"]
    assert "  tracing, partitioning and compiling with jaxaot: done (" in captured.err
    page = (tmp_path / "split.html").read_text()
    assert "jaxaot-residuals" in page and "<svg" in page
    svg = (tmp_path / "split.svg").read_text()
    nodes = [g for g in ET.fromstring(svg.encode()).iter("{http://www.w3.org/2000/svg}g")
             if g.get("class", "").startswith("node ")]
    assert nodes and "drawn with jaxaot's built-in layout" in svg
    assert {viz.STYLES["forward"].fill, viz.STYLES["saved"].fill, viz.STYLES["backward"].fill} <= set(
        e.get("fill") for g in nodes for e in g)


def test_time_rounds_takes_turns():
    calls = []
    ms = demo_mod.time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2, calls=1)
    assert calls == ["a", "a", "b", "b", "a", "b", "a", "b"]  # warm-up, then one call each per round
    assert len(ms["a"]) == len(ms["b"]) == 2


@pytest.mark.parametrize("values, want", [([2.0], "2.00 (2.00-2.00)"), ([4.0, 1.0, 3.0, 2.0], "2.50 (1.00-4.00)")])
def test_spread(values, want):
    assert demo_mod._spread(values, "{:.2f}") == want
