import os

# Eight CPU devices for the sharding and pipeline tests: XLA reads this once, when
# jax first initialises its backends, so it is set before jax is imported. Tests
# that do not ask for a mesh run on device 0 as before. A count already named in
# XLA_FLAGS is kept: the device-using tests size their meshes and pipelines from
# jax.device_count() (the largest of 1, 2, 4 and 8 that there is), so
# `XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m pytest ...` runs them
# on two; tests/test_device_counts.py does so for a few of them. On a GPU machine
# the flag only concerns the CPU backend: the tests then use the GPUs there are.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

# Exact f32 matmuls on every backend, so that comparisons against JAX's own
# answers are not limited by TF32 on GPUs.
jax.config.update("jax_default_matmul_precision", "highest")


def pytest_report_header(config):
    """The backend and device count the device-using tests size themselves from."""
    return f"jax {jax.__version__}: {jax.device_count()} {jax.default_backend()} devices"


def _slow_cases() -> set:
    """The node ids listed in tests/slow_cases.txt (comments and blank lines left out)."""
    from pathlib import Path

    text = (Path(__file__).with_name("slow_cases.txt")).read_text()
    return {line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()}


def pytest_collection_modifyitems(config, items):
    """Cases listed in tests/slow_cases.txt join the slow suite (the heaviest of each parametrized family)."""
    import pytest

    slow = _slow_cases()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
