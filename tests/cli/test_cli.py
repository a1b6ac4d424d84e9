"""The jaxaot command."""

import subprocess
import sys
import textwrap

import pytest

from jaxaot.cli import main as cli


def test_version(capsys):
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    assert "jaxaot" in out and "jax " in out and "jaxlib" in out and "backend" in out


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
    import jax
    import jax.numpy as jnp

    import jaxaot
    from jaxaot.cli import demo_models as examples

    params, data = examples.mlp_init(jax.random.key(0), width=32, depth=2, batch=8)
    loaded = jaxaot.load(out / "artifact")
    got = jax.grad(loaded)(params, data)
    want = jax.grad(examples.mlp_loss)(params, data)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_inspect(tmp_path, monkeypatch, capsys):
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import jax.numpy as jnp
        def loss(w, x):
            return jnp.tanh(x @ w).sum()
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "usermod:loss", "--shapes", "f32[3,2] f32[4,3]"]) == 0
    out = capsys.readouterr().out
    assert "== residuals ==" in out and "tanh" in out and "usermod.py" in out


@pytest.mark.parametrize("argv, msg", [
    (["inspect", "nomodule_here:f", "--shapes", "f32[2]"], "cannot import"),
    (["inspect", "os:path_nope", "--shapes", "f32[2]"], "no attribute"),
    (["inspect", "os.path:join", "--shapes", "q8[2]"], "cannot read shape"),
    (["inspect", "os", "--shapes", "f32[2]"], "MODULE:FUNCTION"),
])
def test_inspect_bad_input(argv, msg):
    with pytest.raises(SystemExit, match=msg):
        cli.main(argv)


def test_help_for_each_command():
    for sub in ([], ["demo"], ["inspect"], ["version"]):
        r = subprocess.run([sys.executable, "-m", "jaxaot.cli", *sub, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "usage: jaxaot" in r.stdout
