"""Attacks on a saved artifact, each refused at load, and the good artifact still right afterwards.

Files that are not regular files (a FIFO hung ``load``), a manifest symlinked out
of the directory, programs carrying host callbacks of any platform's family (a
planted callback ran the user's own ``pure_callback`` with the artifact's data),
unknown custom calls, and programs swapped inside an artifact (which loaded,
then failed with raw ``IndexError``) are all refused with
:class:`~jaxaot.errors.ArtifactError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.artifacts import audit
from jaxaot.errors import ArtifactError
from jaxaot._src import compat as C
from reliability.hostile import deadline, program_from_text, with_host_callback, with_program_text, write_program


def _fn(x):
    return jnp.sum(jnp.sin(x))


X = jnp.linspace(0.0, 1.0, 3)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return jaxaot.export.export(_fn, jnp.ones(3)).save(tmp_path_factory.mktemp("good") / "art")


@pytest.fixture
def art(good, tmp_path):
    d = tmp_path / "art"
    shutil.copytree(good, d)
    return d


def _works(d: Path, **kw) -> None:
    f = jaxaot.export.load(d, **kw)
    np.testing.assert_allclose(f(X), _fn(X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(X), jnp.cos(X), rtol=1e-6)


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


# --------------------------------------------------------------------------- files that are not regular files
@pytest.mark.parametrize("name", ["forward.jaxexport", "manifest.json", "backward.jaxexport"])
def test_a_fifo_in_place_of_a_file_is_refused_in_seconds(art, good, name):
    (art / name).unlink()
    os.mkfifo(art / name)
    with deadline(30), pytest.raises(ArtifactError, match=rf"{name} is a FIFO, not a regular file"):
        jaxaot.export.load(art)
    (art / name).unlink()
    shutil.copy(good / name, art / name)
    _works(art)


def test_a_directory_in_place_of_a_program_is_refused(art):
    (art / "inference.jaxexport").unlink()
    (art / "inference.jaxexport").mkdir()
    with pytest.raises(ArtifactError, match="inference.jaxexport is a directory, not a regular file"):
        jaxaot.export.load(art)


def test_a_manifest_symlinked_out_of_the_artifact_is_refused(art, tmp_path):
    outside = tmp_path / "elsewhere.json"
    shutil.move(art / "manifest.json", outside)
    (art / "manifest.json").symlink_to(outside)
    with pytest.raises(ArtifactError, match="manifest.json is a symlink out of the artifact directory"):
        jaxaot.export.load(art)


def test_symlinks_that_stay_inside_the_artifact_load(art):
    (art / "forward.jaxexport").rename(art / "forward-v1.jaxexport")
    (art / "forward.jaxexport").symlink_to("forward-v1.jaxexport")
    (art / "manifest.json").rename(art / "manifest-v1.json")
    (art / "manifest.json").symlink_to(art / "manifest-v1.json")
    _works(art)


def test_the_size_cap_is_a_load_argument(art):
    with pytest.raises(ArtifactError, match=r"more than the limit of 1000: .*max_bytes"):
        jaxaot.export.load(art, max_bytes=1000)
    _works(art, max_bytes=10 << 20)


# --------------------------------------------------------------------------- what a program may call
def _callback_target_here() -> str:
    """The target a host callback lowers to on this process's platform (``..._cpu_callback``, ``..._gpu_callback``)."""
    text = jax.jit(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)).lower(X).as_text()
    (target,) = set(re.findall(r"custom_call @(\w+)", text))
    return target


def test_a_planted_host_callback_is_refused(art):
    target = _callback_target_here()
    exported = jaxaot.export.load(art).exported
    write_program(art, "inference", with_host_callback(exported.inference, target))
    with pytest.raises(ArtifactError, match=rf"the inference program calls host code \({target}\); "
                                            r"the manifest says none were exported"):
        jaxaot.export.load(art)
    # The control: let through, the planted callback runs whatever this process registered under
    # index 0 - here the user's own pure_callback, fed the artifact's data.
    f = jaxaot.export.load(art, allow_callbacks=True)
    seen = []

    def mine(v):
        seen.append(np.asarray(v))
        return np.asarray(v) * 100

    @jax.jit
    def user(x):
        return f(x), jax.pure_callback(mine, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    hijacked, _ = user(X)
    # The artifact's program got the user's callback's output (XLA may merge the two identical calls into one).
    assert seen and np.allclose(hijacked, _fn(100 * X), rtol=1e-5) and not np.allclose(hijacked, _fn(X))


HOST_CALLBACK_TARGETS = ["xla_ffi_python_cpu_callback", "xla_ffi_python_gpu_callback", "xla_python_cpu_callback",
                         "xla_python_gpu_callback", "xla_ffi_partitioned_python_cpu_callback",
                         "xla_ffi_partitioned_python_gpu_callback", "xla_python_tpu_callback", "MyHostCallback"]


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm", "tpu"])
@pytest.mark.parametrize("target", HOST_CALLBACK_TARGETS)
def test_every_host_callback_family_is_refused_whatever_the_platform(platform, target):
    # Checked before anything runs, for programs exported for any platform (lowered here, run nowhere).
    exported = jax.export.export(jax.jit(_fn), platforms=[platform])(X)
    planted = with_host_callback(exported, target)
    with pytest.raises(ArtifactError, match=rf"calls host code \({target}\)"):
        audit.check_program("forward", planted, "art", allow_callbacks=False)
    with pytest.raises(ArtifactError, match=rf"calls host code \({target}\)"):  # naming it is not enough
        audit.check_program("forward", planted, "art", allow_callbacks=False, allow_custom_calls=(target,))
    audit.check_program("forward", planted, "art", allow_callbacks=True)
    audit.check_program("forward", exported, "art", allow_callbacks=False)  # the unaltered program passes


def test_a_callback_in_a_nested_region_is_found():
    spec = jax.ShapeDtypeStruct(X.shape, X.dtype)
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: jax.pure_callback(np.sin, spec, v), x))
    program = program_from_text(loop.lower(X).as_text())
    with pytest.raises(ArtifactError, match="calls host code"):
        audit.check_program("forward", program, "art", allow_callbacks=False)


def test_an_unknown_custom_call_is_refused(art):
    exported = jaxaot.export.load(art).exported
    planted = with_host_callback(exported.forward, "my_native_kernel")
    write_program(art, "forward", planted)
    with pytest.raises(ArtifactError, match=r"forward program calls custom targets that jax.export does not produce "
                                            r"\(my_native_kernel\)"):
        jaxaot.export.load(art, allow_callbacks=True)


def test_the_manifest_records_custom_calls_and_no_callbacks(art):
    m = _manifest(art)
    assert m["host_callbacks"] is False
    assert all(isinstance(a["custom_calls"], list) for a in m["artifacts"].values())


def test_the_allowlist_is_what_jax_export_allows_less_host_code():
    from jax._src.export import _export

    stable = set(_export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)
    assert audit.EXPORTABLE_CUSTOM_CALLS == stable - {"tf.call_tf_function"}
    assert not any(audit.is_host_callback(t) for t in audit.EXPORTABLE_CUSTOM_CALLS)
    assert audit.is_host_callback("tf.call_tf_function")


def test_ops_inside_strings_are_no_ops():
    program = program_from_text("""
      func.func public @main(%arg0: tensor<3xf32>) -> tensor<3xf32> {
        %0 = stablehlo.sine %arg0 : tensor<3xf32> loc("custom_call @xla_python_cpu_callback stablehlo.send")
        %1 = stablehlo.custom_call @Sharding(%0) {backend_config = "stablehlo.outfeed @xla_python_cpu_callback",
                                                  mhlo.sharding = "{replicated}"} : (tensor<3xf32>) -> tensor<3xf32>
        %tok = stablehlo.create_token : !stablehlo.token
        %2 = "stablehlo.outfeed"(%1, %tok) {outfeed_config = ""} : (tensor<3xf32>, !stablehlo.token) -> !stablehlo.token
        return %1 : tensor<3xf32>
      }""")
    ops = C.program_ops(program)
    assert [c.target for c in ops.custom_calls] == ["Sharding"]
    assert audit.host_code(ops) == ["stablehlo.outfeed"]


# --------------------------------------------------------------------------- programs that do not fit the signature
@pytest.mark.parametrize("a,b", [("forward", "backward"), ("inference", "forward"), ("inference", "backward")])
def test_programs_swapped_inside_an_artifact_are_refused_at_load(art, a, b):
    m = _manifest(art)
    m["artifacts"][a], m["artifacts"][b] = m["artifacts"][b], m["artifacts"][a]  # each keeps a valid sha256
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"the programs do not belong to this manifest \(swapped or altered\)"):
        jaxaot.export.load(art)


def test_a_signature_that_disagrees_with_its_programs_is_refused(art, good):
    m = _manifest(art)
    m["signature"]["out_specs"][0]["dtype"] = "float16"
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"output 0 of the inference program is float32\[\], the signature says "
                                            r"float16\[\]"):
        jaxaot.export.load(art)
    _works(good)


def test_a_program_returning_a_bare_array_for_a_1_tuple_is_refused(art, good):
    # The same avals (one float32[]), another structure: every call raised a raw TypeError.
    bare = jax.export.export(jax.jit(_fn))(jax.ShapeDtypeStruct((3,), jnp.float32))
    assert [a.shape for a in bare.out_avals] == [()] and bare.out_tree == jax.tree_util.tree_structure(0)
    write_program(art, "inference", bare)
    with pytest.raises(ArtifactError, match=r"the inference program's outputs are structured as PyTreeDef\(\*\), not "
                                            r"as the flat sequence of 1 arrays"):
        jaxaot.export.load(art)
    _works(good)


# ------------------------------------------------------------------------- programs that do not fit their own metadata
def test_a_program_whose_entry_function_is_renamed_is_refused_at_load(art, good):
    # Renamed in the serialized program itself, checksum fixed: every call raised a bare KeyError.
    path = art / "inference.jaxexport"
    blob = path.read_bytes().replace(b"main\x00public", b"mai\x15\x00public")
    assert blob != path.read_bytes()
    path.write_bytes(blob)
    m = _manifest(art)
    m["artifacts"]["inference"]["sha256"] = hashlib.sha256(blob).hexdigest()
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"the inference program cannot be called as its own metadata describes it "
                                            r"\(KeyError: \"Symbol 'main' not in the symbol table.\"\): the program "
                                            r"is damaged or was altered after export"):
        jaxaot.export.load(art)
    _works(good)


def test_a_program_taking_other_operands_than_its_metadata_says_is_refused_at_load(art, good):
    # An extra argument of main: each call and gradient raised a bare ValueError of the MLIR verifier.
    backward = jaxaot.export.load(art).exported.backward
    text = backward.mlir_module()
    head = re.search(r"func\.func public @main\((.*?)\) ->", text)
    assert head is not None
    extra = text.replace(head.group(0), f"func.func public @main({head.group(1)}, %extra: tensor<7xf32>) ->", 1)
    write_program(art, "backward", with_program_text(backward, extra))
    with pytest.raises(ArtifactError, match=r"the backward program cannot be called as its own metadata describes it "
                                            r"\(ValueError: Cannot lower jaxpr with verifier errors: 'func.call' op "
                                            r"incorrect number of operands for callee.*\): the program is damaged"):
        jaxaot.export.load(art)
    _works(good)
