"""Two processes, one machine: a data-parallel jaxaot step and a compiled pipeline over ``jax.distributed``.

Each worker (``multihost_worker.py``) has 4 CPU devices; together they form
one 8-device mesh, exchange gradients through gloo, and check jaxaot's losses
and gradients against ``jax.jit(jax.value_and_grad(loss))`` and against one
device. The test only launches them and reads their verdicts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo import child_env, free_port, run_processes

WORKER = Path(__file__).with_name("multihost_worker.py")
PIPELINE_WORKER = Path(__file__).with_name("pipeline_multihost_worker.py")
TIMEOUT_S = 120


def _run_two(worker: Path, tmp_path: Path, cache_dir: Path | None = None) -> list[str]:
    """Launch two workers of ``worker`` and return their stdout, after checking both said OK."""
    port = free_port()
    env = dict(child_env(), XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    env.pop("JAXAOT_CACHE_DIR", None)  # each worker compiles for its own process, unless given a cache
    if cache_dir is not None:
        env["JAXAOT_CACHE_DIR"] = str(cache_dir)
    outs = run_processes([[sys.executable, str(worker), str(i), str(port)] for i in range(2)], tmp_path, [env] * 2,
                         TIMEOUT_S)
    for i, out in enumerate(outs):
        assert f"OK process {i}: 8 devices in 2 processes" in out, out
    return outs


def test_two_processes_agree_with_jit_and_one_device(tmp_path):
    outs = _run_two(WORKER, tmp_path)
    losses = [out.rsplit("losses ", 1)[1].split() for out in outs]
    assert losses[0] == losses[1]  # both processes saw the same global step


def test_a_job_started_again_loads_every_program_from_its_cache(tmp_path):
    """Both processes share one cache folder; the second start of the job loads what the first wrote (each
    executable over both processes' devices) and agrees with jit again."""
    _run_two(WORKER, tmp_path, tmp_path / "cache")
    for out in _run_two(WORKER, tmp_path, tmp_path / "cache"):
        stats = out.rsplit("cache CacheStats(", 1)[1].split(")")[0]
        assert "executable_misses=0" in stats and "corrupt=0" in stats and "executable_hits=0" not in stats, stats


def test_compiled_pipeline_across_two_processes_equals_one_process(tmp_path):
    """4 stages x 2 data shards over 2 processes of 4 CPU devices: losses and gradients equal
    jax.value_and_grad of the unpipelined model on one device, for two SGD steps of 1F1B and zero-bubble."""
    outs = _run_two(PIPELINE_WORKER, tmp_path)
    losses = [out.rsplit("pipeline losses ", 1)[1].split() for out in outs]
    assert losses[0] == losses[1] and len(losses[0]) == 4
