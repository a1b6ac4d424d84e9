"""The jaxaot command: its arguments, ``inspect``, ``version`` and ``--help``."""

import subprocess
import sys
import textwrap

import pytest

from jaxaot.cli import main as cli
from jaxaot.errors import InvalidValueError


def test_version(capsys):
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    assert "jaxaot" in out and "jax " in out and "jaxlib" in out and "backend" in out


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


def test_parse_shapes():
    got = cli.parse_shapes("f32[8, 16] bf16[3]  i32[] bool[2,2]")
    assert [(s.shape, s.dtype.name) for s in got] == [((8, 16), "float32"), ((3,), "bfloat16"), ((), "int32"),
                                                      ((2, 2), "bool")]


@pytest.mark.parametrize("spec, msg", [
    ("q8[2]", "unknown dtype 'q8'; use one of f64, f32"),
    ("f32", "cannot read shape 'f32': write dtype\\[dims\\]"),
    ("f32[8,16]x", "cannot read shape 'f32\\[8,16\\]x'"),
    ("  ", "empty --shapes"),
])
def test_parse_shapes_says_what_it_cannot_read(spec, msg):
    with pytest.raises(InvalidValueError, match=msg):
        cli.parse_shapes(spec)


def test_help_for_each_command():
    for sub in ([], ["demo"], ["inspect"], ["version"]):
        r = subprocess.run([sys.executable, "-m", "jaxaot.cli", *sub, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "usage: jaxaot" in r.stdout
