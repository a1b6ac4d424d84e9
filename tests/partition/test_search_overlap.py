"""The byte-budget search compiles on worker threads while it plans, and chooses as measuring in turn does.

Each mode runs the same search afresh (no peak cached): in turn (the private switch off), as this
machine's cores make it (:data:`~jaxaot._src.partition.budget.search.AHEAD_FROM_THREADS`), and working
ahead (planning while the fraction 1 plan compiles, and compiling the next plan alongside). The plans
asked of the min-cut, the peaks read and the plan chosen must be the same, and so must the gradients, bit
for bit, which equal ``jax.value_and_grad`` on fresh random inputs. The measurements use the backend's own
options, so executables are held: only the ones read may be, and the runtime takes the chosen one.
"""

from __future__ import annotations

import collections
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import allowance, workers
from jaxaot._src.partition import MeasuredCosts, measure_step_peak, measured_executables
from jaxaot._src.partition.budget import search, step_peak
from jaxaot._src.partition.costs import op_profile
from jaxaot._src.partition.mincut import rematerialize
from zoo import assert_trees_close, deep_mlp, deep_mlp_args, scanned_mlp

mincut = jaxaot.partition.min_cut_rematerialization_partition

pytestmark = pytest.mark.skipif(workers.threads() < 2, reason="one core: no worker thread to compile on")


def _mlp_args(seed, dtype=jnp.float32):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(k1, (3, 32, 32), dtype) / 7, jax.random.normal(k2, (64, 32), dtype))


def _deep_args(seed):
    return deep_mlp_args(layers=4, width=64, batch=256, seed=seed)


def _between_the_ends(loss, args, op_costs="auto"):
    joint = jaxaot.partition.trace_joint(loss, *args)
    low, high = (measure_step_peak(mincut(joint, memory_budget=b, op_costs=op_costs), joint, split=False).fused
                 for b in (0.0, 1.0))
    if low == high:  # jax 0.11's CPU compiler peaks deep_mlp's two ends alike
        pytest.skip(f"this XLA (jax {jax.__version__}) compiles the min-cut's two ends of {loss.__name__} to one "
                    f"peak ({low} bytes): no byte budget lies between them for a search to compare plans")
    assert low < high
    return (low + high) // 2


MODES = {"in turn": dict(_CONCURRENT=False), "this machine's": {}, "ahead": dict(AHEAD_FROM_THREADS=1)}


def _run(mode, loss, budget, args, monkeypatch):
    """One fresh search in ``mode`` and the first step: the plans asked for, the peaks read, the plan chosen,
    the step's outputs and what the store of measuring executables did."""
    with monkeypatch.context() as m:
        for name, value in MODES[mode].items():
            m.setattr(search, name, value)
        m.setattr(step_peak, "MEASURE_OPTIONS", {})
        m.setattr(step_peak, "_CACHE", collections.OrderedDict())
        measured_executables.clear()
        asked, read = [], []
        real_at, real_measure = rematerialize._at_fraction, search._Search.measure
        m.setattr(rematerialize, "_at_fraction", lambda joint, f, **k: asked.append((f, k.get("family"))) or
                  real_at(joint, f, **k))

        def measure(self, c, last=False):
            was = c.measured
            real_measure(self, c, last)
            if not was:
                read.append((c.fraction, c.family, c.peak))

        m.setattr(search._Search, "measure", measure)
        before, compiles = measured_executables.counts(), step_peak.compile_count()
        f = jaxaot.aot_function(loss, partition_fn=mincut(memory_budget=budget))
        vg = jaxaot.value_and_grad(f, argnums=(0, 1))
        out = vg(*args)
        part = f.lookup(args, {}).programs.training().partition
        after = measured_executables.counts()
    return dict(asked=asked, read=read, peak=part.step_peak, forward=str(part.forward),
                backward=str(part.backward), out=out, kept=after.kept - before.kept, inflight=len(step_peak._INFLIGHT),
                taken=after.taken - before.taken, held=after.held, compiles=step_peak.compile_count() - compiles)


@pytest.mark.parametrize("name", ["scanned_mlp", pytest.param("deep_mlp", marks=pytest.mark.slow)])
def test_working_ahead_chooses_as_measuring_in_turn(name, monkeypatch):
    loss, make = {"scanned_mlp": (scanned_mlp, _mlp_args), "deep_mlp": (deep_mlp, _deep_args)}[name]
    budget = _between_the_ends(loss, make(0))
    args = make(1)
    runs = {mode: _run(mode, loss, budget, args, monkeypatch) for mode in MODES}
    want = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    first = runs["in turn"]
    assert len(first["read"]) >= 2 and first["peak"].fused <= budget  # the search compared plans
    for mode, run in runs.items():
        for what in ("asked", "read", "peak", "forward", "backward"):
            assert run[what] == first[what], (mode, what)
        for a, b in zip(jax.tree.leaves(run["out"]), jax.tree.leaves(first["out"])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=mode)
        assert_trees_close(run["out"], want, rtol=1e-4, atol=1e-5)
        # only the plans read were held; the runtime took the chosen one's, the search released the others
        assert (run["kept"], run["taken"], run["held"]) == (len(run["read"]), 1, 0), mode
        ahead = mode == "ahead" or (mode != "in turn" and workers.threads() >= search.AHEAD_FROM_THREADS)
        assert 0 <= run["compiles"] - len(run["read"]) <= ahead, mode  # at most one compile unread
        assert run["inflight"] == 0, mode  # and none compiles on past the plan


def test_the_top_plan_compiles_while_the_ops_are_timed(monkeypatch):
    """Timing ops (which the plans below the top one need) begins while the top plan's compile runs, on a
    worker thread; in turn, it would begin only after the top plan's peak is known."""
    costs = MeasuredCosts(jax.devices()[0], path=None)
    budget = _between_the_ends(scanned_mlp, _mlp_args(2), op_costs="flops")
    joint = jaxaot.partition.trace_joint(scanned_mlp, *_mlp_args(3))
    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())
    timing, seen = threading.Event(), []
    real_profile, real_compile = op_profile.profile_many, step_peak._compile

    def profile_many(*a, **k):
        timing.set()
        return real_profile(*a, **k)

    def compile_(lowered, options):
        if not seen:  # the first compile, the top plan's: is anything timed before it is done?
            seen.append((threading.get_ident(), timing.wait(timeout=30)))
        return real_compile(lowered, options)

    monkeypatch.setattr(search, "AHEAD_FROM_THREADS", 1)
    monkeypatch.setattr(op_profile, "profile_many", profile_many)
    monkeypatch.setattr(step_peak, "_compile", compile_)
    part = mincut(joint, memory_budget=budget, op_costs=costs)
    # (ops were asked to be timed; on a GPU their chains may hold more than this tiny budget: then estimated)
    assert part.step_peak.fused <= budget and timing.is_set()
    (thread, overlapped), = seen[:1]
    assert thread != threading.get_ident() and overlapped


@pytest.mark.parametrize("mode", ["in turn", "ahead"])
def test_the_caller_s_precision_and_x64_are_honoured(mode, monkeypatch):
    """Programs are lowered on the calling thread, under its ``jax.default_matmul_precision`` and x64 (both
    thread-local), and the measuring executable is held under them: the runtime, under the same context,
    takes it."""
    texts = []
    real_compile = step_peak._compile
    monkeypatch.setattr(step_peak, "_compile", lambda lowered, options: texts.append(lowered.as_text()) or
                        real_compile(lowered, options))
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        budget = _between_the_ends(scanned_mlp, _mlp_args(4, jnp.float64))
        args = _mlp_args(5, jnp.float64)
        texts.clear()
        run = _run(mode, scanned_mlp, budget, args, monkeypatch)
        want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*args)
    assert texts and all("f64" in t and "HIGHEST" in t for t in texts)
    assert all(leaf.dtype == jnp.float64 for leaf in jax.tree.leaves(run["out"]))
    assert_trees_close(run["out"], want, rtol=1e-10, atol=1e-12)
    assert (run["taken"], run["held"]) == (1, 0)


def test_a_program_asked_for_twice_at_once_compiles_once(monkeypatch):
    """Two threads measuring one program: one compile, both read its peak; only its starter may hold the
    executable."""
    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())
    monkeypatch.setattr(step_peak, "MEASURE_OPTIONS", {})
    gate, compiled = threading.Event(), []
    real_compile = step_peak._compile

    def compile_(lowered, options):
        compiled.append(1)
        gate.wait(timeout=60)
        return real_compile(lowered, options)

    monkeypatch.setattr(step_peak, "_compile", compile_)
    closed = jax.make_jaxpr(lambda x: jnp.sin(x) @ x)(jnp.ones((16, 16)))
    avals = [jax.ShapeDtypeStruct((16, 16), jnp.float32)]
    first = step_peak.start_peak(closed, avals)
    second = step_peak.start_peak(closed, avals)  # the first still compiling
    assert not first.done()
    gate.set()
    measured_executables.clear()
    assert second.peak(keep=True) == first.peak() > 0 and len(compiled) == 1
    assert measured_executables.counts().held == 0  # the joiner holds nothing; the starter did not ask to
    assert step_peak.program_peak(closed, avals) == first.peak() and len(compiled) == 1  # cached


def test_compiles_and_timings_keep_together_to_the_byte_budget(monkeypatch):
    """Under a byte budget the search's compiles (standing in for a GPU's, whose autotuner holds device buffers:
    here each holds 60% of the budget) and the op timings take their bytes from one allowance: two compiles
    never run at once, what runs at once never holds more than the budget, and the plans asked for, the peaks
    read and the choice are those of measuring in turn."""
    budget = _between_the_ends(scanned_mlp, _mlp_args(6))
    args = _mlp_args(7)
    want = _run("in turn", scanned_mlp, budget, args, monkeypatch)
    spans, lock = [], threading.Lock()
    real_holding = allowance.holding

    def holding(nbytes):
        return _Noted(real_holding(nbytes), int(nbytes), spans, lock)

    monkeypatch.setattr(step_peak, "compile_bytes", lambda closed, platform: int(0.6 * budget))
    for module in (step_peak, op_profile):
        monkeypatch.setattr(module, "holding", holding)
    got = _run("ahead", scanned_mlp, budget, args, monkeypatch)
    for what in ("asked", "read", "peak", "forward", "backward"):
        assert got[what] == want[what], what
    compiles = [s for s in spans if s[2] == int(0.6 * budget)]
    assert len(compiles) == got["compiles"] >= 2 and got["inflight"] == 0
    for start, end, nbytes in spans:  # at each admission, what is held beside it
        beside = sum(n for s, e, n in spans if s <= start < e)
        assert beside <= budget or beside == nbytes, (nbytes, beside, budget)
    assert_trees_close(got["out"], jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*args), rtol=1e-4, atol=1e-5)


class _Noted:
    """A hold that notes ``(admitted, released, bytes)`` in ``spans`` (monotonic clock)."""

    def __init__(self, inner, nbytes, spans, lock):
        self.inner, self.nbytes, self.spans, self.lock = inner, nbytes, spans, lock

    def __enter__(self):
        self.inner.__enter__()
        self.start = time.monotonic()

    def __exit__(self, *exc):
        end = time.monotonic()
        with self.lock:
            self.spans.append((self.start, end, self.nbytes))
        return self.inner.__exit__(*exc)


def test_a_compile_let_go_of_before_it_begins_is_not_made(monkeypatch):
    """A plan's compile waiting for room in the allowance when its search ends is dropped, not made (and its
    peak not cached); one that another request shares is made, and both read its peak."""
    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())
    monkeypatch.setattr(step_peak, "MEASURE_OPTIONS", {})
    monkeypatch.setattr(step_peak, "compile_bytes", lambda closed, platform: 50)
    compiled = []
    real_compile = step_peak._compile
    monkeypatch.setattr(step_peak, "_compile", lambda lowered, options: compiled.append(1) or
                        real_compile(lowered, options))
    avals = [jax.ShapeDtypeStruct((16, 16), jnp.float32)]
    alone, shared = (jax.make_jaxpr(lambda x, k=k: jnp.sin(x * k) @ x)(jnp.ones((16, 16))) for k in (2.0, 3.0))
    with allowance.allowance(100):
        with allowance.holding(100):  # no room: both compiles wait
            first = step_peak.start_peak(alone, avals)
            second = step_peak.start_peak(shared, avals)
            joined = step_peak.start_peak(shared, avals)
            assert not first.done() and not second.done()
            settled = [threading.Thread(target=p.settle) for p in (first, second)]
            for t in settled:
                t.start()
            time.sleep(0.2)
        for t in settled:
            t.join(timeout=60)
    assert len(compiled) == 1 and not step_peak._INFLIGHT  # the shared one only
    assert joined.peak() > 0 and step_peak.program_peak(shared, avals) == joined.peak() and len(compiled) == 1
    step_peak.program_peak(alone, avals)  # not cached: measured now
    assert len(compiled) == 2
