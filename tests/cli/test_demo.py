"""``jaxaot demo``: the report, the gradient check, and what it writes to --out."""

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot import viz
from jaxaot.cli import demo_models as examples
from jaxaot.cli import main as cli


def test_demo_prints_table_checks_gradients_and_writes_artifacts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "--width", "32", "--depth", "2", "--batch", "8"]) == 0
    captured = capsys.readouterr()
    assert "jax.fwd_and_bwd" in captured.out and "jaxaot (default partition)" in captured.out
    assert "jaxaot (min-cut partition)" in captured.out
    assert "gradients match" in captured.out
    assert "done (" in captured.err  # progress lines
    out = tmp_path / "jaxaot-demo"
    assert (out / "split.html").exists()
    assert (out / "artifact" / "manifest.json").exists()
    params, data = examples.mlp_init(jax.random.key(0), width=32, depth=2, batch=8)
    loaded = jaxaot.load(out / "artifact")
    got = jax.grad(loaded)(params, data)
    want = jax.grad(examples.mlp_loss)(params, data)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_demo_out_writes_rendered_split(tmp_path, capsys):
    assert cli.main(["demo", "--width", "16", "--depth", "2", "--batch", "4", "--out", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (tmp_path / "split.html").read_text()
    assert "jaxaot-residuals" in page
    assert (tmp_path / "split.svg").exists() == viz.layout_available()
