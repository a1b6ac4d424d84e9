"""``jaxaot.export.load`` of a hostile artifact can neither run code nor exhaust memory."""

from __future__ import annotations

import json
import resource
import time
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.artifacts import manifest as manifest_mod
from jaxaot._src.artifacts import treedef_json
from jaxaot.errors import ArtifactError, ArtifactInputError


def _fn(params, x):
    return jnp.sum(jnp.tanh(x @ params["w"]) * params["b"])


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return ({"w": jnp.asarray(rng.standard_normal((4, 3), dtype=np.float32)),
             "b": jnp.asarray(rng.standard_normal(3, dtype=np.float32))},
            jnp.asarray(rng.standard_normal((2, 4), dtype=np.float32)))


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory):
    return jaxaot.export.export(_fn, *_args()).save(tmp_path_factory.mktemp("good") / "art")


@pytest.fixture
def artifact(good_artifact, tmp_path):
    """A fresh copy of a good artifact, and a function that rewrites its manifest."""
    d = tmp_path / "art"
    shutil.copytree(good_artifact, d)

    def edit(change):
        m = json.loads((d / "manifest.json").read_text())
        change(m)
        (d / "manifest.json").write_text(json.dumps(m))
        return d

    return d, edit


def _check_still_loads(d: Path) -> None:
    f = jaxaot.export.load(d)
    args = _args(1)
    want_v, want_g = jax.value_and_grad(_fn)(*args)
    got_v, got_g = jax.value_and_grad(f)(*args)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(got_g), jax.tree_util.tree_leaves(want_g)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_untouched_copy_loads(artifact):
    _check_still_loads(artifact[0])


@pytest.mark.parametrize("bad_name", ["../forward.jaxexport", "/etc/passwd", "..", "sub/forward.jaxexport",
                                      "..\\forward.jaxexport", "", 7, None])
def test_path_traversal_in_file_names_is_refused(artifact, tmp_path, bad_name):
    d, edit = artifact
    shutil.copy(d / "forward.jaxexport", tmp_path / "forward.jaxexport")  # a valid program outside
    edit(lambda m: m["artifacts"]["forward"].__setitem__("file", bad_name))
    with pytest.raises(ArtifactError, match=r"forward program's file .* not a plain file name|"
                                            r"'artifacts.forward.file' is (an integer|null), not a string"):
        jaxaot.export.load(d)


def test_symlink_out_of_the_artifact_is_refused(artifact, tmp_path):
    d, _ = artifact
    outside = tmp_path / "elsewhere.bin"
    shutil.move(d / "forward.jaxexport", outside)
    (d / "forward.jaxexport").symlink_to(outside)
    with pytest.raises(ArtifactError, match="symlink out of the artifact"):
        jaxaot.export.load(d)


@pytest.mark.parametrize("shape,match", [
    ([1 << 62], "outside 0"), ([-1], "outside 0"), ([1.5], "neither an int"), ([True], "neither an int"),
    ([1] * 100_000, "rank 100000"), (["b" * 10_000], "symbolic dimension of 10000"),
])
def test_huge_or_malformed_declared_shapes_are_refused(artifact, shape, match):
    d, edit = artifact
    edit(lambda m: m["signature"]["in_specs"][0].__setitem__("shape", shape))
    with pytest.raises(ArtifactError, match=match) as err:
        jaxaot.export.load(d)
    assert "in_specs[0]" in str(err.value) and "manifest.json" in str(err.value)


def test_huge_but_bounded_declared_shapes_allocate_nothing(artifact):
    # 2**48 x 2**48 float32 would be 2**98 bytes: load only compares shapes, and the programs'
    # own types refuse the signature.
    d, edit = artifact
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    edit(lambda m: m["signature"]["in_specs"][0].__setitem__("shape", [1 << 48, 1 << 48]))
    with pytest.raises(ArtifactError, match=r"input 0 of the inference program is float32\[3\], the signature "
                                            r"says float32\[281474976710656,281474976710656\]"):
        jaxaot.export.load(d)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


def _nest(depth: int) -> dict:
    node = {"kind": "leaf"}
    for _ in range(depth):
        node = {"kind": "list", "children": [node]}
    return node


@pytest.mark.parametrize("depth,match", [(treedef_json.MAX_DEPTH + 5, "nested deeper than"),
                                         (200_000, r"NestingError: JSON nested \d+ levels deep")])
def test_deeply_nested_treedefs_are_refused(artifact, depth, match):
    d, edit = artifact
    if depth < 10_000:
        edit(lambda m: m["signature"].__setitem__("in_structure", _nest(depth)))
    else:  # beyond what json itself parses: written by hand
        text = (d / "manifest.json").read_text()
        deep = '{"kind": "list", "children": [' * depth + '{"kind": "leaf"}' + "]}" * depth
        (d / "manifest.json").write_text(text.replace('"in_structure": ', f'"in_structure": {deep}, "x": ', 1))
    with pytest.raises(ArtifactError, match=match):
        jaxaot.export.load(d)


def test_too_many_tree_nodes_are_refused(monkeypatch, artifact):
    monkeypatch.setattr(treedef_json, "MAX_NODES", 50)
    d, edit = artifact
    edit(lambda m: m["signature"].__setitem__(
        "out_structure", {"kind": "list", "children": [{"kind": "none"}] * 100 + [{"kind": "leaf"}]}))
    with pytest.raises(ArtifactError, match="more than 50 nodes"):
        jaxaot.export.load(d)


def test_namedtuple_names_cannot_inject_code(artifact, tmp_path):
    marker = tmp_path / "pwned"
    payload = f"x=__import__('pathlib').Path({str(marker)!r}).touch()"
    d, edit = artifact
    edit(lambda m: m["signature"].__setitem__("out_structure", {
        "kind": "namedtuple", "module": "os", "qualname": "T", "fields": [payload], "children": [{"kind": "leaf"}]}))
    with pytest.raises(ArtifactError):
        jaxaot.export.load(d)
    edit(lambda m: m["signature"].__setitem__("out_structure", {
        "kind": "namedtuple", "module": "os", "qualname": payload, "fields": ["a"], "children": [{"kind": "leaf"}]}))
    with pytest.raises(ArtifactError):
        jaxaot.export.load(d)
    assert not marker.exists()


@pytest.mark.parametrize("field,value", [("saved_outputs", [10**9]), ("grad_inputs", [-1]),
                                         ("cotangent_outputs", ["0"]), ("num_temporaries", -3)])
def test_out_of_range_indices_are_refused_at_load(artifact, field, value):
    d, edit = artifact
    edit(lambda m: m["signature"].__setitem__(field, value))
    with pytest.raises(ArtifactError, match=field):
        jaxaot.export.load(d)


def test_structure_and_specs_must_agree(artifact):
    d, edit = artifact
    edit(lambda m: m["signature"].__setitem__("in_structure", {"kind": "tuple", "children": [{"kind": "leaf"}]}))
    with pytest.raises(ArtifactError, match="in_structure has 1 leaves but there are 3 specs"):
        jaxaot.export.load(d)


def test_oversized_files_are_refused_before_they_are_read(artifact, monkeypatch):
    d, _ = artifact
    monkeypatch.setattr(manifest_mod, "MAX_PROGRAM_BYTES", 100)
    with pytest.raises(ArtifactError, match="MAX_PROGRAM_BYTES=100"):
        jaxaot.export.load(d)
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(ArtifactError, match="more than the limit of 100.*MAX_MANIFEST_BYTES=100"):
        jaxaot.export.load(d)


def test_a_file_larger_than_declared_is_refused(artifact):
    d, _ = artifact
    with open(d / "backward.jaxexport", "ab") as f:
        f.write(b"\0" * 1024)
    with pytest.raises(ArtifactError, match=r"backward.jaxexport is corrupt: it has \d+ bytes"):
        jaxaot.export.load(d)


def test_a_huge_program_file_is_refused_before_it_is_read(artifact):
    # A 2 GiB sparse file where the manifest says a few KB: read whole (20 s, 4.3 GiB) before being refused.
    d, _ = artifact
    declared = json.loads((d / "manifest.json").read_text())["artifacts"]["forward"]["bytes"]
    with open(d / "forward.jaxexport", "wb") as f:
        f.truncate(2 << 30)
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(ArtifactError, match=rf"forward.jaxexport is corrupt: it has {2 << 30} bytes, not the "
                                            rf"{declared} declared by the manifest"):
        jaxaot.export.load(d)
    assert time.perf_counter() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB
