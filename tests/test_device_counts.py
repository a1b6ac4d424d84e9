"""The device-using tests pass on 1, 2 and 4 devices, not only on the 8 that tests/conftest.py gives.

Each count runs a fresh pytest over a few representative tests (a 2-D tensor-parallel
mesh, a data-parallel one with the min-cut partitioner, a sharded export, an
interleaved pipeline, pipeline stages on sub-meshes, a compiled pipeline, a sharded fused step) with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` on the CPU backend, and reads its
JUnit report: none fails, and only the sharded export, which needs two devices, skips
on one. The tests themselves size their meshes and pipelines from
``jax.device_count()``; this checks that they still do. Each count takes about half a
minute (a fresh jax and a dozen small compilations).
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from zoo import child_env

ROOT = Path(__file__).resolve().parents[1]
SHARDED_EXPORT = ["tests/artifacts/test_export_sharded.py::test_gradients_match_jit_and_keep_shardings"
                  "[megatron-auto-bytes]"]
SHARDINGS = "tests/runtime/test_shardings.py::test_value_and_grad_matches_jit_under_the_same_shardings"
REPRESENTATIVE = [
    f"{SHARDINGS}[tensor_parallel-default]",
    f"{SHARDINGS}[data_parallel-min_cut]",
    "tests/parallel/test_pipeline.py::test_pipeline_equals_value_and_grad[mlp-4-interleaved-4]",
    "tests/parallel/test_pipeline.py::test_sub_mesh_stages_with_sharded_parameters",
    "tests/parallel/test_compiled_pipeline.py::test_schedules_equal_value_and_grad_on_stage_and_data_meshes"
    "[mlp-interleaved-False]",
    "tests/partition/test_step_residual_slices.py::test_sliced_fused_step_on_a_mesh_keeps_gradient_shardings",
    *SHARDED_EXPORT,
]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_representative_device_tests_pass_on(count, tmp_path):
    report = tmp_path / "report.xml"
    env = dict(child_env(), XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", *REPRESENTATIVE, "-m", "slow or not slow", "-n", "0",
                           "-p", "no:cacheprovider",
                           "-rs", f"--junit-xml={report}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f": {count} cpu devices" in proc.stdout, tail  # conftest kept the count it was given
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped = int(suite.get("skipped"))
    assert proc.returncode == 0 and failed == 0, tail
    assert tests == len(REPRESENTATIVE), tail  # every node id was found and ran
    assert skipped == (len(SHARDED_EXPORT) if count < 2 else 0), tail
