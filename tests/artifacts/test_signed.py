"""Signed artifacts: with ``key=``, anything changed in the manifest or a program is refused at load.

The attack: ``saved_outputs`` permuted between two values of one type loads (no
type check can see it) and gives wrong gradients; a program swapped for another
of the same types, with the manifest's checksums fixed up, loads too. An HMAC
over the manifest, which holds every program's sha256, catches both.
Unsigned loads keep working (and trust their source).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.artifacts import signing
from jaxaot.errors import ArtifactError, InvalidInputError, InvalidValueError
from reliability.hostile import write_program

KEY = secrets.token_bytes(32)


def _fn(x):
    return jnp.sum(jnp.sin(x) * jnp.exp(x))


def _x(seed=0):
    return jax.random.normal(jax.random.key(seed), (4,), jnp.float32)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    return jaxaot.export.export(_fn, _x()).save(tmp_path_factory.mktemp("signed") / "art", key=KEY)


@pytest.fixture
def art(signed, tmp_path):
    d = tmp_path / "art"
    shutil.copytree(signed, d)
    return d


def _edit(d, change):
    m = json.loads((d / "manifest.json").read_text())
    change(m)
    (d / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True))


def _grad_is_right(f) -> bool:
    x = _x(1)
    return bool(np.allclose(jax.grad(f)(x), jax.grad(_fn)(x), rtol=1e-5))


def test_a_signed_artifact_loads_with_its_key_and_without(signed):
    assert (signed / signing.SIGNATURE).is_file()
    assert _grad_is_right(jaxaot.export.load(signed, key=KEY))
    assert _grad_is_right(jaxaot.export.load(signed))  # unsigned loading trusts the source, as before


def test_permuted_saved_outputs_are_refused_with_the_key(art):
    saved = json.loads((art / "manifest.json").read_text())["signature"]["saved_outputs"]
    assert len(saved) >= 2
    _edit(art, lambda m: m["signature"].__setitem__("saved_outputs", [saved[1], saved[0], *saved[2:]]))
    # The attack, without a key: it loads, and the gradients are wrong.
    assert not _grad_is_right(jaxaot.export.load(art))
    with pytest.raises(ArtifactError, match=r"manifest.json does not match its signature \(manifest.hmac\) under the "
                                            r"key given"):
        jaxaot.export.load(art, key=KEY)


def test_a_swapped_program_is_refused_with_the_key(art):
    other = jaxaot.export.export(lambda x: jnp.sum(jnp.sin(2 * x) * jnp.exp(x)), _x()).forward
    write_program(art, "forward", other)  # the manifest's sha256 and size fixed up, as an attacker can
    assert not _grad_is_right(jaxaot.export.load(art))
    with pytest.raises(ArtifactError, match="does not match its signature"):
        jaxaot.export.load(art, key=KEY)


def test_a_program_changed_behind_the_manifest_is_refused_with_or_without_the_key(art):
    data = (art / "forward.jaxexport").read_bytes()
    (art / "forward.jaxexport").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    for key in (KEY, None):
        with pytest.raises(ArtifactError, match="forward.jaxexport is corrupt: it has a sha256 other than the one "
                                                "declared by the manifest"):
            jaxaot.export.load(art, key=key)


def test_another_key_or_no_signature_is_refused(art, tmp_path):
    with pytest.raises(ArtifactError, match="does not match its signature"):
        jaxaot.export.load(art, key=secrets.token_bytes(32))
    (art / signing.SIGNATURE).unlink()
    with pytest.raises(ArtifactError, match=r"is not signed \(it has no manifest.hmac\), but a key was given"):
        jaxaot.export.load(art, key=KEY)
    unsigned = jaxaot.export.export(_fn, _x()).save(tmp_path / "unsigned")
    assert not (unsigned / signing.SIGNATURE).exists()
    with pytest.raises(ArtifactError, match="is not signed"):
        jaxaot.export.load(unsigned, key=KEY)


def test_the_signature_is_checked_before_the_manifest_is_parsed(art):
    (art / "manifest.json").write_text("[" * 100_000)  # would be a NestingError if parsed
    with pytest.raises(ArtifactError, match="does not match its signature"):
        jaxaot.export.load(art, key=KEY)


@pytest.mark.parametrize("key,error", [("secret-string-of-32-characters!!", InvalidInputError), (b"short", InvalidValueError)])
def test_keys_are_bytes_of_at_least_16(tmp_path, key, error):
    exp = jaxaot.export.export(_fn, _x())
    with pytest.raises(error, match="key"):
        exp.save(tmp_path / "a", key=key)
    with pytest.raises(error, match="key"):
        jaxaot.export.load(tmp_path / "a", key=key)
    assert not (tmp_path / "a").exists()


def test_the_tag_covers_every_byte_of_the_manifest(art):
    text = (art / "manifest.json").read_bytes()
    assert signing.sign(KEY, text) == (art / signing.SIGNATURE).read_text().strip()
    assert hashlib.sha256(text).hexdigest() != signing.sign(KEY, text)
    for i in range(0, len(text), max(1, len(text) // 50)):  # any one byte changed
        changed = text[:i] + bytes([text[i] ^ 1]) + text[i + 1:]
        with pytest.raises(ArtifactError, match="does not match its signature"):
            signing.verify(KEY, changed, (art / signing.SIGNATURE).read_bytes(), "manifest.json")
