"""The fused step's choices made over the calls that follow its first (``jaxaot.config.tune_in_background``).

CPU stands in for an accelerator (the layout and time choices' platform sets include
it, a fake timer decides fused or split), and the compiles begun on worker threads
wait at a gate the test opens, so that the calls before and after they finish are
both seen.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import zoo
from jaxaot._src import workers
from jaxaot._src.compile import cache
from jaxaot._src.fusion import step_choice, tuning, variants
from jaxaot._src.partition import compiled_peak, measure_step_peak
from platforms import layouts_chosen
from zoo import assert_trees_close, kept_step

pytestmark = pytest.mark.skipif(workers.threads() < 2, reason="compiles run on workers only with two or more cores")


def _key(seed):
    return jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0])


@pytest.fixture
def gate(monkeypatch):
    """Compiles on worker threads wait until the event is set (at most a minute: nothing hangs)."""
    opened, real, caller = threading.Event(), cache.compile_lowered, threading.get_ident()

    def gated(lowered):
        if threading.get_ident() != caller:
            opened.wait(timeout=60)
        return real(lowered)

    monkeypatch.setattr(cache, "compile_lowered", gated)
    yield opened
    opened.set()


def _case(name, seed, budget=0.0):
    fn, make_args = zoo.ZOO[name]
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    rng = np.random.default_rng(seed)
    draws = lambda: make_args(_key(int(rng.integers(1 << 30))))  # noqa: E731  (fresh inputs, one signature)
    return jaxaot.aot_function(loss, partition_fn=pf), loss, draws


def _checked_call(f, loss, args):
    argnums = tuple(range(len(args)))
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    assert_trees_close(got, jax.value_and_grad(loss, argnums=argnums)(*args), rtol=1e-4, atol=1e-5)
    return f.lookup(args, {}).programs


#: Calls that run fused and split in turn once both compiled, with a timer that tells them apart at once: the
#: first of each untimed, then ``STEP_TIME_ROUNDS`` of each timed.
_CALLS_TO_DECIDE = 2 * (1 + step_choice.STEP_TIME_ROUNDS)


def _described(choice):
    return choice.layouts, choice.order, choice.barrier, choice.rederived, choice.runs


@pytest.mark.parametrize("verdict", ["fused", "split"])
@pytest.mark.parametrize("name", ["attention", "mlp_gelu"])
def test_the_calls_after_the_first_make_the_first_call_s_choices(accelerator, gate, name, verdict):
    seen, verdicts = accelerator
    verdicts[0] = verdict
    seed = np.random.default_rng().integers(1 << 20)
    with jaxaot.config.override(tune_in_background=False):
        f, loss, draws = _case(name, seed)
        gate.set()
        args = draws()
        programs = _checked_call(f, loss, args)
        assert not programs.tunings and programs.fused_choices["fused"].runs == verdict  # chosen by the first call
        want = _described(kept_step(f, args))
        gate.clear()
    seen["timed"] = 0

    f, loss, draws = _case(name, seed)
    for _ in range(3):  # the variants' and split programs' compiles held at the gate: the base step runs
        programs = _checked_call(f, loss, draws())
        assert programs.fused_choices["fused"].runs is None and "fused" in programs.tunings
        assert programs.compiled == ["fused"] and seen["timed"] == 0
    assert f.cache_info().entries[0].fused[0].runs is None  # the public report says it is not decided
    gate.set()
    programs.tunings["fused"].wait()
    calls = 0
    while programs.tunings:
        args = draws()
        _checked_call(f, loss, args)
        calls += 1
        assert calls <= _CALLS_TO_DECIDE
    assert calls == _CALLS_TO_DECIDE and seen["timed"] == 2 * step_choice.STEP_TIME_ROUNDS
    assert _described(kept_step(f, args)) == want
    for _ in range(2):
        _checked_call(f, loss, draws())
    assert seen["timed"] == 2 * step_choice.STEP_TIME_ROUNDS  # decided: nothing is timed again


def test_calls_that_follow_time_on_until_the_two_steps_are_told_apart(accelerator, gate, noisy_timer):
    timed, rounds = noisy_timer  # (after the accelerator's timer: this one times)
    f, loss, draws = _case("mlp_gelu", np.random.default_rng().integers(1 << 20))
    programs = _checked_call(f, loss, draws())
    gate.set()
    programs.tunings["fused"].wait()
    calls = 0
    while programs.tunings:  # each call's value and gradients are JAX's, whichever step ran it
        _checked_call(f, loss, draws())
        calls += 1
        assert calls <= 2 * (1 + step_choice.STEP_TIME_MAX_ROUNDS)
    assert rounds > step_choice.STEP_TIME_ROUNDS
    assert calls == 2 * (1 + rounds) and timed.count("fused") == timed.count("split") == rounds
    assert timed[:4] == ["fused", "split", "split", "fused"]  # the rounds take turns going first
    assert programs.fused_choices["fused"].runs == "split"


def test_under_a_byte_budget_the_first_call_makes_every_choice(accelerator, gate):
    gate.set()
    f, loss, draws = _case("mlp_gelu", np.random.default_rng().integers(1 << 20), budget=1 << 40)
    programs = _checked_call(f, loss, draws())
    assert not programs.tunings and programs.fused_choices["fused"].runs in ("fused", "split")


@pytest.mark.parametrize("name", ["attention", "mlp_gelu"])
def test_under_a_byte_budget_the_step_runs_pinned_as_measured_and_weighs_only_the_barrier(accelerator, gate, name):
    seen, _ = accelerator
    gate.set()
    fn, make_args = zoo.ZOO[name]
    args = make_args(_key(np.random.default_rng().integers(1 << 20)))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    argnums = tuple(range(len(args)))
    # A budget between the fraction 0 and fraction 1 plans' peaks, as the search measures them: pinned.
    joint = jaxaot.partition.trace_joint(loss, *args)
    mincut = jaxaot.partition.min_cut_rematerialization_partition
    low, high = (measure_step_peak(mincut(joint, memory_budget=b), joint, split=False).fused
                 for b in (0.0, 1.0))
    f = jaxaot.aot_function(loss, partition_fn=functools.partial(mincut, memory_budget=(low + high) // 2))
    programs = _checked_call(f, loss, args)
    choice = programs.fused_choices["fused"]
    assert choice.layouts == "pinned" and not programs.tunings
    # The step is the search's pinned executable: neither XLA's layouts nor pinned ones compile again.
    assert all(layouts == "pinned" and barrier == "none" for layouts, _, barrier, _ in seen["variants"])
    assert choice.runs == "fused" and compiled_peak(programs.executables["fused"]) <= (low + high) // 2


def test_a_platform_that_weighs_no_variant_has_nothing_to_tune(monkeypatch, gate):
    layouts_chosen(monkeypatch, False)  # as on a CPU, on every platform
    monkeypatch.setattr(step_choice, "TIME_CHOICE_PLATFORMS", frozenset())
    monkeypatch.setattr(step_choice, "step_timer", None)
    gate.set()
    f, loss, draws = _case("mlp_gelu", np.random.default_rng().integers(1 << 20))
    programs = _checked_call(f, loss, draws())  # no variant, no timing
    assert not programs.tunings and programs.fused_choices["fused"].runs == "fused"


def test_threads_calling_while_the_choices_are_made_get_jax_s_gradients_and_compile_each_program_once(
        accelerator, gate):
    f, loss, draws = _case("mlp_gelu", np.random.default_rng().integers(1 << 20))
    inputs = [draws() for _ in range(8)]
    errors, started = [], threading.Barrier(4)

    def work(i):
        try:
            started.wait(timeout=60)
            for k in range(12):
                if i == 0 and k == 2:
                    gate.set()  # the compiles finish while the threads call
                _checked_call(f, loss, inputs[(i + k) % len(inputs)])
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    programs = f.lookup(inputs[0], {}).programs
    if programs.tunings:  # fewer calls than the timing takes followed the compiles: the next calls decide
        zoo.finish_tuning(f, inputs[0])
    info = f.cache_info()
    assert info.duplicates == () and info.entries[0].fused[0].runs in ("fused", "split")


def test_a_device_without_room_for_a_compile_beside_the_step_decides_on_the_first_call(monkeypatch, accelerator,
                                                                                    gate):
    gate.set()
    room = []

    def free(exe):
        room.append(tuning.compile_bytes(exe.program, tuning.platform_of(exe)) + (tuning.compiled_peak(exe) or 0))
        return room[-1] - 1  # one byte short of the step's peak and a compile's autotuning

    monkeypatch.setattr(tuning, "free_device_bytes", free)
    f, loss, draws = _case("attention", np.random.default_rng().integers(1 << 20))
    programs = _checked_call(f, loss, draws())
    assert room and not programs.tunings and programs.fused_choices["fused"].runs in ("fused", "split")
    monkeypatch.setattr(tuning, "free_device_bytes", lambda exe: room[0])  # just enough: weighed later
    gate.clear()  # the variants' compiles wait, so the first call returns before they are all in
    g, loss, draws = _case("attention", np.random.default_rng().integers(1 << 20))
    programs = _checked_call(g, loss, draws())
    assert "fused" in programs.tunings
    gate.set()
    zoo.finish_tuning(g, draws())


def test_an_error_of_a_later_choice_is_raised_once_and_the_step_kept_so_far_goes_on(monkeypatch, accelerator,
                                                                                   gate):
    raised = []

    def failing(auto, pinned):
        raised.append(True)
        raise RuntimeError("a layout rule that fails")

    monkeypatch.setattr(variants, "choose_layouts", failing)
    f, loss, draws = _case("mlp_gelu", np.random.default_rng().integers(1 << 20))
    programs = _checked_call(f, loss, draws())
    tuning_ = programs.tunings["fused"]
    gate.set()
    with pytest.raises(RuntimeError, match="a layout rule that fails"):
        tuning_.wait()
    tuning_.wait()  # raised once: the chain has ended, the split programs' compiles go on
    calls = 0
    while programs.tunings:  # the split programs and the timing go on with the step kept so far
        _checked_call(f, loss, draws())
        calls += 1
        assert calls <= _CALLS_TO_DECIDE + 1
    assert raised == [True] and kept_step(f, draws()).layouts == "auto"


def test_a_step_that_donates_its_inputs_is_weighed_later_and_never_timed(accelerator, gate):
    seen, _ = accelerator
    fn, make_args = zoo.ZOO["mlp_gelu"]
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.0)
    f = jaxaot.aot_function(loss, partition_fn=pf, donate_argnums=0)
    rng = np.random.default_rng()
    draws = lambda: make_args(_key(int(rng.integers(1 << 30))))  # noqa: E731
    argnums = (0,)

    def call():  # the reference first: the donated input is gone after the step
        args = draws()
        want = jax.value_and_grad(loss, argnums=argnums)(*args)
        assert_trees_close(jaxaot.value_and_grad(f, argnums=argnums)(*args), want, rtol=1e-4, atol=1e-5)
        return f.lookup(draws(), {}).programs

    programs = call()
    (tuning_,) = programs.tunings.values()  # one gradient mask's step: the first argument's leaves
    gate.set()
    tuning_.wait()
    programs = call()  # the chain done: a step that donates is not timed, so this call decides
    (choice,) = f.cache_info().entries[0].fused
    assert not programs.tunings and choice.runs == "fused" and "donates" in choice.why and seen["timed"] == 0
    call()
