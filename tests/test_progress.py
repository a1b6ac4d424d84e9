"""jaxaot._src.progress: logger lines (captured with caplog), tqdm bars on a terminal, and silence when asked."""

import logging
import sys
import types

import pytest

from jaxaot._src import progress as _progress
from jaxaot._src.config import config
from platforms import layouts_chosen


@pytest.fixture
def loud():
    """``jaxaot.config.quiet`` off."""
    with config.override(quiet=False):
        yield


@pytest.fixture
def info(caplog, monkeypatch, loud):
    """The jaxaot logger at INFO, every line shown (no throttling), no terminal, not quiet."""
    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    monkeypatch.setattr(_progress, "_use_bar", lambda: False)
    caplog.set_level(logging.INFO, logger="jaxaot")
    return caplog


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "jaxaot"]


def test_step_lines_say_what_and_how_far(info):
    for i in range(1, 4):
        _progress.step("timing ops", i, 3, f"op {i}")
    assert lines(info) == ["timing ops: 1/3 (op 1)", "timing ops: 2/3 (op 2)", "timing ops: 3/3 (op 3)"]


def test_lines_are_throttled_but_first_and_last_show(info, monkeypatch):
    monkeypatch.setattr(_progress, "INTERVAL", 3600.0)
    for i in range(1, 41):
        _progress.step("timing ops", i, 40)
    assert lines(info) == ["timing ops: 1/40", "timing ops: 40/40"]


def test_counting_without_done_restarts_after_total(info):
    for _ in range(3):
        _progress.step("exporting", total=2)
    _progress.step("timing ops")  # no total: a running count
    assert lines(info) == ["exporting: 1/2", "exporting: 2/2", "exporting: 1/2", "timing ops: 1"]


def test_counters_per_owner(info):
    class Owner:
        pass

    a, b = Owner(), Owner()
    _progress.step("compiling fused variant", total=4, detail="pinned layouts", owner=a)
    _progress.step("compiling fused variant", total=4, detail="pinned layouts", owner=b)
    _progress.step("compiling fused variant", total=4, detail="consume-first order", owner=a)
    _progress.step("x", total=2, owner=3)  # an int cannot be weakly referenced: counted by id
    assert lines(info) == ["compiling fused variant: 1/4 (pinned layouts)",
                           "compiling fused variant: 1/4 (pinned layouts)",
                           "compiling fused variant: 2/4 (consume-first order)", "x: 1/2"]


def test_track_and_task(info):
    assert list(_progress.track(["a", "b"], "reading", describe=str.upper)) == ["a", "b"]
    with _progress.task("compiling") as t:
        pass
    with pytest.raises(RuntimeError), _progress.task("failing"):
        raise RuntimeError
    got = lines(info)
    assert got[:3] == ["reading: 1/2 (A)", "reading: 2/2 (B)", "compiling ..."]
    assert got[3].startswith("compiling: done (") and got[4] == "failing ..." and got[5].startswith("failing: failed (")
    assert t.seconds >= 0


def test_silent_under_config_quiet(info):
    with config.override(quiet=True):
        _progress.step("timing ops", 1, 2)
        list(_progress.track(range(3), "reading"))
        with _progress.task("compiling") as t:
            pass
    assert lines(info) == [] and t.seconds >= 0


def test_silent_when_logging_is_off(caplog, loud):
    caplog.set_level(logging.WARNING, logger="jaxaot")
    assert not _progress.enabled()
    _progress.step("timing ops", 1, 2)
    with _progress.task("compiling"):
        pass
    assert lines(caplog) == []


class FakeBar:
    made = []

    def __init__(self, total=None, desc="", **kw):
        self.total, self.desc, self.n, self.closed, self.postfix = total, desc, 0, False, ""
        FakeBar.made.append(self)

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s

    def close(self):
        self.closed = True


def test_tqdm_bar_on_a_terminal(caplog, monkeypatch, loud):
    caplog.set_level(logging.INFO, logger="jaxaot")
    FakeBar.made = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(isatty=lambda: True, write=lambda s: None,
                                                             flush=lambda: None))
    _progress.step("timing ops", 1, None, "dot")
    _progress.step("compiling fused variant", 1, 2, "pinned")  # another task: the first bar closes
    _progress.step("compiling fused variant", 2, 2, "consume-first")
    ops, variants = FakeBar.made
    assert (ops.desc, ops.total, ops.n, ops.postfix, ops.closed) == ("timing ops", None, 1, "dot", True)
    assert (variants.total, variants.n, variants.postfix, variants.closed) == (2, 2, "consume-first", True)
    assert lines(caplog) == []  # a bar instead of lines


def test_to_stderr_shows_lines_and_restores_the_logger(capsys, loud):
    logger = logging.getLogger("jaxaot")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with _progress.to_stderr():
        with _progress.task("lowering f"):
            pass
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    err = capsys.readouterr().err
    assert "  lowering f ...\n" in err and "  lowering f: done (" in err


# --------------------------------------------------------------------------- the stages that report progress
def test_export_for_several_platforms_reports_each_program(info):
    import jax.numpy as jnp

    import jaxaot

    jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(4), platforms=("cpu", "cuda"))
    got = [m for m in lines(info) if m.startswith("exporting")]
    assert len(got) == 3 and got[0].startswith("exporting: 1/3") and "cpu, cuda" in got[0], got
    assert got[-1].startswith("exporting: 3/3") and "backward" in got[-1]


def test_op_timing_reports_each_op_timed(info):
    import jax
    import jax.numpy as jnp

    from jaxaot._src.partition import MeasuredCosts

    costs = MeasuredCosts(jax.devices()[0], path=None)
    dot = jax.make_jaxpr(jnp.dot)(jnp.ones((64, 64)), jnp.ones((64, 64))).jaxpr.eqns[0]
    costs.seconds(dot)
    got = [m for m in lines(info) if m.startswith("timing ops")]
    assert got[0] == "timing ops: 1 (dot_general(float32[64, 64],float32[64, 64]))", got


def test_fused_variant_compiles_report_each_variant(info, monkeypatch):
    import jax.numpy as jnp

    import jaxaot

    layouts_chosen(monkeypatch)  # CPU too
    f = jaxaot.aot_function(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) ** 2),
                            partition_fn=jaxaot.partition.min_cut_rematerialization_partition(memory_budget=0.0))
    jaxaot.value_and_grad(f)(jnp.ones(100))
    got = [m for m in lines(info) if m.startswith("compiling fused variant")]
    assert got and got[0].startswith("compiling fused variant: 1/4 (pinned layouts, xla order"), got
