"""The persistent compile cache's hooks (jaxaot.config.cache_dir / JAXAOT_CACHE_DIR), in and across processes."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import chex
from zoo import child_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile import cache, cache_keys, compilers, executable_codec, store
from jaxaot.errors import CacheWarning

TOL = dict(rtol=1e-6, atol=1e-6)
CALLS = {"partition": 0, "compile": 0}


def counting_partition(joint):
    CALLS["partition"] += 1
    return jaxaot.partition.default_partition(joint)


def counting_xla(closed, avals, **kwargs):
    CALLS["compile"] += 1
    return compilers.xla(closed, avals, **kwargs)


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _inputs(seed=0, batch=4):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((6, 3), dtype=np.float32)),
            jnp.asarray(rng.standard_normal((batch, 6), dtype=np.float32)))


def _run(fn=loss, seed=0, batch=4, **options):
    """value, grads and inference output of a fresh AOTFunction (one of each program)."""
    options.setdefault("partition_fn", counting_partition)
    options.setdefault("fw_compiler", counting_xla)
    f = jaxaot.aot_function(fn, **options)
    w, x = _inputs(seed, batch)
    value, grads = jax.value_and_grad(f, argnums=(0, 1))(w, x)
    return value, grads, f(w, x)


@pytest.fixture
def cache_dir(tmp_path):
    with jaxaot.config.override(cache_dir=str(tmp_path / "cache")):
        cache.reset_stats()
        CALLS.update(partition=0, compile=0)
        yield tmp_path / "cache"
    cache.reset_stats()


def _files(root: Path, kind: str = "") -> list[Path]:
    return sorted(p for p in (root / f"jaxaot-v{store.FORMAT_VERSION}" / kind).rglob("*.bin"))


def _reset_counts():
    cache.reset_stats()
    CALLS.update(partition=0, compile=0)


# --------------------------------------------------------------------------- in process
@pytest.mark.smoke
def test_second_function_hits_and_runs_neither_partitioner_nor_compiler(cache_dir):
    first = _run()
    assert cache.stats() == cache.CacheStats(partition_misses=1, executable_misses=3)
    assert CALLS == {"partition": 1, "compile": 3}
    assert len(_files(cache_dir, "partitions")) == 1 and len(_files(cache_dir, "executables")) == 3
    _reset_counts()
    second = _run()
    assert cache.stats() == cache.CacheStats(partition_hits=1, executable_hits=3)
    assert CALLS == {"partition": 0, "compile": 0}
    chex.assert_trees_all_close(second, first, **TOL)


def test_cache_off_writes_nothing(tmp_path):
    with jaxaot.config.override(cache_dir=None):
        _reset_counts()
        _run()
        assert cache.stats() == cache.CacheStats()
    assert not any(tmp_path.iterdir())


def test_keys_follow_shapes_partitioner_options_and_consts(cache_dir):
    mincut = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.2)
    _run(partition_fn=mincut)
    _run(partition_fn=functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.8))
    assert cache.stats().partition_misses == 2
    _run(partition_fn=functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.2))
    assert cache.stats().partition_hits == 1
    _reset_counts()
    _run(batch=5)  # another input shape
    assert cache.stats().partition_misses == 1 and cache.stats().executable_misses == 3
    _reset_counts()

    def scaled(c):
        return lambda w, x: jnp.mean(jnp.tanh(x @ (w * c)) ** 2)  # c becomes a const of the programs

    a = _run(scaled(np.full((6, 3), 2.0, np.float32)))
    b = _run(scaled(np.full((6, 3), 3.0, np.float32)))
    assert cache.stats().executable_hits == 0
    assert not np.allclose(a[0], b[0])


def test_uncacheable_programs_still_run(cache_dir, capfd):
    _run(fw_compiler=compilers.nop)  # returns a Python function, not a serializable executable
    assert cache.stats().executable_misses == 3 and cache.stats().skipped == 3
    assert not _files(cache_dir, "executables")

    def noisy(w, x):
        jax.debug.print("noisy {}", 1)
        return loss(w, x)

    _reset_counts()
    _run(noisy)
    _run(noisy)
    # Programs with host callbacks (forward, inference) are never cached: the callbacks must
    # run. The backward has none: it is cached.
    assert cache.stats().executable_hits == 1 and cache.stats().skipped == 4
    assert capfd.readouterr().out.count("noisy 1") == 4


def test_print_jaxpr_prints_on_a_warm_cache(cache_dir, capsys):
    """A compiler run for its print is never served from the cache: a later function (a later process) prints
    its programs again, as it would without a cache, and the partition still comes from the cache."""
    for _ in range(2):
        _reset_counts()
        seed = int(np.random.randint(1 << 20))
        value, grads, _ = _run(fw_compiler=compilers.print_jaxpr, seed=seed)
        printed = capsys.readouterr().out
        assert printed.count("lambda ;") == 3 and "tanh" in printed  # forward, backward and inference programs
        np.testing.assert_allclose(value, loss(*_inputs(seed)), rtol=1e-6)
        assert cache.stats().executable_hits == 0 and not _files(cache_dir, "executables")
    assert cache.stats().partition_hits == 1  # the second function planned from the cache


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[-7] ^= 0x5A
    p.write_bytes(bytes(b))


def _garbage(p: Path) -> None:
    p.write_bytes(b"\x00not a cache entry")


def _bad_payload(p: Path) -> None:  # a valid frame around a payload that does not decode
    p.write_bytes(store.frame(b'{"format": 1, "saved": [["e", 99999, 0]], "summary": {}}'
                              if "partitions" in str(p) else b"\x00\x00\x00\x00junk", store.entry_name(p)))


@pytest.mark.parametrize("corrupt", [_truncate, _flip, _garbage, _bad_payload])
def test_corrupt_entries_warn_once_and_are_rebuilt(cache_dir, corrupt):
    expected = _run()
    files = _files(cache_dir)
    assert len(files) == 4
    for p in files:
        corrupt(p)
    _reset_counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run()
    chex.assert_trees_all_close(got, expected, **TOL)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert sorted(m.split("entry ")[1].split(" (")[0] for m in messages) == [str(p) for p in files]
    here = os.path.realpath(__file__)  # each points at the call that reached the cache, in this file
    assert {os.path.realpath(w.filename) for w in caught if issubclass(w.category, CacheWarning)} == {here}
    assert cache.stats().corrupt == 4 and CALLS == {"partition": 1, "compile": 3}
    _reset_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        chex.assert_trees_all_close(_run(), expected, **TOL)
    assert cache.stats() == cache.CacheStats(partition_hits=1, executable_hits=3)


def test_unwritable_cache_dir_warns_once_and_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with jaxaot.config.override(cache_dir=str(blocker)):
        _reset_counts()
        with pytest.warns(CacheWarning, match="cannot write") as record:
            value, _, _ = _run()
    assert [os.path.realpath(w.filename) for w in record if issubclass(w.category, CacheWarning)] == [
        os.path.realpath(__file__)]
    chex.assert_trees_all_close(value, loss(*_inputs()), **TOL)


# --------------------------------------------------------------------------- across processes
_CHILD = textwrap.dedent(
    """
    import dataclasses, json, os, sys, time
    from pathlib import Path
    import numpy as np, jax, jax.numpy as jnp
    import jaxaot
    from jaxaot._src.compile import cache

    calls = {"partition": 0}
    def counting_partition(joint):
        calls["partition"] += 1
        return jaxaot.partition.default_partition(joint)

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    compiles = []
    def on_event(event, duration, **kw):  # XLA compilations of jaxaot's programs
        if event == "/jax/core/compile/backend_compile_duration" and kw.get("fun_name") == "jit(run)":
            compiles.append(duration)

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((6, 3), dtype=np.float32))
    x = jnp.asarray(rng.standard_normal((4, 6), dtype=np.float32))
    barrier, parties = Path(sys.argv[1]), int(sys.argv[2])
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.time() + 120
    while len(list(barrier.iterdir())) < parties and time.time() < deadline:  # so concurrent children race
        time.sleep(0.002)
    jax.monitoring.register_event_duration_secs_listener(on_event)
    f = jaxaot.aot_function(loss, partition_fn=counting_partition)
    value, grads = jax.value_and_grad(f, argnums=(0, 1))(w, x)
    y = f(w, x)
    print(json.dumps({"stats": dataclasses.asdict(cache.stats()), "partition_calls": calls["partition"],
                      "xla_compiles": len(compiles), "value": float(value), "y": float(y),
                      "grads": [np.asarray(g).tolist() for g in grads]}))
    """
)


def _children(cache_root: Path, n: int) -> list[dict]:
    """Run ``n`` children at once on the cache ``cache_root``; they start computing together."""
    env = dict(child_env(), JAXAOT_CACHE_DIR=str(cache_root))
    barrier = Path(tempfile.mkdtemp(prefix="barrier-", dir=cache_root.parent))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(barrier), str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.fixture(scope="module")
def cold_then_warm(tmp_path_factory):
    root = tmp_path_factory.mktemp("xproc") / "cache"
    (cold,) = _children(root, 1)
    (warm,) = _children(root, 1)
    return cold, warm


def test_cold_process_fills_the_cache(cold_then_warm):
    cold, _ = cold_then_warm
    assert cold["partition_calls"] == 1 and cold["xla_compiles"] == 3
    assert cold["stats"]["partition_misses"] == 1 and cold["stats"]["executable_misses"] == 3


def test_warm_process_runs_neither_partitioner_nor_xla(cold_then_warm):
    cold, warm = cold_then_warm
    assert warm["partition_calls"] == 0 and warm["xla_compiles"] == 0
    assert warm["stats"] == dict(cache.CacheStats(partition_hits=1, executable_hits=3).__dict__)
    assert (warm["value"], warm["y"], warm["grads"]) == (cold["value"], cold["y"], cold["grads"])


def test_concurrent_writers(tmp_path):
    results = _children(tmp_path / "cache", 3)
    assert all(r["grads"] == results[0]["grads"] and r["y"] == results[0]["y"] for r in results)
    files = _files(tmp_path / "cache")
    assert len(files) == 4
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]
    for p in files:  # every entry is whole and decodes in this (another) process
        payload = store.unframe(p.read_bytes(), store.entry_name(p))
        assert payload is not None
        if "executables" in str(p):
            assert executable_codec.decode(payload) is not None
        else:
            assert json.loads(bytes(payload))["saved"]


def counting_min_cut(joint):
    CALLS["partition"] += 1
    return jaxaot.partition.min_cut_rematerialization_partition(joint)


def scanned_loss(w, x):
    def layer(h, wl):
        return jnp.tanh(jnp.sin(h @ wl) * 2.0), None

    h, _ = jax.lax.scan(layer, x @ w, jnp.stack([jnp.eye(3)] * 4))
    return jnp.mean(h**2)


def test_min_cut_scan_rewrite_is_replayed_not_rechosen(cache_dir):
    # min-cut rewrites scan bodies (per-iteration remat) before splitting; the cache stores
    # the rewrite plan, so a second process-alike AOTFunction neither partitions nor compiles.
    assert jaxaot.partition.min_cut_rematerialization_partition(jaxaot.partition.trace_joint(scanned_loss, *_inputs())).primal_plan
    first = _run(scanned_loss, partition_fn=counting_min_cut)
    assert cache.stats().partition_misses == 1 and CALLS["partition"] == 1
    _reset_counts()
    second = _run(scanned_loss, partition_fn=counting_min_cut)
    assert CALLS == {"partition": 0, "compile": 0}
    assert cache.stats().partition_hits == 1 and cache.stats().executable_hits == 3
    chex.assert_trees_all_close(second, first, **TOL)
    want = jax.value_and_grad(scanned_loss, argnums=(0, 1))(*_inputs())
    chex.assert_trees_all_close(second[:2], want, **TOL)


def _count_joint_builds(monkeypatch) -> list:
    """Counts every joint graph jaxaot builds: each jaxaot module's reference to ``build_joint`` is wrapped,
    but the cache key's (it hashes the builder's code)."""
    from jaxaot._src.tracing import joint as joint_module

    original, calls = joint_module.build_joint, []

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("jaxaot") and name != cache_keys.__name__ and getattr(module, "build_joint", None) is original:
            monkeypatch.setattr(module, "build_joint", counting)
    return calls


@pytest.mark.parametrize("memory_budget", [0.5, "1MB"])
def test_a_warm_min_cut_start_builds_one_joint_graph(cache_dir, monkeypatch, memory_budget):
    # The entry is keyed by the primal program, so a hit replays the scan rewrite straight from it:
    # the joint graph as traced is built only when something shows it (lower()).
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=memory_budget)
    args = _inputs(3)
    cold_f = jaxaot.aot_function(scanned_loss, partition_fn=pf)
    cold = jax.value_and_grad(cold_f, argnums=(0, 1))(*args)
    assert cold_f.lower(*args).partition.primal_plan  # the min-cut rewrote the scans
    _reset_counts()
    builds = _count_joint_builds(monkeypatch)
    warm_f = jaxaot.aot_function(scanned_loss, partition_fn=pf)
    warm = jax.value_and_grad(warm_f, argnums=(0, 1))(*args)
    assert cache.stats() == cache.CacheStats(partition_hits=1, executable_hits=2)
    assert len(builds) == 1  # the replayed rewrite's joint graph, not the original's first
    chex.assert_trees_all_close(warm, cold, **TOL)
    chex.assert_trees_all_close(warm, jax.value_and_grad(scanned_loss, argnums=(0, 1))(*args), **TOL)
    warm_low, cold_low = warm_f.lower(*args), cold_f.lower(*args)
    assert len(builds) == 2  # shown: built now
    assert str(warm_low.joint) == str(cold_low.joint)
    assert str(warm_low.partition.forward) == str(cold_low.partition.forward)


def test_a_partitioner_that_returns_no_partition_is_named_and_nothing_is_stored(cache_dir):
    f = jaxaot.aot_function(lambda x: jnp.sum(jnp.sin(x)), partition_fn=lambda joint: None)
    with pytest.raises(jaxaot.errors.PartitionError, match="returned a NoneType, not a jaxaot.partition.Partition"):
        jax.grad(f)(jnp.ones(3))
    assert not _files(cache_dir, "partitions")
    g = jaxaot.aot_function(lambda x: jnp.sum(jnp.sin(x)))   # the cache keeps working
    assert jnp.allclose(jax.grad(g)(jnp.ones(3)), jnp.cos(jnp.ones(3)))


def _rule_loss(saves_output: bool):
    """``sum(tanh(x @ w) ** 2)`` through a ``custom_vjp`` whose forward rule saves the output or the input: one
    primal program, two gradients' programs."""
    @jax.custom_vjp
    def act(z):
        return jnp.tanh(z)

    def fwd(z):
        y = jnp.tanh(z)
        return y, (y if saves_output else z)

    def bwd(saved, g):
        y = saved if saves_output else jnp.tanh(saved)
        return (g * (1 - y * y),)

    act.defvjp(fwd, bwd)
    return lambda w, x: jnp.sum(act(x @ w) ** 2)


def test_a_changed_custom_rule_is_a_partition_miss_not_a_stale_plan(cache_dir):
    """The primal program shows a ``custom_vjp``'s rules only as JAX's wrappers: the key reads their code, so
    a changed rule plans anew (no stale plan, no false corruption) and plans what a cold process plans."""
    w, x = _inputs(3)
    runs = []
    for saves_output in (True, False, True):
        f = jaxaot.aot_function(_rule_loss(saves_output), partition_fn=counting_partition)
        grads = jax.grad(f, argnums=(0, 1))(w, x)
        chex.assert_trees_all_close(grads, jax.grad(_rule_loss(saves_output), argnums=(0, 1))(w, x), **TOL)
        runs.append((cache_keys.canonical_text(f.lower(w, x).forward), cache.stats()))
    with jaxaot.config.override(cache_dir=None):
        cold = cache_keys.canonical_text(jaxaot.aot_function(_rule_loss(False)).lower(w, x).forward)
    assert runs[1][0] == cold and runs[0][0] != cold and runs[2][0] == runs[0][0]
    assert [(s.partition_misses, s.partition_hits, s.corrupt) for _, s in runs] == [(1, 0, 0), (2, 0, 0), (2, 1, 0)]
