"""Bit-identical results across calls, processes and export/load; partitions identical across processes."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest
from zoo import ZOO, child_env, random_cotangents

import jaxaot

NAMES = ("mlp_gelu", "attention", "scan", "checkpoint", "pytree_outputs")
PARTITIONERS = {
    "default": jaxaot.partition.default_partition,
    "min_cut_0": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0),
}


def _digest(tree) -> list[str]:
    out = []
    for x in jax.tree_util.tree_leaves(tree):
        a = np.asarray(x)
        out.append(f"{a.dtype}{list(a.shape)}:" + hashlib.sha256(a.tobytes()).hexdigest()[:24])
    return out


def fingerprint(names=NAMES, partitioners=tuple(PARTITIONERS)) -> dict:
    """Per function and partitioner: digests of outputs and gradients, and the residuals in order."""
    result = {}
    for name in names:
        fn, make_args = ZOO[name]
        args = make_args(jax.random.key(7))
        for pname in partitioners:
            f = jaxaot.aot_function(fn, partition_fn=PARTITIONERS[pname])
            out, res = f.forward(*args)
            grads = f.backward(res, random_cotangents(jax.random.key(8), out))
            low = f.lower(*args)
            result[f"{name}/{pname}"] = {
                "out": _digest(out), "grads": _digest(grads),
                "residuals": [str(r) for r in low.partition.residuals],
                "recomputed": sorted(map(str, getattr(low.partition, "recomputed", ()) or ())),
            }
    return result


_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from reliability.test_determinism import fingerprint
print("FINGERPRINT" + json.dumps(fingerprint()))
"""


def _child_fingerprint(hash_seed: str) -> dict:
    tests = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    env = dict(child_env(), PYTHONHASHSEED=hash_seed, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", _CHILD.format(tests=tests)], env=env, capture_output=True,
                         text=True, timeout=300, cwd=tempfile.gettempdir())
    assert run.returncode == 0, run.stderr[-3000:]
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("FINGERPRINT")][-1]
    return json.loads(line[len("FINGERPRINT"):])


def test_bit_identical_across_calls():
    for name in NAMES:
        fn, make_args = ZOO[name]
        args = make_args(jax.random.key(3))
        f = jaxaot.aot_function(fn)
        first = _digest(jax.value_and_grad(lambda *a: jax.tree_util.tree_leaves(f(*a))[0].sum(),
                                           argnums=0)(*args))
        for _ in range(3):
            again = _digest(jax.value_and_grad(lambda *a: jax.tree_util.tree_leaves(f(*a))[0].sum(),
                                               argnums=0)(*args))
            assert again == first, name
        out1, res1 = f.forward(*args)
        out2, res2 = f.forward(*args)
        assert _digest(out1) == _digest(out2) and _digest(res1.arrays) == _digest(res2.arrays), name


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="bit-identity across processes is promised on CPU")
def test_bit_identical_and_same_partition_across_processes_and_hash_seeds():
    here = fingerprint()
    for seed in ("0", "4242"):
        assert _child_fingerprint(seed) == here, f"PYTHONHASHSEED={seed}"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="bit-identity across export is promised on CPU")
@pytest.mark.parametrize("name", ["mlp_gelu", "attention", "scan"])
def test_bit_identical_across_export_and_load(name, tmp_path):
    fn, make_args = ZOO[name]
    args = make_args(jax.random.key(11))
    f = jaxaot.aot_function(fn)
    loaded = jaxaot.export.load(jaxaot.export.export(f, *args).save(tmp_path / "a"))
    out, res = f.forward(*args)
    cts = random_cotangents(jax.random.key(12), out)
    lout, lres = loaded.forward(*args)
    assert _digest(lout) == _digest(out)
    assert _digest(loaded.backward(lres, cts)) == _digest(f.backward(res, cts))
    assert _digest(loaded(*args)) == _digest(f(*args))
