"""Attacks on a saved artifact, each refused at load, and the good artifact still right afterwards.

Files that are not regular files (a FIFO hung ``load``), a manifest symlinked out
of the directory, programs carrying host callbacks (a planted callback ran the
user's own ``pure_callback`` with the artifact's data), unknown custom calls, and
programs swapped inside an artifact (which loaded, then failed with raw
``IndexError``) are all refused with :class:`~jaxaot.errors.ArtifactError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.artifacts import audit
from jaxaot.errors import ArtifactError
from reliability.hostile import deadline


def _fn(x):
    return jnp.sum(jnp.sin(x))


X = jnp.linspace(0.0, 1.0, 3)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return jaxaot.export(_fn, jnp.ones(3)).save(tmp_path_factory.mktemp("good") / "art")


@pytest.fixture
def art(good, tmp_path):
    d = tmp_path / "art"
    shutil.copytree(good, d)
    return d


def _works(d: Path, **kw) -> None:
    f = jaxaot.load(d, **kw)
    np.testing.assert_allclose(f(X), _fn(X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(X), jnp.cos(X), rtol=1e-6)


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _write_program(d: Path, name: str, exported) -> None:
    """Replace a program and fix its manifest entry (sha256, bytes), as an attacker with write access can."""
    blob = bytes(exported.serialize())
    m = _manifest(d)
    (d / m["artifacts"][name]["file"]).write_bytes(blob)
    m["artifacts"][name].update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    (d / "manifest.json").write_text(json.dumps(m))


# --------------------------------------------------------------------------- files that are not regular files
@pytest.mark.parametrize("name", ["forward.jaxexport", "manifest.json", "backward.jaxexport"])
def test_a_fifo_in_place_of_a_file_is_refused_in_seconds(art, good, name):
    (art / name).unlink()
    os.mkfifo(art / name)
    with deadline(30), pytest.raises(ArtifactError, match=rf"{name} is a FIFO, not a regular file"):
        jaxaot.load(art)
    (art / name).unlink()
    shutil.copy(good / name, art / name)
    _works(art)


def test_a_directory_in_place_of_a_program_is_refused(art):
    (art / "inference.jaxexport").unlink()
    (art / "inference.jaxexport").mkdir()
    with pytest.raises(ArtifactError, match="inference.jaxexport is a directory, not a regular file"):
        jaxaot.load(art)


def test_a_manifest_symlinked_out_of_the_artifact_is_refused(art, tmp_path):
    outside = tmp_path / "elsewhere.json"
    shutil.move(art / "manifest.json", outside)
    (art / "manifest.json").symlink_to(outside)
    with pytest.raises(ArtifactError, match="manifest.json is a symlink out of the artifact directory"):
        jaxaot.load(art)


def test_symlinks_that_stay_inside_the_artifact_load(art):
    (art / "forward.jaxexport").rename(art / "forward-v1.jaxexport")
    (art / "forward.jaxexport").symlink_to("forward-v1.jaxexport")
    (art / "manifest.json").rename(art / "manifest-v1.json")
    (art / "manifest.json").symlink_to(art / "manifest-v1.json")
    _works(art)


def test_the_size_cap_is_a_load_argument(art):
    with pytest.raises(ArtifactError, match=r"more than the limit of 1000: .*max_bytes"):
        jaxaot.load(art, max_bytes=1000)
    _works(art, max_bytes=10 << 20)


# --------------------------------------------------------------------------- what a program may call
def _with_host_callback(exported):
    """``exported`` with a host callback planted before its ``sin`` (sha256 recomputed by the caller)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    text = exported.mlir_module()
    callback = ('%cb = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) {backend_config = "", '
                'mhlo.backend_config = {index = 0 : ui64}, operand_layouts = [dense<0> : tensor<1xindex>], '
                'result_layouts = [dense<0> : tensor<1xindex>]} : (tensor<3xf32>) -> tensor<3xf32>\n    ')
    planted = text.replace("stablehlo.sine %arg0", "stablehlo.sine %cb", 1)
    assert planted != text
    planted = planted.replace("%0 = stablehlo.sine %cb", callback + "%0 = stablehlo.sine %cb", 1)
    with mlir.make_ir_context():
        bytecode = mlir.module_to_bytecode(ir.Module.parse(planted))
    return dataclasses.replace(exported, mlir_module_serialized=bytecode)


def test_a_planted_host_callback_is_refused(art):
    exported = jaxaot.load(art).exported
    _write_program(art, "inference", _with_host_callback(exported.inference))
    with pytest.raises(ArtifactError, match=r"the inference program calls host code \(xla_ffi_python_cpu_callback\); "
                                            r"the manifest says none were exported"):
        jaxaot.load(art)
    # The control: let through, the planted callback runs whatever this process registered under
    # index 0 - here the user's own pure_callback, fed the artifact's data.
    f = jaxaot.load(art, allow_callbacks=True)
    seen = []

    def mine(v):
        seen.append(np.asarray(v))
        return np.asarray(v) * 100

    @jax.jit
    def user(x):
        return f(x), jax.pure_callback(mine, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    hijacked, _ = user(X)
    assert len(seen) == 2 and not np.allclose(hijacked, _fn(X))


def test_an_unknown_custom_call_is_refused(art):
    exported = jaxaot.load(art).exported
    planted = _with_host_callback(exported.forward)
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    text = planted.mlir_module().replace("@xla_ffi_python_cpu_callback", "@my_native_kernel")
    with mlir.make_ir_context():
        planted = dataclasses.replace(planted, mlir_module_serialized=mlir.module_to_bytecode(ir.Module.parse(text)))
    _write_program(art, "forward", planted)
    with pytest.raises(ArtifactError, match=r"forward program calls custom targets that jax.export does not produce "
                                            r"\(my_native_kernel\)"):
        jaxaot.load(art, allow_callbacks=True)


def test_the_manifest_records_custom_calls_and_no_callbacks(art):
    m = _manifest(art)
    assert m["host_callbacks"] is False
    assert all(isinstance(a["custom_calls"], list) for a in m["artifacts"].values())


def test_the_allowlist_is_what_jax_export_allows_less_host_code():
    from jax._src.export import _export

    stable = set(_export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)
    assert audit.EXPORTABLE_CUSTOM_CALLS == stable - {"tf.call_tf_function"}
    assert not any(audit.is_host_callback(t) for t in audit.EXPORTABLE_CUSTOM_CALLS)


def test_ops_are_matched_at_line_starts_not_inside_strings():
    text = ('  %0 = stablehlo.sine %arg0 : tensor<3xf32> loc("custom_call @xla_python_cpu_callback stablehlo.send")\n'
            '  %1 = "stablehlo.custom_call"(%0) <{call_target_name = "Sharding"}> : (tensor<3xf32>) -> tensor<3xf32>\n'
            '  %2 = stablehlo.outfeed %1, %tok : (tensor<3xf32>, !stablehlo.token) -> !stablehlo.token\n')
    assert audit.custom_call_targets(text) == {"Sharding"}
    assert audit.host_code(text) == ["stablehlo.outfeed"]


# --------------------------------------------------------------------------- programs that do not fit the signature
@pytest.mark.parametrize("a,b", [("forward", "backward"), ("inference", "forward"), ("inference", "backward")])
def test_programs_swapped_inside_an_artifact_are_refused_at_load(art, a, b):
    m = _manifest(art)
    m["artifacts"][a], m["artifacts"][b] = m["artifacts"][b], m["artifacts"][a]  # each keeps a valid sha256
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"the programs do not belong to this manifest \(swapped or altered\)"):
        jaxaot.load(art)


def test_a_signature_that_disagrees_with_its_programs_is_refused(art, good):
    m = _manifest(art)
    m["signature"]["out_specs"][0]["dtype"] = "float16"
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"output 0 of the inference program is float32\[\], the signature says "
                                            r"float16\[\]"):
        jaxaot.load(art)
    _works(good)
