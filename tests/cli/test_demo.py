"""``jaxaot demo``: the report, its timings' spread, the gradient check, its JSON, and what it writes where
(and leaves behind when it fails)."""

import errno
import json
import os
import re
import tempfile
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot import viz
from jaxaot._src.cli import commands, demo
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


def test_demo_json_with_a_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXAOT_QUIET", "1")
    out = tmp_path / "new" / "demo"
    assert cli.main(["demo", *SMALL, "--budget", "0.5", "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)  # stdout holds the document alone
    assert doc["model"] == {"name": "gelu MLP", "width": 16, "depth": 2, "batch": 4} and doc["budget"] == "0.5"
    assert [p["name"] for p in doc["programs"]] == ["aot", "min_cut", "split", "fused"]
    assert doc["programs"][1]["label"] == "jaxaot (min-cut partition, --budget 0.5)"
    for p in doc["programs"]:
        assert p["step_ms"]["min"] <= p["step_ms"]["median"] <= p["step_ms"]["max"], p
        assert (p["residual_bytes"] is None) == (p["name"] == "fused"), p
    assert doc["max_abs_diff"] < 1e-5 and doc["predicted_peak"] is None  # a fraction: no peak to fit
    assert all(Path(f).exists() for f in doc["files"]) and (Path(doc["export"]) / "manifest.json").exists()


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """An empty folder as the temporary folders' parent and as the current folder: what a demo leaves shows."""
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.chdir(root)
    return root


@pytest.mark.parametrize("argv, msg", [
    (["--width", "0"], "--width must be at least 1, got 0"),
    (["--width", "999999999999"], "the demo's MLP at --width 999999999999 .* GiB of weights and activations"),
    (["--rounds", "-1"], "--rounds must be at least 1, got -1"),
    (["--budget", "1.5"], "--budget 1.5: memory_budget='1.5' is above 1.*Did you mean '1.5GB'"),
    (["--budget", "lots"], "--budget lots: memory_budget 'lots' is not a number"),
    (["--out", "afile/sub"], "--out afile/sub: .*afile is a file, not a folder"),
])
def test_bad_flags_leave_nothing_behind(temp_root, argv, msg, capsys):
    (temp_root / "afile").write_text("")
    assert cli.main(["demo", *argv]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"jaxaot demo: error: {msg}.*\n", err, flags=re.S), err
    assert [p.name for p in temp_root.iterdir()] == ["afile"]


@pytest.mark.parametrize("out", [None, "made/here"])
@pytest.mark.parametrize("failure", [RuntimeError("the demo broke"), KeyboardInterrupt()])
def test_a_failed_demo_removes_the_folders_it_made(temp_root, monkeypatch, out, failure):
    seen = []

    def failing_report(width, depth, batch, out_dir, **kwargs):
        Path(out_dir, "artifact").mkdir(parents=True)  # part-way through writing
        seen.append(Path(out_dir).resolve())
        raise failure

    monkeypatch.setattr(commands, "demo_report", failing_report)
    with pytest.raises(type(failure)):
        cli.main(["demo", *SMALL, *(["--out", out] if out else [])])
    assert seen and not seen[0].exists()
    assert list(temp_root.iterdir()) == []


def test_an_existing_out_folder_stays_when_the_demo_fails(temp_root, monkeypatch):
    (temp_root / "mine").mkdir()
    (temp_root / "mine" / "notes.txt").write_text("keep")
    monkeypatch.setattr(commands, "demo_report", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("broke")))
    with pytest.raises(RuntimeError):
        cli.main(["demo", "--out", "mine"])
    assert (temp_root / "mine" / "notes.txt").read_text() == "keep"


def _no_demo(monkeypatch):
    """Make ``demo_report`` record that it ran: an unwritable ``--out`` must stop the demo before its work."""
    ran = []
    monkeypatch.setattr(commands, "demo_report", lambda *a, **k: ran.append(a) or (_ for _ in ()).throw(
        AssertionError("the demo ran before its output folder was checked")))
    return ran


@pytest.mark.parametrize("setup, msg", [
    (lambda d: (d / "split.html").mkdir(), r"--out mine: mine/split\.html is a folder, where the demo writes a file"),
    (lambda d: (d / "artifact").write_text("x"), r"--out mine: mine/artifact is not a folder"),
    (lambda d: ((d / "artifact").mkdir(), (d / "artifact" / "mine.txt").write_text("x"), (d / "split.svg").write_text(
        "my svg")), r"--out mine: mine/artifact: it holds files that would be lost \(mine\.txt\), where the demo "
     r"writes the exported programs"),
])
def test_an_out_folder_with_entries_in_the_way_stops_before_the_demo(temp_root, monkeypatch, capsys, setup, msg):
    (temp_root / "mine").mkdir()
    setup(temp_root / "mine")
    ran = _no_demo(monkeypatch)
    assert cli.main(["demo", *SMALL, "--out", "mine"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"jaxaot demo: error: {msg}.*; choose another folder or move it away\n", err), err
    assert not ran
    if (temp_root / "mine" / "split.svg").exists():  # nothing of the user's was written over
        assert (temp_root / "mine" / "split.svg").read_text() == "my svg"


def test_an_out_folder_holding_an_earlier_demo_s_artifact_passes_the_check(tmp_path):
    jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)).save(tmp_path / "artifact")
    assert demo.out_dir_conflict(tmp_path) is None


def test_an_out_folder_that_refuses_writes_stops_before_the_demo(temp_root, monkeypatch, capsys):
    def refuse(*args, **kwargs):  # what a read-only file system answers, whatever os.access said
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(commands.tempfile, "mkdtemp", refuse)
    ran = _no_demo(monkeypatch)
    assert cli.main(["demo", *SMALL, "--out", "made/here"]) == 2
    err = capsys.readouterr().err
    assert err == (f"jaxaot demo: error: --out made/here: cannot write there ({os.strerror(errno.EROFS)}); "
                   "choose a folder you can write to\n")
    assert not ran and list(temp_root.iterdir()) == []  # the folders it made to check are gone


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes in read-only folders")
def test_an_out_folder_under_a_read_only_folder_stops_before_the_demo(temp_root, monkeypatch, capsys):
    (temp_root / "locked").mkdir(mode=0o555)
    ran = _no_demo(monkeypatch)
    try:
        assert cli.main(["demo", *SMALL, "--out", "locked/out"]) == 2
    finally:
        (temp_root / "locked").chmod(0o755)
    assert re.fullmatch(r"jaxaot demo: error: --out locked/out: cannot write in .*locked; choose a folder you can "
                        r"write to\n", capsys.readouterr().err)
    assert not ran and not (temp_root / "locked" / "out").exists()
