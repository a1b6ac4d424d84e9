"""An artifact this process cannot run is refused at load, with a typed error naming both sides.

The attack (or accident): an artifact exported for CUDA loaded on a CPU-only
machine, and every call raised a raw ``ValueError``; the jaxlib that wrote an
artifact was never compared with this one.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot.errors import ArtifactError, ArtifactVersionError, InvalidInputError, InvalidValueError


def _fn(x):
    return jnp.sum(jnp.sin(x) * x)


X = jnp.linspace(-1.0, 1.0, 5)
HERE = sorted(C.available_platforms())
FOREIGN = next(p for p in ("tpu", "rocm", "cuda", "cpu") if p not in HERE)


def _edit(d, change):
    m = json.loads((d / "manifest.json").read_text())
    change(m)
    (d / "manifest.json").write_text(json.dumps(m))


def test_a_platform_this_process_lacks_is_refused_at_load(tmp_path):
    d = jaxaot.export.export(_fn, X, platforms=(FOREIGN,)).save(tmp_path / "art")
    with pytest.raises(ArtifactError, match=rf"exported for {FOREIGN}, and this process runs on {', '.join(HERE)}: "
                                            r"it cannot run here"):
        jaxaot.export.load(d)


def test_an_artifact_for_several_platforms_loads_where_one_of_them_is(tmp_path):
    d = jaxaot.export.export(_fn, X, platforms=(FOREIGN, C.default_platform())).save(tmp_path / "art")  # X's platform
    f = jaxaot.export.load(d)
    np.testing.assert_allclose(f(X), _fn(X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(X), jax.grad(_fn)(X), rtol=1e-6)


@pytest.mark.skipif(len(HERE) < 2, reason="needs a second platform in this process (a GPU or TPU beside the CPU)")
def test_arrays_on_a_platform_the_program_lacks_are_refused_at_the_call(tmp_path):
    default = C.default_platform()
    other = next(p for p in HERE if p != default)
    f = jaxaot.export.load(jaxaot.export.export(_fn, X, platforms=(other,)).save(tmp_path / "art"))
    with pytest.raises(ArtifactError, match=rf"exported for {other}, but its inputs are on {default}"):
        f(jax.device_put(X, jax.devices()[0]))
    np.testing.assert_allclose(f(jax.device_put(X, jax.devices(other)[0])), _fn(X), rtol=1e-6)


@pytest.fixture
def art(tmp_path):
    return jaxaot.export.export(_fn, X).save(tmp_path / "art")


@pytest.mark.parametrize("written", ["99.1.0", "0.4.30", "unknown"])
def test_a_jaxlib_this_one_cannot_stand_in_for_is_refused(art, written):
    _edit(art, lambda m: m["versions"].__setitem__("jaxlib", written))
    with pytest.raises(ArtifactVersionError, match=rf"written with jaxlib {written}, .*jaxlib {jaxlib.__version__}"):
        jaxaot.export.load(art)
    f = jaxaot.export.load(art, check_versions=False)  # the user's call: the programs themselves are unchanged
    np.testing.assert_allclose(f(X), _fn(X), rtol=1e-6)


def test_an_older_jaxlib_of_the_supported_range_loads(art):
    _edit(art, lambda m: m["versions"].__setitem__("jaxlib", "0.10.0"))
    np.testing.assert_allclose(jaxaot.export.load(art)(X), _fn(X), rtol=1e-6)


@pytest.mark.parametrize("platforms, error, message", [
    ("cpu", InvalidInputError, r"platforms must be None \(this platform\) or a non-empty list or tuple"),
    ((), InvalidInputError, r"platforms must be None"),
    (("CPU",), InvalidValueError, r"platforms names 'CPU', which is none of 'cpu', 'cuda', 'rocm', 'tpu': "
                                  r"did you mean 'cpu'\?"),
    (("gpu",), InvalidValueError, r"did you mean 'cuda' or 'rocm'\?"),
    (("bogus",), InvalidValueError, r"platforms names 'bogus', which is none of .*'tpu'\.$"),
    (("cpu", "tpu", "cpu"), InvalidValueError, r"platforms names 'cpu' more than once"),
])
def test_platforms_are_checked_when_given_not_when_loaded(platforms, error, message):
    """``jax.export`` lowers for any name; a misspelt platform is refused at export, before anything is traced."""
    with pytest.raises(error, match=message):
        jaxaot.export.export(_fn, X, platforms=platforms)
