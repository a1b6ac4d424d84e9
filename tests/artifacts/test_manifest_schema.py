"""Every malformed manifest is a typed error: a table of mutations, each an ArtifactError (or subclass).

The attack: ``"artifacts": []``, ``"artifacts": {"forward": "forward.jaxexport"}`` or
``"versions": []`` raised a raw ``AttributeError`` from ``jaxaot.export.load``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import ArtifactError, ArtifactVersionError


def _fn(w, x):
    return jnp.sum(jnp.tanh(x @ w)), x * 2


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return jaxaot.export.export(_fn, jnp.ones((3, 2)), jnp.ones((4, 3))).save(tmp_path_factory.mktemp("good") / "art")


def _set(path: str, value):
    """A mutation setting ``path`` (dots; list indices as ints) to ``value``."""
    def mutate(m):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        for p in parents:
            m = m[p]
        m[last] = value
    return mutate


def _drop(path: str):
    def mutate(m):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        for p in parents:
            m = m[p]
        del m[last]
    return mutate


def _replace_all(value):
    def mutate(m):
        m.clear()
        m["__whole__"] = value
    return mutate


MUTATIONS = {
    # the whole document
    "list_document": _replace_all([]),
    "string_document": _replace_all("jaxaot-export"),
    "null_document": _replace_all(None),
    # format and versions
    "no_format": _drop("format"),
    "other_format": _set("format", "pickle"),
    "format_as_number": _set("format", 1),
    "no_format_version": _drop("format_version"),
    "format_version_string": _set("format_version", "1"),
    "format_version_bool": _set("format_version", True),
    "format_version_float": _set("format_version", 1.0),
    "format_version_newer": _set("format_version", 99),
    "versions_list": _set("versions", []),
    "versions_null": _set("versions", None),
    "no_versions": _drop("versions"),
    "jaxaot_version_number": _set("versions.jaxaot", 0.1),
    "jaxaot_version_missing": _drop("versions.jaxaot"),
    "jaxaot_major_differs": _set("versions.jaxaot", "7.0.0"),
    "jax_version_list": _set("versions.jax", []),
    "jax_version_too_old": _set("versions.jax", "0.4.30"),
    "jax_version_garbage": _set("versions.jax", "latest"),
    "jaxlib_version_number": _set("versions.jaxlib", 7),
    # programs
    "artifacts_list": _set("artifacts", []),
    "artifacts_of_strings": _set("artifacts", {"forward": "forward.jaxexport"}),
    "artifacts_null": _set("artifacts", None),
    "no_artifacts": _drop("artifacts"),
    "no_backward": _drop("artifacts.backward"),
    "extra_program": _set("artifacts.evil", {"file": "forward.jaxexport"}),
    "program_entry_list": _set("artifacts.forward", ["forward.jaxexport"]),
    "file_number": _set("artifacts.forward.file", 7),
    "file_missing": _drop("artifacts.forward.file"),
    "file_traversal": _set("artifacts.forward.file", "../forward.jaxexport"),
    "file_absent": _set("artifacts.forward.file", "nothing-here.jaxexport"),
    "sha256_missing": _drop("artifacts.inference.sha256"),
    "sha256_number": _set("artifacts.inference.sha256", 5),
    "sha256_not_hex": _set("artifacts.inference.sha256", "z" * 64),
    "sha256_of_another_file": _set("artifacts.inference.sha256", "0" * 64),
    "bytes_string": _set("artifacts.backward.bytes", "12"),
    "bytes_negative": _set("artifacts.backward.bytes", -1),
    "bytes_wrong": _set("artifacts.backward.bytes", 3),
    "bytes_bool": _set("artifacts.backward.bytes", True),
    "calling_convention_string": _set("artifacts.forward.calling_convention_version", "9"),
    "calling_convention_missing": _drop("artifacts.forward.calling_convention_version"),
    "calling_convention_unsupported": _set("artifacts.forward.calling_convention_version", 999),
    "program_platforms_string": _set("artifacts.forward.platforms", "cpu"),
    "custom_calls_of_numbers": _set("artifacts.forward.custom_calls", [1, 2]),
    "platforms_string": _set("platforms", "cpu"),
    "platforms_of_numbers": _set("platforms", [1]),
    "function_number": _set("function", 5),
    "host_callbacks_string": _set("host_callbacks", "no"),
    # signature
    "signature_list": _set("signature", []),
    "no_signature": _drop("signature"),
    "in_specs_object": _set("signature.in_specs", {}),
    "in_specs_of_numbers": _set("signature.in_specs", [5, 6]),
    "in_specs_missing": _drop("signature.in_specs"),
    "spec_shape_number": _set("signature.in_specs.0.shape", 3),
    "spec_shape_string": _set("signature.in_specs.0.shape", "abc"),
    "spec_dtype_missing": _drop("signature.in_specs.0.dtype"),
    "spec_dtype_number": _set("signature.in_specs.0.dtype", 32),
    "spec_weak_type_string": _set("signature.in_specs.0.weak_type", "no"),
    "grad_inputs_string": _set("signature.grad_inputs", "0"),
    "grad_inputs_of_strings": _set("signature.grad_inputs", ["0"]),
    "saved_outputs_huge": _set("signature.saved_outputs", [10**9]),
    "num_temporaries_string": _set("signature.num_temporaries", "1"),
    "num_temporaries_bool": _set("signature.num_temporaries", True),
    "forward_checks_of_numbers": _set("signature.forward_checks", [5]),
    "forward_check_without_steps": _set("signature.forward_checks", [{"kind": "loop_overflow"}]),
    "forward_check_unknown_kind": _set("signature.forward_checks", [{"kind": "rm -rf", "max_steps": 3}]),
    "forward_check_extra_key": _set("signature.forward_checks",
                                    [{"kind": "loop_overflow", "max_steps": 3, "code": "x"}]),
    "mesh_string": _set("signature.mesh", "8 devices"),
    "mesh_without_sizes": _set("signature.mesh", {"axis_names": ["d"], "axis_types": ["Auto"]}),
    "static_args_number": _set("signature.static_args", 5),
    "dim_constraints_string": _set("signature.dim_constraints", "b >= 4"),
    "dim_constraints_of_numbers": _set("signature.dim_constraints", [4]),
    "dim_constraint_huge": _set("signature.dim_constraints", ["b >= " + "9" * 5000]),
    "in_structure_string": _set("signature.in_structure", "tuple"),
    "out_structure_list": _set("signature.out_structure", []),
    "residual_specs_null": _set("signature.residual_specs", None),
    "cotangent_outputs_null": _set("signature.cotangent_outputs", None),
}


def _mutated(good: Path, tmp_path: Path, mutate) -> Path:
    d = tmp_path / "art"
    shutil.copytree(good, d)
    m = json.loads((d / "manifest.json").read_text())
    mutate(m)
    text = json.dumps(m["__whole__"] if "__whole__" in m else m)
    (d / "manifest.json").write_text(text)
    return d


def test_the_table_is_large():
    assert len(MUTATIONS) >= 30


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_every_malformed_manifest_is_a_typed_error(good, tmp_path, name):
    d = _mutated(good, tmp_path, MUTATIONS[name])
    with pytest.raises(ArtifactError) as err:  # ArtifactVersionError is a subclass
        jaxaot.export.load(d)
    assert type(err.value) in (ArtifactError, ArtifactVersionError)
    assert "Traceback" not in str(err.value) and len(str(err.value)) < 2000


@pytest.mark.parametrize("text", ["", "{", "[1, 2", "null", "42", '"s"', "\xff\xfe", "{" * 100_000, '{"format": '
                                  '"jaxaot-export", "format_version": 1}'])
def test_manifests_that_are_not_json_objects_are_typed_errors(good, tmp_path, text):
    d = tmp_path / "art"
    shutil.copytree(good, d)
    (d / "manifest.json").write_text(text, errors="surrogateescape")
    with pytest.raises(ArtifactError):
        jaxaot.export.load(d)


def test_the_untouched_artifact_still_loads_and_is_right(good):
    f = jaxaot.export.load(good)
    w, x = jnp.ones((3, 2)) / 3, jnp.linspace(0.0, 1.0, 12).reshape(4, 3)
    got, want = jax.value_and_grad(lambda w: f(w, x)[0])(w), jax.value_and_grad(lambda w: _fn(w, x)[0])(w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5)
