"""jaxaot.export / ExportedAOT.save / jaxaot.export.load.

The round trips load each artifact in a fresh Python process that never sees
the original function (it runs from an empty directory and imports only
jaxaot), and compare its outputs and gradients with JAX's own, in process.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import (
    ArtifactError,
    ArtifactInputError,
    ArtifactVersionError,
    CotangentMismatchError,
    LoopOverflowError,
    NotExportableError,
    ResidualsMismatchError,
)
from jaxaot._src.cli.demo_models import mlp_loss
from zoo import assert_trees_close, child_env
from jaxaot._src.artifacts import LoadedAOT, treedef_from_json, treedef_to_json
from jaxaot._src.artifacts import loaded as loaded_module

TOL = dict(rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- models
# Inputs come from numpy: on CPU every eager jax op compiles, which would dominate.
def _normal(rng: np.random.Generator, *shape: int) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))


def _mlp(seed, batch=4):
    rng = np.random.default_rng(seed)
    params = [{"w": _normal(rng, 8, 8) / np.float32(3), "b": _normal(rng, 8)} for _ in range(2)]
    return mlp_loss, (params, (_normal(rng, batch, 8), _normal(rng, batch, 8)))


@functools.lru_cache(maxsize=1)
def _flax_module():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(6, 16, rngs=rngs)
            self.l2 = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.gelu(self.l1(x)))

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Net(nnx.Rngs(0))))
    state_tree = jax.tree_util.tree_structure(state)

    def loss(params, x, y):  # pure: rebuilds the module from a dict of arrays
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(state_tree, jax.tree_util.tree_leaves(params)))
        return jnp.mean((model(x) - y) ** 2)

    return loss, nnx.to_pure_dict(state)


def _flax(seed, batch=5):
    loss, shapes = _flax_module()
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map(lambda s: _normal(rng, *s.shape) * np.float32(0.5), shapes)
    return loss, (params, _normal(rng, batch, 6), _normal(rng, batch, 3))


def _while_loss(w, x):
    def body(c):
        i, h = c
        return i + 1, jnp.tanh(h @ w)

    _, h = jaxaot.loops.while_loop(lambda c: c[0] < 5, body, (0, x), max_steps=8)
    return jnp.sum(h**2)


def _while(seed):
    rng = np.random.default_rng(seed)
    return _while_loss, (_normal(rng, 4, 4), _normal(rng, 3, 4))


@functools.partial(jax.jit, static_argnums=0)
def _reference(fn, args):
    out, vjp = jax.vjp(fn, *args)
    cts = jax.tree_util.tree_map(jnp.ones_like, out)
    return out, vjp(cts)


# --------------------------------------------------------------------------- subprocess round trip

_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np, jax, jax.numpy as jnp
    import jaxaot

    for job in json.load(open(sys.argv[1])):
        f = jaxaot.export.load(job["dir"])
        with np.load(job["inputs"]) as data:
            leaves = [jnp.asarray(data[f"a{i}"]) for i in range(len(data.files))]
        args = jax.tree_util.tree_unflatten(f.signature.in_tree, leaves)
        out, vjp = jax.vjp(f, *args)
        cts = jax.tree_util.tree_map(jnp.ones_like, out)
        grads = vjp(cts)
        out2, res = f.forward(*args)
        grads2 = f.backward(res, cts)
        leaves = jax.tree_util.tree_leaves((out, grads, out2, grads2))
        np.savez(job["out"], **{f"a{i}": np.asarray(x) for i, x in enumerate(leaves)})
        print(job["name"], "platforms", ",".join(f.exported.forward.platforms))
    """
)


def _cases():
    cases = {
        "mlp": (_mlp, {}, [11]),
        "flax_nnx": (_flax, {}, [12]),
        # one artifact with a symbolic batch, run at three batch sizes
        "mlp_symbolic_batch": (
            _mlp,
            {"dynamic_shapes": (None, ("b, ...", "b, ..."))},
            [(13, 2), (14, 5), (15, 9)],
        ),
        "mlp_multiplatform": (_mlp, {"platforms": ("cpu", "cuda", "tpu")}, [16]),
        "while_loop": (_while, {}, [17]),
    }
    return cases


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory):
    """Export every case (example inputs: seed 0), run them all in one fresh process."""
    root = tmp_path_factory.mktemp("roundtrip")
    jobs, expected = [], {}
    for name, (make, options, runs) in _cases().items():
        fn, example = make(0)
        directory = jaxaot.export.export(fn, *example, **options).save(root / name)
        for r, run in enumerate(runs):
            seed, *size = run if isinstance(run, tuple) else (run,)
            fn, args = make(seed, *size)  # fresh random inputs, maybe another batch size
            np.savez(root / f"{name}{r}_in.npz",
                     **{f"a{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(args))})
            out, grads = _reference(fn, args)
            expected.setdefault(name, []).append(jax.tree_util.tree_leaves((out, grads, out, grads)))
            jobs.append({"name": name, "dir": str(directory), "inputs": str(root / f"{name}{r}_in.npz"),
                         "out": str(root / f"{name}{r}_out.npz")})
    (root / "jobs.json").write_text(json.dumps(jobs))
    workdir = root / "empty"
    workdir.mkdir()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(root / "jobs.json")], cwd=workdir,
                          capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    got: dict[str, list] = {}
    for job in jobs:
        with np.load(job["out"]) as data:
            got.setdefault(job["name"], []).append([data[f"a{i}"] for i in range(len(data.files))])
    return expected, got, proc.stdout


@pytest.mark.parametrize("name", ["mlp", "flax_nnx", "mlp_symbolic_batch", "mlp_multiplatform", "while_loop"])
def test_roundtrip_in_fresh_process(roundtrip, name):
    expected, got, _ = roundtrip
    assert len(got[name]) == len(expected[name])
    for want, have in zip(expected[name], got[name]):
        assert len(want) == len(have)
        chex.assert_trees_all_close([np.asarray(w) for w in want], have, **TOL)


def test_multiplatform_artifact_runs_its_cpu_part(roundtrip):
    _, _, stdout = roundtrip
    assert "mlp_multiplatform platforms cpu,cuda,tpu" in stdout


# --------------------------------------------------------------------------- in process
@pytest.fixture(scope="module")
def mlp_export():
    fn, args = _mlp(0)
    return fn, args, jaxaot.export.export(fn, *args)


def test_signature_describes_the_contract(mlp_export):
    _, args, exp = mlp_export
    s = exp.signature
    assert s.in_paths == ("arg[0][0]['b']", "arg[0][0]['w']", "arg[0][1]['b']", "arg[0][1]['w']", "arg[1][0]",
                          "arg[1][1]")
    assert s.grad_inputs == tuple(range(6)) and s.cotangent_outputs == (0,)
    assert s.out_specs[0].shape == () and s.out_specs[0].dtype == "float32"
    assert len(s.residual_specs) == len(s.saved_inputs) + len(s.saved_outputs) > 0
    assert all(s.in_specs[i] == s.residual_specs[k] for k, i in enumerate(s.saved_inputs))
    assert s.in_tree == jax.tree_util.tree_structure(args)
    assert [a.shape for a in exp.backward.in_avals[1:]] == [tuple(r.shape) for r in s.residual_specs]
    assert type(s).from_json(json.loads(json.dumps(s.to_json()))) == s


@pytest.mark.smoke
def test_load_in_process_under_jit_and_explicit_split(mlp_export):
    fn, _, exp = mlp_export
    f = jaxaot.export.load(exp)
    assert isinstance(f, LoadedAOT)
    _, args = _mlp(21)
    out_ref, grads_ref = _reference(fn, args)
    chex.assert_trees_all_close(jax.jit(jax.grad(f))(*args), grads_ref[0], **TOL)
    out, res = f.forward(*args)
    chex.assert_trees_all_close((out, f.backward(res, jnp.float32(1.0))), (out_ref, grads_ref), **TOL)


def test_a_concrete_call_of_a_loaded_function_runs_its_program_jitted_once(mlp_export, monkeypatch):
    """Called on values, outside any transformation, a loaded function runs each exported program through one
    ``jax.jit`` of its call: the program is traced once per shape, as jit traces (``Exported.call`` eagerly traces
    itself at every call), with the same outputs and residuals; under ``jax.grad`` its programs run as before."""
    fn, _, exp = mlp_export
    traced = []
    call = type(exp.inference).call
    monkeypatch.setattr(type(exp.inference), "call", lambda self, *a: traced.append(1) or call(self, *a))
    f = jaxaot.export.load(exp)
    for _ in range(4):
        _, args = _mlp(int(np.random.default_rng().integers(1, 1000)))
        out_ref, grads_ref = _reference(fn, args)
        out, res = f.forward(*args)
        chex.assert_trees_all_close((f(*args), out, f.backward(res, jnp.float32(1.0))), (out_ref, out_ref, grads_ref),
                                    **TOL)
    assert len(traced) == 3  # inference, forward, backward: each traced once for the four calls
    chex.assert_trees_all_close(jax.grad(f)(*args), grads_ref[0], **TOL)
    assert f.cache_info().misses == 1  # one shape: its entry names the three programs


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy])
def test_copies_of_a_loaded_function_run_the_same_programs_with_a_call_log_of_their_own(mlp_export, copier):
    """As copies of a ``jax.jit`` function: the same programs, a cache of their own."""
    fn, _, exp = mlp_export
    f = jaxaot.export.load(exp)
    _, args = _mlp(int(np.random.default_rng().integers(1, 1000)))
    f(*args)
    g = copier(f)
    assert isinstance(g, LoadedAOT) and g.exported is f.exported and g.signature == f.signature
    assert g.cache_info().misses == 0 and f.cache_info().misses == 1
    out_ref, grads_ref = _reference(fn, args)
    chex.assert_trees_all_close((g(*args), jax.grad(g)(*args)), (out_ref, grads_ref[0]), **TOL)
    assert f.cache_info().misses == 1


def test_symbolic_residuals(tmp_path):
    fn, args = _mlp(0)
    exp = jaxaot.export.export(fn, *args, dynamic_shapes=(None, ("b, ...", "b, ...")))
    assert exp.signature.in_specs[-1].shape == ("b", 8)
    assert any("b" in r.shape for r in exp.signature.residual_specs)
    f = jaxaot.export.load(exp.save(tmp_path / "a"))
    with pytest.raises(ArtifactInputError, match=r"arg\[1\]\[1\]: dimension 'b' is 3 here but 2 in arg\[1\]\[0\]"):
        f(args[0], (jnp.ones((2, 8)), jnp.ones((3, 8))))
    with pytest.raises(ArtifactInputError, match=r"arg\[1\]\[0\]: dimension 'b' is 0 here, .* at least 1"):
        f(args[0], (jnp.ones((0, 8)), jnp.ones((0, 8))))
    chex.assert_trees_all_close(f(*args), fn(*args), **TOL)  # and it keeps working


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda p, x, y: (p, (x[:, :5], y)), r"arg\[1\]\[0\]: expected float32\[4,8\], got float32\[4,5\]"),
        (lambda p, x, y: (p, (x.astype(jnp.int32), y)), r"arg\[1\]\[0\]: expected float32\[4,8\], got int32\[4,8\]"),
        (lambda p, x, y: (p, x), r"takes positional arguments structured as"),
        (lambda p, x, y: (p, ("text", y)), r"arg\[1\]\[0\] is a str, not an array"),
    ],
)
def test_loaded_refuses_wrong_inputs(tmp_path, mlp_export, bad, message):
    _, (params, (x, y)), exp = mlp_export
    f = jaxaot.export.load(exp.save(tmp_path / "a"))
    with pytest.raises(ArtifactInputError, match=message):
        f(*bad(params, x, y))


def test_loaded_takes_numpy_float64_as_jax_does_and_says_when_an_artifact_needs_x64(tmp_path, mlp_export):
    """Without x64 JAX reads NumPy float64 as float32, and so does a loaded artifact; a float64 artifact called
    without x64 says that it needs it."""
    fn, args, exp = mlp_export
    f = jaxaot.export.load(exp.save(tmp_path / "a"))
    wide = jax.tree.map(lambda a: np.asarray(a, np.float64), args)
    chex.assert_trees_all_close(f(*wide), jax.jit(fn)(*wide), **TOL)
    chex.assert_trees_all_close(jax.jit(f)(*wide), f(*args), **TOL)
    spec = f.signature.in_specs[0]
    needs_x64 = dataclasses.replace(spec, dtype="float64")
    with pytest.raises(ArtifactInputError, match=r"expected float64.*only with jax_enable_x64"):
        loaded_module._check_leaf("arg[0]", needs_x64, np.ones(spec.shape), {}, ArtifactInputError)


def test_backward_refuses_wrong_residuals_and_cotangents(mlp_export):
    _, args, exp = mlp_export
    f = jaxaot.export.load(exp)
    _, res = f.forward(*args)
    with pytest.raises(ResidualsMismatchError):
        f.backward(tuple(res.arrays), jnp.float32(1))
    with pytest.raises(ResidualsMismatchError, match="residual 0"):
        f.backward(type(res)([jnp.zeros(3), *res.arrays[1:]], res.input_shapes), jnp.float32(1))
    with pytest.raises(CotangentMismatchError, match="cotangent for output"):
        f.backward(res, jnp.ones(2))


def _edit_manifest(directory: Path, edit) -> None:
    m = json.loads((directory / "manifest.json").read_text())
    edit(m)
    (directory / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(format_version=2), "format version 2 .* upgrade jaxaot"),
        (lambda m: m["versions"].update(jaxaot="7.0.0"), "jaxaot 7.0.0, incompatible"),
        (lambda m: m["versions"].update(jax="99.1.0"), "jax 99.1.0, newer than"),
        (lambda m: m["versions"].update(jax="0.4.30"), "jax 0.4.30; jaxaot artifacts need jax >= 0.10"),
        (lambda m: m["artifacts"]["backward"].update(calling_convention_version=999), "calling convention 999"),
    ],
)
def test_incompatible_manifest_is_refused(tmp_path, mlp_export, edit, message):
    directory = mlp_export[2].save(tmp_path / "a")
    _edit_manifest(directory, edit)
    with pytest.raises(ArtifactVersionError, match=message):
        jaxaot.export.load(directory)


def test_version_check_can_be_skipped_for_jax_only(tmp_path, mlp_export):
    directory = mlp_export[2].save(tmp_path / "a")
    _edit_manifest(directory, lambda m: m["versions"].update(jax="99.1.0"))
    assert isinstance(jaxaot.export.load(directory, check_versions=False), LoadedAOT)
    _edit_manifest(directory, lambda m: m.update(format_version=0))
    with pytest.raises(ArtifactVersionError):
        jaxaot.export.load(directory, check_versions=False)


def test_corrupt_or_missing_artifacts(tmp_path, mlp_export):
    directory = mlp_export[2].save(tmp_path / "a")
    blob = bytearray((directory / "forward.jaxexport").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (directory / "forward.jaxexport").write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match="forward.jaxexport is corrupt"):
        jaxaot.export.load(directory)
    with pytest.raises(ArtifactError, match="no manifest.json"):
        jaxaot.export.load(tmp_path)


@pytest.mark.parametrize("name", ["absent", "absent/deeper"])
def test_loading_a_path_where_nothing_exists_names_it_and_what_to_pass(tmp_path, name):
    missing = tmp_path / name
    with pytest.raises(ArtifactError) as info:
        jaxaot.export.load(missing)
    assert str(info.value) == (f"load: no artifact at {missing}: nothing exists there. Pass the folder that "
                        "jaxaot.export.ExportedAOT.save wrote (the one holding manifest.json).")


def test_loading_a_file_says_an_artifact_is_a_folder(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"model\.bin is a file, not an artifact: pass the folder that "
                       r"jaxaot\.export\.ExportedAOT\.save wrote"):
        jaxaot.export.load(tmp_path / "model.bin")


def _debug_callback(x):
    jax.debug.callback(lambda v: None, x)
    return jnp.sum(jnp.sin(x))


def _debug_print(x):
    jax.debug.print("x={}", x)
    return jnp.sum(jnp.sin(x))


def _io_callback(x):
    from jax.experimental import io_callback

    y = io_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return jnp.sum(jnp.sin(x) * y)


def _pure_callback_in_loop(x):
    body = lambda i, c: c + jax.pure_callback(np.sin, jax.ShapeDtypeStruct(c.shape, c.dtype), c)  # noqa: E731
    return jnp.sum(jax.lax.fori_loop(0, 3, body, x))


@pytest.mark.parametrize(
    "fn, primitive",
    [(_debug_callback, "debug_callback"), (_debug_print, "debug_print"), (_io_callback, "io_callback"),
     (_pure_callback_in_loop, "pure_callback")],
)
def test_host_callbacks_are_refused_at_export(fn, primitive):
    with pytest.raises(NotExportableError, match=rf"host callback \({primitive}\) at .*test_export.py:\d+") as e:
        jaxaot.export.export(fn, jnp.ones(3))
    assert fn.__name__ in str(e.value)


def test_unsupported_pytree_node_is_named():
    from flax import nnx

    _, state = nnx.split(nnx.eval_shape(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(0))))
    with pytest.raises(NotExportableError, match=r"arg\[0\] is a flax.*State pytree node.*to_pure_dict"):
        jaxaot.export.export(lambda s, x: jnp.sum(x @ s["kernel"].value), state, jnp.ones((1, 2)))


Point = collections.namedtuple("Point", ["x", "y"])


@pytest.mark.parametrize(
    "tree",
    [
        ((1, 2), {}),
        {"b": [1, None, (2,)], "a": {3: 4, 5: 6}},
        collections.OrderedDict([("z", 1), ("a", 2)]),
        [Point(1, {"q": 2})],
        (),
    ],
)
def test_treedef_json_roundtrip(tree):
    td = jax.tree_util.tree_structure(tree)
    node = treedef_to_json(td)
    back = treedef_from_json(json.loads(json.dumps(node)))
    assert back.num_leaves == td.num_leaves
    assert treedef_to_json(back) == node
    if not any(isinstance(x, Point) for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda t: isinstance(t, Point))):
        assert back == td


def test_namedtuple_outputs_reload_as_namedtuples(tmp_path):
    fn = lambda x: Point(jnp.sin(x), jnp.cos(x).sum())  # noqa: E731
    f = jaxaot.export.load(jaxaot.export.export(fn, jnp.ones(3)).save(tmp_path / "a"))
    out = f(jnp.zeros(3))
    assert type(out).__name__ == "Point" and out._fields == ("x", "y")
    chex.assert_trees_all_close(tuple(out), tuple(fn(jnp.zeros(3))))


def test_export_an_aot_function_keeps_its_options():
    import functools

    aot = jaxaot.aot_function(lambda x, n: jnp.sum(jnp.sin(x) ** n), static_argnums=1,
                              partition_fn=functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
                                                             memory_budget=0.0))
    exp = jaxaot.export.export(aot, jnp.ones(5), 3)
    assert exp.signature.static_args == "(3,)"
    assert [p for p in exp.signature.in_paths] == ["arg[0]"]
    assert exp.signature.residual_specs == (exp.signature.in_specs[0],)  # min-cut at 0 saves only the input
    x = _normal(np.random.default_rng(3), 5)
    chex.assert_trees_all_close(jax.grad(jaxaot.export.load(exp))(x), jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 3))(x), **TOL)
    assert aot.cache_info().misses == 0  # exporting left the caller's AOTFunction alone


def test_while_loop_overflow_check_survives_export():
    def fn(x):
        _, h = jaxaot.loops.while_loop(lambda c: c[0] < 20, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x), max_steps=8)
        return jnp.sum(h)

    exp = jaxaot.export.export(fn, jnp.ones(3))
    assert [c.max_steps for c in exp.signature.forward_checks] == [8]
    f = jaxaot.export.load(exp)
    chex.assert_trees_all_close(f(jnp.ones(3)), fn(jnp.ones(3)), **TOL)
    with pytest.raises(LoopOverflowError, match="max_steps=8"):
        jax.grad(f)(jnp.ones(3))


def test_a_loaded_loop_s_overflow_under_jit_is_nan_or_raised_on_leaving_reraise():
    """As before export: a gradient NaN under a bare ``jit``, ``LoopOverflowError`` from ``reraise_overflow``, never
    an exception inside a host callback; the forward alone, unbounded, and runs within the bound equal the
    function's."""
    def fn(a, n):
        return jaxaot.loops.while_loop(lambda c: c[1] < n, lambda c: (c[0] * 1.1, c[1] + 1), (a, 0),
                                       max_steps=5)[0].sum()

    g = jaxaot.export.load(jaxaot.export.export(fn, jnp.ones(3), jnp.int32(3)))
    run, want = jax.jit(jax.value_and_grad(g)), jax.jit(jax.value_and_grad(fn))
    x = jax.random.normal(jax.random.key(4), (3,))
    for n in (4, 5):  # 5: exactly max_steps, no overflow
        chex.assert_trees_all_close(run(x, n), want(x, n), **TOL)
    chex.assert_trees_all_close(jax.jit(g)(x, 7), fn(x, 7), **TOL)
    got, ref = run(x, 7), want(x, 7)
    assert bool(jnp.all(jnp.isnan(got[1]))) and bool(jnp.all(jnp.isnan(ref[1])))
    with pytest.raises(LoopOverflowError, match="max_steps=5"), jaxaot.loops.reraise_overflow():
        run(x, 7)


@pytest.mark.parametrize("budget", [None, 1.0, 0.5, 0.0])
def test_symbolic_batch_exports_under_every_partitioner(budget):
    # Regression: the min-cut's cost model called int() on symbolic dims ('16*b') and crashed.
    import functools

    def loss(w, x, y):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    pf = None if budget is None else functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    k = jax.random.split(jax.random.key(np.random.randint(1 << 30)), 6)
    w = 0.3 * jax.random.normal(k[0], (16, 4))
    exp = jaxaot.export.export(loss, w, jnp.ones((8, 16)), jnp.ones((8, 4)), dynamic_shapes=(None, "b, ...", "b, ..."),
                        partition_fn=pf)
    f = jaxaot.export.load(exp)
    for i, b in enumerate((3, 11)):
        x, y = jax.random.normal(k[1 + 2 * i], (b, 16)), jax.random.normal(k[2 + 2 * i], (b, 4))
        assert_trees_close(jax.value_and_grad(f, argnums=(0, 1))(w, x, y),
                           jax.value_and_grad(loss, argnums=(0, 1))(w, x, y))
