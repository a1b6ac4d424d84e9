"""A loaded artifact types its outputs and gradients as JAX does, and says why a call it cannot take fails.

``jax.export`` serializes no weak types: a saved and reloaded artifact handed back strong outputs and gradients
where JAX's, of Python-float arguments, are weak, and later bfloat16 arithmetic with them became float32. A
function exported with ``static_argnums`` and called with its static argument got a bare pytree mismatch, and
``jax.vmap`` of a loaded function JAX's raw batching-rule error. Every comparison is with JAX on fresh random
inputs; each artifact is saved, then loaded from its folder (and, once, in a fresh process).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import ArtifactJvpError, ArtifactVmapError
from jaxaot.errors import ArtifactError, ArtifactInputError
from zoo import child_env

TOL = dict(rtol=2e-5, atol=2e-5)


def _sum_sin(a, w):
    return jnp.sum(jnp.sin(w * a))


def _scaled(a):
    return a * 2.0 + jnp.sin(a)


def _product(a, b):
    return a * b + jnp.cos(a)


def _two_outputs(a, b):
    return a * 2.0, jnp.sin(a * b)


# name -> (function, the example arguments for a seed); Python floats are weakly typed, NumPy float32 scalars not.
CASES = {
    "python_float_and_array": (_sum_sin, lambda r: (float(r.standard_normal()), r.standard_normal(3, np.float32))),
    "python_float_weak_output": (_scaled, lambda r: (float(r.standard_normal()),)),
    "strong_scalar": (_scaled, lambda r: (jnp.float32(r.standard_normal()),)),
    "mixed": (_product, lambda r: (float(r.standard_normal()), jnp.float32(r.standard_normal()))),
    "two_outputs": (_two_outputs, lambda r: (float(r.standard_normal()), float(r.standard_normal()))),
}


def _args(name: str, seed: int) -> tuple:
    example = CASES[name][1](np.random.default_rng(seed))
    return tuple(jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in example)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("typed")
    return {name: jaxaot.export.export(fn, *_args(name, 0)).save(root / name) for name, (fn, _) in CASES.items()}


def _types(tree) -> list:
    return [(str(x.dtype), bool(x.aval.weak_type)) for x in jax.tree_util.tree_leaves(tree)]


def _same(got, want) -> None:
    """Equal dtypes and weak types, leaf by leaf, and close values."""
    assert _types(got) == _types(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **TOL)


def _cotangents(out, weak: tuple[bool, ...]):
    """Cotangents of ones shaped as ``out``, weakly typed where ``weak`` says."""
    leaves, tree = jax.tree_util.tree_flatten(out)
    cts = [C.typed_as(jnp.ones(o.shape, o.dtype), jax.ShapeDtypeStruct(o.shape, o.dtype, weak_type=True)) if w
           else jnp.ones(o.shape, o.dtype) for o, w in zip(leaves, weak)]
    return jax.tree_util.tree_unflatten(tree, cts)


@pytest.fixture(params=["saved", "in_memory"])
def loaded(request, saved):
    def load(name):
        if request.param == "saved":
            return jaxaot.export.load(saved[name])
        return jaxaot.export.load(jaxaot.export.export(CASES[name][0], *_args(name, 0)))
    return load


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_are_typed_as_jax_s(loaded, name):
    fn, f, args = CASES[name][0], loaded(name), _args(name, 7)
    _same(f(*args), jax.jit(fn)(*args))
    _same(jax.jit(f)(*args), jax.jit(fn)(*args))
    _same(f.forward(*args)[0], jax.jit(fn)(*args))


@pytest.mark.parametrize("name", sorted(set(CASES) - {"two_outputs"}))  # scalar outputs
def test_gradients_are_typed_as_jax_s(loaded, name):
    fn, f, args = CASES[name][0], loaded(name), _args(name, 8)
    argnums = tuple(range(len(args)))
    _same(jax.grad(f, argnums)(*args), jax.grad(fn, argnums)(*args))
    _same(jax.jit(jax.grad(f, argnums))(*args), jax.jit(jax.grad(fn, argnums))(*args))
    _same(jaxaot.value_and_grad(f, argnums)(*args), jax.value_and_grad(fn, argnums)(*args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_with_weak_and_strong_cotangents_is_typed_as_jax_s(loaded, name):
    fn, f, args = CASES[name][0], loaded(name), _args(name, 9)
    out, fn_vjp = jax.vjp(fn, *args)
    for weak in itertools.product((False, True), repeat=len(jax.tree_util.tree_leaves(out))):
        cts = _cotangents(out, weak)
        # JAX's jit (and jaxaot's aot_function) is the reference: with several cotangents of mixed weak types,
        # JAX's eager sum of two gradient contributions may differ from its jit in weak type.
        want = jax.jit(fn_vjp)(cts)
        if len(weak) == 1:
            _same(fn_vjp(cts), want)
        _, f_vjp = jax.vjp(f, *args)
        _same(f_vjp(cts), want)
        _same(jax.jit(f_vjp)(cts), want)
        _, residuals = f.forward(*args)
        _same(f.backward(residuals, cts), want)
        _, aot_vjp = jax.vjp(jaxaot.aot_function(fn), *args)
        _same(aot_vjp(cts), want)


def test_a_weak_gradient_keeps_bfloat16_arithmetic_bfloat16(saved):
    f = jaxaot.export.load(saved["python_float_and_array"])
    a, w = _args("python_float_and_array", 10)
    params = w.astype(jnp.bfloat16)
    want, got = jax.grad(_sum_sin)(a, w), jax.grad(f)(a, w)
    assert (got * params).dtype == (want * params).dtype == jnp.bfloat16
    assert (jax.jit(jax.grad(f))(a, w) * params).dtype == jnp.bfloat16


def test_the_manifest_records_which_gradients_are_weak(saved):
    def weak_grads(name):
        return json.loads((saved[name] / "manifest.json").read_text())["signature"]["weak_grads"]

    assert weak_grads("python_float_and_array") == [[], None]  # weak whatever the cotangent; a strong input
    assert weak_grads("python_float_weak_output") == [[0]]  # weak when the cotangent of output 0 is
    assert weak_grads("strong_scalar") == [None]


def test_an_artifact_without_weak_grads_loads_with_strong_gradients(saved, tmp_path):
    import shutil

    d = shutil.copytree(saved["python_float_and_array"], tmp_path / "old")
    m = json.loads((d / "manifest.json").read_text())
    del m["signature"]["weak_grads"], m["signature"]["static_argnums"]
    (d / "manifest.json").write_text(json.dumps(m))
    f, args = jaxaot.export.load(d), _args("python_float_and_array", 11)
    ga, gw = jax.grad(f, (0, 1))(*args)
    assert not ga.aval.weak_type and not gw.aval.weak_type
    _same(f(*args), jax.jit(_sum_sin)(*args))
    np.testing.assert_allclose(ga, jax.grad(_sum_sin)(*args), **TOL)


@pytest.mark.parametrize("weak_grads,match", [("x", "weak_grads.* not a list"), ([None], "1 entries for 2"),
                                              ([[5], None], "weak_grads holds 5"), ([["0"], None], "holds '0'")])
def test_malformed_weak_grads_are_refused(saved, tmp_path, weak_grads, match):
    import shutil

    d = shutil.copytree(saved["python_float_and_array"], tmp_path / "bad")
    m = json.loads((d / "manifest.json").read_text())
    m["signature"]["weak_grads"] = weak_grads
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=match):
        jaxaot.export.load(d)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, jaxaot

    f = jaxaot.export.load(sys.argv[1])
    a, w = float(sys.argv[2]), jnp.asarray(json.loads(sys.argv[3]), jnp.float32)
    kinds = lambda t: [[str(x.dtype), bool(x.aval.weak_type)] for x in jax.tree_util.tree_leaves(t)]
    print(json.dumps([kinds(f(a, w)), kinds(jax.grad(f, (0, 1))(a, w)), kinds(jax.jit(jax.grad(f))(a, w))]))
    """
)


def test_a_fresh_process_gets_jax_s_types(saved, tmp_path):
    a, w = _args("python_float_and_array", 12)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(saved["python_float_and_array"]), repr(a),
                           json.dumps(np.asarray(w).tolist())], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    want = [_types(jax.jit(_sum_sin)(a, w)), _types(jax.grad(_sum_sin, (0, 1))(a, w)),
            _types(jax.jit(jax.grad(_sum_sin))(a, w))]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[list(t) for t in k] for k in want]


# --------------------------------------------------------------------------- calls it cannot take
def _bf16_dot(x, y):
    return jnp.sum(x * y)


_WEAK_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, jaxaot

    f = jaxaot.export.load(sys.argv[1])
    x = jnp.arange(3, dtype=jnp.bfloat16)
    kinds = {"float": 2.3, "int": 2, "strong_float32": jnp.float32(2.3), "bfloat16": jnp.bfloat16(2.3)}
    out = {}
    for name, y in [*kinds.items(), ("float under x64", 2.3)]:
        try:
            with jax.enable_x64(name.endswith("x64")):
                runs = [f(x, y), jax.jit(f)(x, y), jax.grad(f, 1)(x, y)]
            out[name] = [[float(r), str(r.dtype), bool(r.aval.weak_type)] for r in runs]
        except jaxaot.errors.ArtifactInputError as err:
            out[name] = str(err)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def weak_and_strong(tmp_path_factory):
    root = tmp_path_factory.mktemp("weak_and_strong")
    x = jnp.ones(3, jnp.bfloat16)
    return {kind: jaxaot.export.export(_bf16_dot, x, y).save(root / kind)
            for kind, y in (("weak", 2.0), ("strong", jnp.float32(2.0)))}


def _in_a_fresh_process(path, tmp_path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _WEAK_CHILD, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _reference(y) -> list:
    x = jnp.arange(3, dtype=jnp.bfloat16)
    runs = [_bf16_dot(x, y), jax.jit(_bf16_dot)(x, y), jax.grad(_bf16_dot, 1)(x, y)]
    return [[float(r), str(r.dtype), bool(r.aval.weak_type)] for r in runs]


def _matches(got: list, want: list) -> bool:
    """Equal dtypes and weak types, run by run, and close values."""
    return ([g[1:] for g in got] == [w[1:] for w in want]
            and np.allclose([g[0] for g in got], [w[0] for w in want], rtol=1e-2))


def test_an_argument_exported_from_a_python_float_takes_only_a_python_float(weak_and_strong, tmp_path):
    got = _in_a_fresh_process(weak_and_strong["weak"], tmp_path)
    assert _matches(got["float"], _reference(2.3))  # bfloat16 arithmetic, as JAX's
    # A strongly typed float32 makes JAX compute in float32 (6.9, not bfloat16's 6.875): the program cannot.
    assert _reference(jnp.float32(2.3))[0][1] == "float32"
    assert re.fullmatch(r"arg\[1\] was exported for a Python float \(weakly typed float32\[\]\) and gets a strongly "
                        r"typed float32 array, which JAX promotes differently .*Pass a Python float, or export with "
                        r"a float32 array for this argument\.", got["strong_float32"])
    # A Python int promotes unlike a Python float (int8 times 2 stays int8, times 2.0 is float32).
    assert jnp.result_type(jnp.int8, int) == jnp.int8 and jnp.result_type(jnp.int8, float) == jnp.float32
    assert re.fullmatch(r"arg\[1\]: expected float32\[\], got int32\[\]\. arg\[1\] was exported for a Python float "
                        r"\(weakly typed float32\[\]\): pass a Python float \(2\.0, not 2\)\. A Python int promotes "
                        r"differently from a Python float .*", got["int"])
    assert re.fullmatch(r"arg\[1\]: expected float32\[\], got bfloat16\[\]\. .*: pass a Python float, or export with a "
                        r"bfloat16 array for this argument\.", got["bfloat16"])
    # Under x64 a Python float is float64: the message says so, not "pass a Python float".
    assert re.fullmatch(r"arg\[1\]: expected float32\[\], got float64\[\]\. .*a Python float is float64 here: the "
                        r"artifact was exported with jax_enable_x64 off\. .*", got["float under x64"])


def test_an_argument_exported_strongly_typed_takes_a_python_scalar_and_computes_as_exported(weak_and_strong,
                                                                                              tmp_path):
    got = _in_a_fresh_process(weak_and_strong["strong"], tmp_path)
    assert _matches(got["strong_float32"], _reference(jnp.float32(2.3)))
    # A Python float runs the exported program: float32 arithmetic, where the function itself would stay bfloat16.
    assert _matches(got["float"], _reference(jnp.float32(2.3))) and not _matches(got["float"], _reference(2.3))
    assert "expected float32[], got int32[]." in got["int"] and "Python" not in got["int"]


@pytest.mark.parametrize("how", ["jvp", "jit_jvp", "jacfwd", "jit_jacfwd", "hessian", "jvp_of_grad"])
def test_forward_mode_of_a_loaded_artifact_is_a_typed_error(saved, how):
    f = jaxaot.export.load(saved["strong_scalar"])
    x = jnp.float32(np.random.default_rng().standard_normal())
    run = {
        "jvp": lambda: jax.jvp(f, (x,), (x,)),
        "jit_jvp": lambda: jax.jit(lambda a, t: jax.jvp(f, (a,), (t,)))(x, x),
        "jacfwd": lambda: jax.jacfwd(f)(x),
        "jit_jacfwd": lambda: jax.jit(jax.jacfwd(f))(x),
        "hessian": lambda: jax.hessian(f)(x),
        "jvp_of_grad": lambda: jax.jvp(jax.grad(f), (x,), (x,)),
    }[how]
    with pytest.raises(ArtifactJvpError, match=r"jax.jvp of _scaled, a loaded artifact, is not supported \(nor "
                                               r"jax.jacfwd, jax.hessian .*jax.custom_vjp, which has reverse mode "
                                               r"only\. Use reverse mode .*export a function that computes the jvp"
                                               ) as info:
        run()
    assert isinstance(info.value, ArtifactError) and isinstance(info.value, TypeError)
    np.testing.assert_allclose(jax.grad(f)(x), jax.grad(_scaled)(x), **TOL)  # reverse mode still works


def test_linearize_of_a_loaded_artifact_returns_and_its_linear_function_raises_jax_s_error(saved):
    # jax.linearize traces as jax.vjp does: the loaded function cannot tell them apart (docs/concepts/export.md).
    f = jaxaot.export.load(saved["strong_scalar"])
    x = jnp.float32(np.random.default_rng().standard_normal())
    y, f_lin = jax.linearize(f, x)
    np.testing.assert_allclose(y, _scaled(x), **TOL)
    with pytest.raises(TypeError, match=r"forward-mode autodiff \(jvp\) to a custom_vjp function"):
        f_lin(x)


def test_a_call_with_the_static_argument_names_it_and_its_value(tmp_path):
    aot = jaxaot.aot_function(lambda x, n: jnp.sum(jnp.sin(x) ** n), static_argnums=1)
    f = jaxaot.export.load(jaxaot.export.export(aot, jnp.ones(5), 3).save(tmp_path / "a"))
    x = jnp.asarray(np.random.default_rng(13).standard_normal(5, np.float32))
    with pytest.raises(ArtifactInputError, match=r"exported with argument 1 fixed to 3 \(static_argnums=\(1,\)\): "
                                                 r"the loaded function takes only the other 1 positional argument"
                                                 r".*Call it without the static ones"):
        f(x, 3)
    np.testing.assert_allclose(f(x), jnp.sum(jnp.sin(x) ** 3), **TOL)


def test_a_call_with_several_static_arguments_names_them(tmp_path):
    aot = jaxaot.aot_function(lambda n, x, tag: jnp.sum(jnp.sin(x) ** n) * len(tag), static_argnums=(0, 2))
    f = jaxaot.export.load(jaxaot.export.export(aot, 2, jnp.ones(5), "ab").save(tmp_path / "a"))
    with pytest.raises(ArtifactInputError, match=r"arguments \(0, 2\) fixed to \(2, 'ab'\) \(static_argnums="):
        f(2, jnp.ones(5), "ab")
    with pytest.raises(ArtifactInputError, match=r"fixed to \(2, 'ab'\)"):
        f(jnp.ones(5), jnp.ones(5))  # the wrong structure otherwise: the note still helps


def test_a_mismatch_without_static_arguments_says_nothing_of_them(saved):
    f = jaxaot.export.load(saved["python_float_weak_output"])
    with pytest.raises(ArtifactInputError) as info:
        f(1.0, 2.0)
    assert "static" not in str(info.value)


def test_vmap_of_a_loaded_artifact_is_a_typed_error_and_lax_map_works(saved):
    f = jaxaot.export.load(saved["strong_scalar"])  # mapped over an array: its elements are strongly typed
    xs = jnp.asarray(np.random.default_rng(14).standard_normal(4, np.float32))
    _, f_vjp = jax.vjp(f, xs[0])
    for run in (jax.vmap(f), jax.jit(jax.vmap(f)), jax.vmap(jax.grad(f)), jax.vmap(f_vjp)):
        with pytest.raises(ArtifactVmapError, match=r"jax.vmap of _scaled, a loaded artifact, is not supported.*"
                                                    r"Export the vmapped function instead.*jax.lax.map") as info:
            run(xs)
        assert isinstance(info.value, ArtifactError) and isinstance(info.value, NotImplementedError)
    np.testing.assert_allclose(jax.lax.map(f, xs), jax.vmap(_scaled)(xs), **TOL)
    np.testing.assert_allclose(jax.lax.map(jax.grad(f), xs), jax.vmap(jax.grad(_scaled))(xs), **TOL)
