"""A byte budget's first step compiles the chosen plan's fused step once: the runtime runs the search's executable.

The search compiles each plan it measures; where it compiled with the backend's own
options (on CPU the tests set them, as on accelerators), the runtime's compile of the
chosen plan's fused step is the same XLA work and takes the measuring executable
instead; where it compiled with cheaper ones (CPU), that executable runs until the
runtime's own compile, on a worker, replaces it. Counted here by the HLO each ``Lowered.compile`` compiles; gradients are
checked against ``jax.value_and_grad`` on fresh random inputs.
"""

from __future__ import annotations

import collections
import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import platforms
from jaxaot._src.fusion import fused_exe, run_fused
from jaxaot._src.partition import compiled_peak, measure_step_peak, measured_executables
from jaxaot._src.partition.budget import compile_count, search, step_peak
from zoo import assert_trees_close, scanned_mlp

mincut = jaxaot.partition.min_cut_rematerialization_partition


def _args(seed, layers=3, width=32, batch=64):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (layers, width, width)) / 7, jax.random.normal(k2, (batch, width))


def _between_the_ends(loss, args):
    """A byte budget between the fraction 0 and fraction 1 plans' fused peaks (the search measures several)."""
    joint = jaxaot.partition.trace_joint(loss, *args)
    low, high = (measure_step_peak(mincut(joint, memory_budget=b), joint, split=False).fused for b in (0.0, 1.0))
    assert low < high
    return (low + high) // 2


@pytest.fixture
def compiles(monkeypatch):
    """The HLO text of every step program compiled from here on (the measurements' and the runtime's, both
    ``jit(run)``; not op timings), and a fresh peak cache (no plan measured yet)."""
    texts: list[str] = []
    real = jax.stages.Lowered.compile

    def counted(self, *a, **k):
        text = self.as_text()
        if text.startswith("module @jit_run"):
            texts.append(text)
        return real(self, *a, **k)

    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())
    measured_executables.clear()
    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    yield texts
    measured_executables.clear()


def _defaults(monkeypatch):
    """Measure with the backend's own options, as on accelerators (CPU's cheaper ones are not the runtime's),
    every plan afresh (none of the peaks :func:`_between_the_ends` measured cached)."""
    monkeypatch.setattr(step_peak, "MEASURE_OPTIONS", {})
    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())


def test_the_chosen_plan_s_fused_step_compiles_once(monkeypatch, compiles):
    budget = _between_the_ends(scanned_mlp, _args(0))
    _defaults(monkeypatch)
    monkeypatch.setattr(search, "AHEAD_FROM_THREADS", float("inf"))  # counted: the compiles the search reads
    compiles.clear()
    before, held = compile_count(), measured_executables.counts()
    f = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
    vg = jaxaot.value_and_grad(f, argnums=(0, 1))
    args = _args(1)
    assert_trees_close(vg(*args), jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*args), rtol=1e-4, atol=1e-5)
    measured = compile_count() - before
    assert measured >= 2  # the search measured several plans, and kept only the chosen one's executable
    after = measured_executables.counts()
    assert (after.kept - held.kept, after.taken - held.taken, after.held) == (measured, 1, 0)
    assert len(compiles) == len(set(compiles)), "a program compiled twice"
    if jax.default_backend() == "cpu":  # one fused program, no variants: the measurements were all the compiles
        assert len(compiles) == measured
    fresh = _args(2)  # the executable taken runs the step, on other inputs too
    assert_trees_close(vg(*fresh), jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*fresh), rtol=1e-4, atol=1e-5)
    assert vg.lower(*fresh).compile().peak_bytes <= budget


def test_a_last_measurement_compiled_as_the_runtime_does_is_the_chosen_plan_s_only_compile(monkeypatch, compiles):
    """On CPU, where the search measures cheaply, the last plan it may measure before any fits compiles with the
    runtime's own options: where it fits, the runtime takes its executable, and the chosen plan compiles once."""
    if jax.default_backend() not in step_peak.MEASURE_OPTIONS:
        pytest.skip(f"{jax.default_backend()} has no cheaper measuring options: every measurement is the runtime's")
    budget = _between_the_ends(scanned_mlp, _args(7))
    monkeypatch.setattr(step_peak, "_CACHE", collections.OrderedDict())
    monkeypatch.setattr(search, "MAX_MEASURED", 2)  # the plan measured after the top one is the last
    monkeypatch.setattr(search, "AHEAD_FROM_THREADS", float("inf"))
    compiles.clear()
    held = measured_executables.counts()
    f = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
    vg = jaxaot.value_and_grad(f, argnums=(0, 1))
    want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))
    args = _args(8)
    assert_trees_close(vg(*args), want(*args), rtol=1e-4, atol=1e-5)
    after = measured_executables.counts()
    assert (after.taken - held.taken, after.held) == (1, 0)
    assert len(compiles) == len(set(compiles)) == 2, "the chosen plan compiled again"
    fresh = _args(9)
    assert_trees_close(vg(*fresh), want(*fresh), rtol=1e-4, atol=1e-5)
    assert vg.lower(*fresh).compile().peak_bytes <= budget


def test_a_plan_measured_with_cheaper_options_runs_until_the_runtime_s_compile_replaces_it(monkeypatch, compiles):
    """On CPU the search measures with cheaper options than the runtime's: the chosen plan's executable is held as
    provisional and runs the first steps while the runtime's own compile of the same program finishes on a worker,
    which then replaces it. Every step equals jax.value_and_grad."""
    if jax.default_backend() not in step_peak.MEASURE_OPTIONS:
        pytest.skip(f"{jax.default_backend()} has no cheaper measuring options: its measurements compile as the "
                    f"runtime does")
    from jaxaot._src.compile.cache import Provisional

    budget = _between_the_ends(scanned_mlp, _args(3))
    compiles.clear()
    held, taken = measured_executables.counts(), []
    real_take = measured_executables.take_provisional
    monkeypatch.setattr(measured_executables, "take_provisional", lambda *a: taken.append(real_take(*a)) or taken[-1])
    f = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
    vg = jaxaot.value_and_grad(f, argnums=(0, 1))
    want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))
    args = _args(4)
    with jaxaot.config.override(provisional_steps=True):
        assert_trees_close(vg(*args), want(*args), rtol=1e-4, atol=1e-5)
    after = measured_executables.counts()
    assert after.taken == held.taken + 1 and after.held == 0  # the chosen plan's taken, the others released
    (exe,) = [e for n, e in f.lookup(args, {}).programs.executables.items() if n.startswith("fused")]
    provisional, (cheap,) = exe.executable, taken
    assert isinstance(provisional, Provisional) and cheap is not None
    final = provisional.final.result()  # the runtime's own compile, on a worker
    assert provisional.executable is final is not cheap
    assert len(compiles) > len(set(compiles))  # the chosen plan, measured cheaply, compiled again to run
    assert compiled_peak(final) <= compiled_peak(cheap) <= budget
    for seed in (5, 6):  # the runtime's executable runs the steps that follow
        fresh = _args(seed)
        assert_trees_close(vg(*fresh), want(*fresh), rtol=1e-4, atol=1e-5)


def test_without_provisional_steps_every_call_runs_the_runtime_s_own_executable(monkeypatch):
    """By default (``jaxaot.config.provisional_steps`` off) the runtime compiles its own executable before the first
    step, and the search's cheaper one is never run: every call of a process gives the same bits as a process that
    compiled in turn, whatever the timing."""
    if jax.default_backend() not in step_peak.MEASURE_OPTIONS:
        pytest.skip(f"{jax.default_backend()} has no cheaper measuring options: no provisional executable exists")
    from jaxaot._src.compile.cache import Provisional

    budget = _between_the_ends(scanned_mlp, _args(3))
    taken = []
    real_take = measured_executables.take_provisional
    monkeypatch.setattr(measured_executables, "take_provisional", lambda *a: taken.append(real_take(*a)) or taken[-1])
    outs = []
    for _ in range(2):
        f = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
        vg = jaxaot.value_and_grad(f, argnums=(0, 1))
        outs.append([vg(*_args(seed)) for seed in (7, 8)])
        (exe,) = [e for n, e in f.lookup(_args(7), {}).programs.executables.items() if n.startswith("fused")]
        assert not isinstance(exe.executable, Provisional)
    assert not taken
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))
    assert_trees_close(outs[0][1], want(*_args(8)), rtol=1e-4, atol=1e-5)


def test_a_provisional_executable_stays_where_the_runtime_s_compile_fails():
    from jaxaot._src.compile.cache import Provisional

    failed, done = concurrent.futures.Future(), concurrent.futures.Future()
    kept = Provisional(lambda *a: ("cheap", a), failed)
    swapped = Provisional(lambda *a: ("cheap", a), done)
    failed.set_exception(RuntimeError("compile failed"))
    done.set_result(lambda *a: ("final", a))
    assert kept(1) == ("cheap", (1,)) and swapped(1) == ("final", (1,))


def _returns_an_input(w, x):
    return scanned_mlp(w, x), x


def test_an_input_returned_unchanged_is_no_output_of_the_program_measured(monkeypatch, compiles):
    """The runtime hands such an output back without computing it; the search measures the same program."""
    budget = _between_the_ends(_returns_an_input, _args(12))
    _defaults(monkeypatch)
    f = jaxaot.aot_function(_returns_an_input, partition_fn=mincut(memory_budget=budget))
    args, taken = _args(13), measured_executables.counts().taken
    (value, aux), grads = jaxaot.value_and_grad(f, argnums=(0, 1), has_aux=True)(*args)
    (want_value, want_aux), want = jax.value_and_grad(_returns_an_input, argnums=(0, 1), has_aux=True)(*args)
    assert_trees_close((value, grads), (want_value, want), rtol=1e-4, atol=1e-5)
    assert aux is not args[1]  # a new array of its value, as jit returns
    assert_trees_close(aux, want_aux, rtol=0, atol=0)
    assert measured_executables.counts().taken == taken + 1
    assert len(compiles) == len(set(compiles))


def _two_losses(w, x):
    return scanned_mlp(w, x), jnp.mean(jnp.sin(x @ w[0]))


def test_a_step_of_another_loss_compiles_its_own_program(monkeypatch, compiles):
    """The search measures the step whose loss is the first output; the step of the second is another program."""
    budget = _between_the_ends(_two_losses, _args(5))
    _defaults(monkeypatch)
    f = jaxaot.aot_function(_two_losses, partition_fn=mincut(memory_budget=budget))
    args = _args(6)
    tr = f.lookup(args, {}).programs.training()
    assert tr.partition.step_peak.budget == budget and measured_executables.counts().held == 1
    compiles.clear()
    outs, grads = run_fused(tr, list(jax.tree.leaves(args)), value_leaf=1)
    assert len(compiles) >= 1 and measured_executables.counts().held == 1  # compiled, the held one not taken
    want = jax.grad(lambda *a: _two_losses(*a)[1], argnums=(0, 1))(*args)
    assert_trees_close(grads, list(want), rtol=1e-4, atol=1e-5)
    compiles.clear()
    fused_exe(tr, value_leaf=0)
    assert measured_executables.counts().held == 0  # the first loss's step is the one measured: taken
    if jax.default_backend() == "cpu":
        assert not compiles


def test_a_donating_step_compiles_its_own_program(monkeypatch, compiles):
    """Donated inputs make another executable than the measurement's, which donates nothing."""
    budget = _between_the_ends(scanned_mlp, _args(7))
    _defaults(monkeypatch)
    f = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget), donate_argnums=(1,))
    args = _args(8)
    want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*args)
    compiles.clear()
    taken, before = measured_executables.counts().taken, compile_count()
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(args[0], jnp.array(args[1]))
    assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
    assert measured_executables.counts().taken == taken and measured_executables.counts().held == 1
    assert len(compiles) >= compile_count() - before + 1  # the chosen plan compiled again, donating


def test_a_refused_budget_holds_nothing(monkeypatch, compiles):
    _defaults(monkeypatch)
    joint = jaxaot.partition.trace_joint(scanned_mlp, *_args(9))
    with pytest.raises(jaxaot.errors.MemoryBudgetError):
        mincut(joint, memory_budget="1KiB")
    assert measured_executables.counts().held == 0


def _program(c):
    return jax.make_jaxpr(lambda x: x * c)(jnp.ones(3))


def test_only_the_same_program_on_the_same_inputs_takes_it():
    measured_executables.clear()
    avals = [jax.ShapeDtypeStruct((3,), jnp.float32)]
    one, two = np.arange(3.0, dtype=np.float32), np.arange(1.0, 4.0, dtype=np.float32)
    kept, exe = _program(one), object()
    assert str(kept) == str(_program(two))  # the consts differ, not the text
    measured_executables.keep(kept, avals, {}, exe)
    assert measured_executables.take(_program(two), avals, {}) is None
    assert measured_executables.take(_program(one), [jax.ShapeDtypeStruct((3,), jnp.bfloat16)], {}) is None
    assert measured_executables.take(_program(one), avals, {"xla_backend_optimization_level": 0}) is None
    assert measured_executables.take(_program(one), avals, {}, donated=(0,)) is None
    with jax.default_matmul_precision("bfloat16"):
        assert measured_executables.take(_program(one), avals, {}) is None
    assert measured_executables.take(_program(one.copy()), avals, {}) is exe  # equal consts, bit for bit
    assert measured_executables.take(_program(one), avals, {}) is None  # handed out once


def test_at_most_a_few_executables_are_held():
    measured_executables.clear()
    avals = [jax.ShapeDtypeStruct((3,), jnp.float32)]
    programs = [_program(np.full(3, i, np.float32)) for i in range(measured_executables.LIMIT + 2)]
    for p in programs:
        measured_executables.keep(p, avals, {}, object())
    assert measured_executables.counts().held == measured_executables.LIMIT
    assert measured_executables.take(programs[0], avals, {}) is None  # the oldest went first
    measured_executables.release(programs[-1:])
    assert measured_executables.counts().held == measured_executables.LIMIT - 1
    measured_executables.clear()
    assert measured_executables.counts().held == 0


@pytest.mark.parametrize("layouts_chosen", [False, True])
def test_the_executable_taken_is_stored_and_read_back_by_the_persistent_cache(monkeypatch, compiles, tmp_path,
                                                                             layouts_chosen):
    from jaxaot._src.compile import cache

    if layouts_chosen:  # as on an accelerator: the search measures pinned layouts, the cache keys the step by them
        platforms.layouts_chosen(monkeypatch)
    budget = _between_the_ends(scanned_mlp, _args(10))
    _defaults(monkeypatch)
    args = _args(11)
    want = jax.value_and_grad(scanned_mlp, argnums=(0, 1))(*args)
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        cold = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
        taken = measured_executables.counts().taken
        assert_trees_close(jaxaot.value_and_grad(cold, argnums=(0, 1))(*args), want, rtol=1e-4, atol=1e-5)
        assert measured_executables.counts().taken == taken + 1
        compiles.clear()
        hits = cache.stats().executable_hits
        warm = jaxaot.aot_function(scanned_mlp, partition_fn=mincut(memory_budget=budget))
        assert_trees_close(jaxaot.value_and_grad(warm, argnums=(0, 1))(*args), want, rtol=1e-4, atol=1e-5)
        read = cache.stats().executable_hits - hits  # the plan and its step from disk (on accelerators its variants too)
        assert not compiles and (read == 1 if jax.default_backend() == "cpu" and not layouts_chosen else read >= 1)
