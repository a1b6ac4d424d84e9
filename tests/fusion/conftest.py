"""Fixtures of the fused step's tests: CPU standing in for an accelerator."""

from __future__ import annotations

import jax
import pytest

from jaxaot._src.fusion import step_choice, variants
from platforms import layouts_chosen


@pytest.fixture
def accelerator(monkeypatch):
    """The accelerator's choices on CPU: variants weighed (a byte budget's step measured with pinned layouts), and
    fused and split timed by a fake timer whose
    verdict is ``verdict[0]`` (``"fused"`` or ``"split"``). Each variant compiled and each timing is counted
    in ``seen``. Returns ``(seen, verdict)``."""
    layouts_chosen(monkeypatch)
    monkeypatch.setattr(step_choice, "TIME_CHOICE_PLATFORMS", step_choice.TIME_CHOICE_PLATFORMS | {"cpu"})
    seen, verdict = {"variants": [], "timed": 0}, ["fused"]

    def timer(which, run):
        seen["timed"] += 1
        jax.block_until_ready(run())
        return 1.0 if which == verdict[0] else 2.0

    real = variants._compile_variant

    def compiled(training, name, value_leaf, v, returned, **kw):
        seen["variants"].append((v.layouts, v.order, v.barrier, len(v.rederived)))
        return real(training, name, value_leaf, v, returned, **kw)

    monkeypatch.setattr(step_choice, "step_timer", timer)
    monkeypatch.setattr(variants, "_compile_variant", compiled)
    return seen, verdict
