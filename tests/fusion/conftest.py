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
    # An accelerator says how much memory is free (the CPU does not): room for the split programs to be timed.
    monkeypatch.setattr(step_choice, "free_device_bytes", lambda exe: 1 << 34)
    return seen, verdict


#: Times a GPU step's single calls give: five of each step whose medians sit close to the slack (each spread by a
#: tenth), then calls that tell the two apart (the fused step 1.06x the split one).
_NOISY = ([1.0, 1.1, 0.9, 1.0, 1.05] + [1.06] * 30, [1.0, 0.95, 1.08, 1.0, 0.97] + [1.0] * 30)


@pytest.fixture
def noisy_times():
    """``(fused, split, rounds)``: the scripted times of the two steps, and the rounds of each that
    ``step_choice.timing_settled`` takes on them."""
    fused, split = _NOISY
    rounds = next(k for k in range(1, step_choice.STEP_TIME_MAX_ROUNDS + 1)
                  if step_choice.timing_settled(fused[:k], split[:k]))
    return list(fused), list(split), rounds


@pytest.fixture
def noisy_timer(monkeypatch, noisy_times):
    """Fused and split timed by ``noisy_times``' script (each step's next time; its last once they run out).
    Returns ``(the steps timed, in order; the rounds of each the choice takes)``."""
    fused, split, rounds = noisy_times
    left, calls = {"fused": fused, "split": split}, []

    def timer(which, run):
        jax.block_until_ready(run())
        calls.append(which)
        times = left[which]
        return times.pop(0) if len(times) > 1 else times[0]

    monkeypatch.setattr(step_choice, "step_timer", timer)
    return calls, rounds
