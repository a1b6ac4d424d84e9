"""The jaxaot command: its arguments, ``inspect``, ``version``, ``--help`` and its usage errors."""

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.pytrees import short_dtype_names
from jaxaot._src.cli import main as cli
from jaxaot._src.cli.commands import UsageError, load_object
from jaxaot._src.cli.shapes import example_arrays, needs_x64, parse_shapes
from jaxaot.errors import InvalidValueError

CLI_DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.mark.smoke
def test_version(capsys):
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    assert "jaxaot" in out and "jax " in out and "jaxlib" in out and "backend" in out


def test_inspect_plain_shapes(tmp_path, monkeypatch, capsys):
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import jax.numpy as jnp
        def loss(w, x):
            return jnp.tanh(x @ w).sum()
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "usermod:loss", "--shapes", "f32[3, 2] f32[4,3]"]) == 0
    out = capsys.readouterr().out
    assert "== residuals ==" in out and "tanh" in out and "usermod.py" in out
    assert "f32[4,2]" in out  # the shapes were read, spaces and all


def test_a_required_keyword_only_argument_is_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "kwmod.py").write_text(textwrap.dedent("""
        def loss(x, *, scale):
            return (scale * x).sum()
        def loss2(x, y, *, scale):
            return (scale * x * y).sum()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "kwmod:loss", "--shapes", "f32[3]"]) == 2
    err = capsys.readouterr().err
    assert "needs the keyword-only argument scale" in err and "positional" not in err, err
    assert cli.main(["inspect", "kwmod:loss2", "--shapes", "f32[3]"]) == 2  # a positional one is missing too
    assert "takes 2 positional arguments (x, y) but was given 1" in capsys.readouterr().err


@pytest.mark.parametrize("compare", [False, True])
def test_json_stdout_is_one_document_when_the_users_code_prints(tmp_path, monkeypatch, capsys, compare):
    module = f"noisymod_{compare}"  # imported afresh in each case
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        import jax.numpy as jnp
        print("imported")
        def loss(w, x):
            print("tracing")
            return jnp.tanh(x @ w).sum()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = ["--compare", "--rounds", "1", "--budget", "0.5"] if compare else []
    assert cli.main(["inspect", f"{module}:loss", "--shapes", "f32[3,2] f32[4,3]", "--json", *extra]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["target"] == f"{module}:loss"
    assert "imported" in err and "tracing" in err


def test_inspect_pytree_shapes_as_json(capsys):
    spec = '[[{"w": "f32[16, 16]", "b": "f32[16]"}], ["f32[4,16]", "f32[4,16]"]]'
    assert cli.main(["inspect", "jaxaot._src.cli.demo_models:mlp_loss", "--shapes", spec, "--partition", "min_cut"]) == 0
    out = capsys.readouterr().out
    assert "== residuals ==" in out and "f32[16,16]" in out and "f32[4,16]" in out


@pytest.mark.smoke
def test_inspect_example_args(capsys):
    assert cli.main(["inspect", "jaxaot._src.cli.demo_models:mlp_loss",
                     "--args", "jaxaot._src.cli.demo_models:mlp_example_args"]) == 0
    out = capsys.readouterr().out
    assert "== residuals ==" in out and "f32[4,16]" in out


def _documented_commands(prefix: str) -> list[str]:
    """The shell lines of the command's docs page that start with ``prefix``, continuation lines joined."""
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", CLI_DOCS.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line.split(" #")[0].strip() for line in lines if line.strip().startswith(prefix)]


@pytest.fixture
def documented_model(tmp_path, monkeypatch):
    """The page's ``model.py`` (its ``python file=model.py`` block) in the current folder, importable as ``model``."""
    block = re.search(r"```python file=model.py\n(.*?)```", CLI_DOCS.read_text(), flags=re.S).group(1)
    (tmp_path / "model.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    yield
    sys.modules.pop("model", None)


def test_documented_inspect_examples_run_as_written(capsys, documented_model):
    commands = _documented_commands("jaxaot inspect")
    assert len(commands) >= 2, "docs/cli.md shows jaxaot inspect with --shapes and with --args"
    assert any("--shapes" in c for c in commands) and any("--args" in c for c in commands)
    assert any("--budget" in c for c in commands) and any("--json" in c for c in commands)
    assert any("--compare" in c and "--json" in c for c in commands)
    assert any("--compare" in c and "--json" not in c for c in commands)
    for command in commands:
        argv = shlex.split(command)[1:]
        assert cli.main(argv) == 0, command
        out = capsys.readouterr().out
        if "--compare" in argv:
            _check_comparison(out, argv)
        elif "--json" in argv:
            assert json.loads(out)["residuals"], command
        else:
            assert "== residuals ==" in out, command


def _check_comparison(out: str, argv: list[str]) -> None:
    """``inspect --compare``'s output: jaxaot at the budgets asked for next to JAX's three policies and jit."""
    budgets = [argv[argv.index("--budget") + 1]] if "--budget" in argv else ["1.0", "0.5", "0.0"]
    names = [f"jaxaot memory_budget={b}" for b in budgets] + ["jax.jit(jax.value_and_grad)"] + [
        f"jax.checkpoint({p})" for p in ("dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable")]
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    if "--json" in argv:
        doc = json.loads(out)
        assert doc["target"] == argv[1] and doc["rounds"] == rounds
        assert [r["name"] for r in doc["rows"]] == names
        assert all(r["peak_bytes"] > 0 and len(r["times"]) == rounds and r["max_abs_diff"] < 1e-4
                   for r in doc["rows"]), doc["rows"]
    else:
        rows = [line for line in out.splitlines() if line.startswith(("jaxaot memory_budget", "jax."))]
        assert [line.split("  ")[0] for line in rows] == names, out
        assert f"over {rounds} rounds" in out


def test_documented_commands_name_only_real_targets(documented_model):
    for command in _documented_commands("jaxaot "):
        for word in shlex.split(command):
            if re.fullmatch(r"[\w.]+:[\w.]+", word):
                load_object(word)  # raises UsageError for a placeholder such as mypkg.model:loss


@pytest.mark.parametrize("argv, msg", [
    (["inspect", "nomodule_here:f", "--shapes", "f32[2]"], "cannot import 'nomodule_here'"),
    (["inspect", "os:path_nope", "--shapes", "f32[2]"], "'os' has no attribute 'path_nope'"),
    (["inspect", "os.path:join", "--shapes", "q8[2]"], "cannot read shape 'q8\\[2\\]'"),
    (["inspect", "os", "--shapes", "f32[2]"], "expected MODULE:FUNCTION, got 'os'"),
    (["inspect", "os:sep", "--shapes", "f32[2]"], "os:sep is not callable"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[2,2]"],
     "tanh_loss takes 2 positional arguments \\(w, x\\) but was given 1"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[3,2] f32[4,5]"],
     "does not trace at the given arguments: TypeError"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--args", "jaxaot._src.cli.demo_models:tanh_loss"],
     "calling jaxaot._src.cli.demo_models:tanh_loss\\(\\) raised TypeError"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--args", "jaxaot._src.cli.demo_models:mlp_init"],
     "raised TypeError"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", '{"w": 3}'], "neither a \"dtype\\[dims\\]\""),
    (["demo", "--width", "0"], "--width must be at least 1"),
    (["demo", "--budget=-1GB"], "--budget -1GB: memory_budget='-1GB' is negative"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--rounds", "3"],
     "--rounds times the steps of --compare: add --compare"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--compare",
      "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--compare",
      "--offload", "auto"], "--compare measures the min-cut partitioner .*: drop --offload"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--compare",
      "--budget", "2.5"], "--budget 2.5: memory_budget='2.5' is above 1"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "double[2]"], "unknown dtype 'double'"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--budget", "1.2xB"],
     "--budget 1.2xB: memory_budget '1.2xB' has an unknown unit 'xB'"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--budget", "-1"],
     "--budget -1: memory_budget='-1' is negative"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--budget", "1.5"],
     "--budget 1.5: memory_budget='1.5' is above 1, so it is not a fraction.*Did you mean '1.5GB'"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--partition", "default",
      "--offload", "auto"], "--budget and --offload configure the min-cut partitioner"),
    (["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", "--budget", "16B"],
     "no plan of jaxaot._src.cli.demo_models:tanh_loss fits --budget 16B: memory_budget=16 bytes"),
])
def test_user_errors_are_one_line_and_exit_2(argv, msg, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert re.match(rf"jaxaot {argv[0]}: error: .*{msg}", last), err
    assert "Traceback" not in err and " done (" not in err


def test_inspect_json_with_a_byte_budget(capsys):
    argv = ["inspect", "jaxaot._src.cli.demo_models:mlp_loss", "--args", "jaxaot._src.cli.demo_models:mlp_example_args",
            "--budget", "8KiB", "--offload", "auto", "--json"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds the document alone; progress went to stderr
    assert (doc["partition"], doc["budget"], doc["offload"]) == ("min_cut", "8KiB", "auto")
    assert doc["predicted_peak"]["budget"] == 8192 and doc["predicted_peak"]["fused"] <= 8192
    assert doc["saved_bytes"] == sum(r["nbytes"] for r in doc["residuals"]) > 0
    assert doc["added_bytes"] + doc["input_bytes"] == doc["saved_bytes"]
    assert set(doc["times"]) >= {"trace", "partition"} and all(isinstance(e, str) for e in doc["recomputed"])
    assert "lowering jaxaot._src.cli.demo_models:mlp_loss: done (" in captured.err


def test_inspect_json_matches_the_text(capsys):
    argv = ["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16, 4] f32[8, 16]"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["partition"] == "default" and doc["budget"] is None and doc["predicted_peak"] is None
    assert f"{len(doc['residuals'])} residuals, {doc['saved_bytes']} bytes saved ({doc['added_bytes']} added" in text
    assert all(r["label"] in text for r in doc["residuals"])


@pytest.mark.parametrize("error", [IndexError("tuple index out of range"), AssertionError("batch must be 99"),
                                   KeyError("w"), RuntimeError("no")])
def test_any_error_of_the_users_function_is_one_line_and_exit_2(error, monkeypatch, capsys):
    def raising(w, x):
        raise error

    monkeypatch.setattr(sys.modules["jaxaot._src.cli.demo_models"], "tanh_loss", raising)
    assert cli.main(["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress lines
    assert re.fullmatch(rf"jaxaot inspect: error: .*does not trace at the given arguments: {type(error).__name__}: "
                        rf".*", last), err
    assert "Traceback" not in err


def test_a_setting_variable_that_does_not_read_is_one_line_and_exit_2():
    env = {**os.environ, "JAXAOT_QUIET": "maybe", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "jaxaot", "version"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(r"jaxaot version: error: environment variable JAXAOT_QUIET='maybe'.*\n", done.stderr)


def test_traceback_flag_shows_the_cause_and_keeps_status_2(capsys):
    argv = ["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[3,2] f32[4,5]"]
    assert cli.main([*argv, "--traceback"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "TypeError" in err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"jaxaot inspect: error: .*does not trace at the given arguments: TypeError: .*", last), err
    assert "--traceback shows where" not in err  # the hint is for those who did not ask for it
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.endswith("(--traceback shows where)\n")


def test_a_reader_that_stops_early_ends_the_command_quietly(monkeypatch, capsys):
    from jaxaot._src.cli import commands

    def writes_to_a_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(commands.COMMANDS, "version", writes_to_a_closed_pipe)
    assert cli.main(["version"]) == commands.BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["version"], ["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes",
                                                "f32[16, 4] f32[8, 16]", "--json"]], ids=["version", "inspect"])
def test_output_into_a_closed_pipe_is_status_141_without_a_traceback(argv):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAXAOT_QUIET": "1"}
    p = subprocess.Popen([sys.executable, "-m", "jaxaot", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    p.stdout.close()  # `| head -0`: the reader is gone before anything is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err
    assert err == ""


def test_argparse_errors_exit_2(capsys):
    for argv in (["inspect", "os:getcwd"], ["inspect", "a:b", "--shapes", "f32[2]", "--args", "a:b"], ["nope"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2, argv
    assert "one of the arguments --shapes --args is required" in capsys.readouterr().err


def test_f64_turns_on_x64_and_says_so():
    # A subprocess: jax_enable_x64 is process-wide and must not leak into other tests.
    r = subprocess.run([sys.executable, "-m", "jaxaot", "inspect", "jaxaot._src.cli.demo_models:tanh_loss",
                        "--shapes", "f64[16, 4] f64[8, 16]"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "turned on jax_enable_x64" in r.stderr and "float64" in r.stderr
    assert "f64[8,4]" in r.stdout and "f32[" not in r.stdout


def test_parse_shapes_plain():
    got = parse_shapes("f32[8, 16] bf16[3]  i32[] bool[2,2] f32[ 4 ,2 ]")
    assert [(s.shape, s.dtype.name) for s in got] == [((8, 16), "float32"), ((3,), "bfloat16"), ((), "int32"),
                                                      ((2, 2), "bool"), ((4, 2), "float32")]


def test_dtypes_without_a_width_are_32_bit():
    got = parse_shapes("float[16,4] int[3] uint[] complex[2] float64[1] int64[1]")
    assert [s.dtype.name for s in got] == ["float32", "int32", "uint32", "complex64", "float64", "int64"]
    assert needs_x64(got[:4]) == [] and needs_x64(got) == ["float64", "int64"]
    for name in ("double", "long", "f8", "d", "single"):  # NumPy's aliases: refused, not read as 64-bit
        with pytest.raises(InvalidValueError, match=f"unknown dtype '{name}'"):
            parse_shapes(f"{name}[2]")


def test_float_shapes_leave_x64_off(capsys):
    assert not jax.config.jax_enable_x64
    try:
        assert cli.main(["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "float[16, 4] float[8, 16]"]) == 0
        assert not jax.config.jax_enable_x64
    finally:
        jax.config.update("jax_enable_x64", False)  # process-wide: never leak into other tests
    captured = capsys.readouterr()
    assert "jax_enable_x64" not in captured.err and "f32[8,4]" in captured.out and "f64[" not in captured.out


def test_example_arrays_fill_shapes_and_keep_arrays():
    w, (n, m), x = example_arrays([jax.ShapeDtypeStruct((3, 2), jnp.bfloat16),
                                   [jax.ShapeDtypeStruct((4,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.bool_)],
                                   jnp.arange(3.0)])
    assert (w.shape, w.dtype) == ((3, 2), jnp.bfloat16) and bool(jnp.all(jnp.isfinite(w))) and float(jnp.std(w)) > 0
    assert n.dtype == jnp.int32 and not bool(jnp.any(n)) and m.dtype == jnp.bool_ and not bool(jnp.any(m))
    assert x.tolist() == [0.0, 1.0, 2.0]


def test_parse_shapes_json():
    (params, batch) = parse_shapes('[{"w": "f32[8, 16]", "b": ["f16[16]", "i32[]"]}, "f32[4,8]"]')
    assert params["w"].shape == (8, 16) and params["b"][0].dtype.name == "float16" and params["b"][1].shape == ()
    assert batch.shape == (4, 8)
    (only,) = parse_shapes('{"w": "f32[2]"}')  # not a list: the only positional argument
    assert only["w"].shape == (2,)
    (s,) = parse_shapes('"f32[3]"')
    assert s.shape == (3,)


@pytest.mark.parametrize("spec, msg", [
    ("q8[2]", "unknown dtype 'q8'; use one of f64, f32"),
    ("f32", "cannot read shape 'f32': write dtype\\[dims\\]"),
    ("f32[8,16]x", "cannot read shape 'f32\\[8,16\\]x'"),
    ("f32[8,,16]", "an empty dimension"),
    ("  ", "empty --shapes"),
    ('["f32[2]"', "cannot read --shapes as JSON"),
    ('[["f32[2]", null]]', "at argument\\[0\\]\\[1\\]: null is neither"),
])
def test_parse_shapes_says_what_it_cannot_read(spec, msg):
    with pytest.raises(InvalidValueError, match=msg):
        parse_shapes(spec)


def test_help_lists_the_dtypes_parse_shapes_reads():
    assert cli.DTYPES == short_dtype_names()


def test_help_for_each_command():
    for sub in ([], ["demo"], ["inspect"], ["version"]):
        r = subprocess.run([sys.executable, "-m", "jaxaot", *sub, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "usage: jaxaot" in r.stdout


def test_inspect_help_documents_both_argument_forms(capsys):
    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    out = capsys.readouterr().out
    assert "--args MODULE:FUNCTION" in out and '"w": "f32[8,16]"' in out and "jax_enable_x64" in out


def _run_without_jax(code: str) -> str:
    """Run ``code`` in a fresh interpreter, then check that it imported no JAX module; its output."""
    code = textwrap.dedent(code) + textwrap.dedent("""
        assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))
        print("no jax")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("no jax"), r.stderr
    return r.stdout


def test_python_m_jaxaot_help_imports_no_jax():
    out = _run_without_jax("""
        import runpy, sys
        sys.argv = ["jaxaot", "--help"]
        try:
            runpy.run_module("jaxaot", run_name="__main__")
        except SystemExit as e:
            assert e.code == 0
    """)
    assert "usage: jaxaot" in out


def test_parser_imports_no_jax():
    # Loaded from its file, so that only the parser module runs (importing the jaxaot package imports jax).
    _run_without_jax(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("cli_main", {str(Path(cli.__file__))!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for argv in ([], ["inspect"], ["demo"], ["version"]):
            try:
                mod.main([*argv, "--help"])
            except SystemExit as e:
                assert e.code == 0
    """)
