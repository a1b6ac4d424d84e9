"""The fused step earns its place: ``jaxaot.value_and_grad`` runs the split executables where fusing loses.

Two reasons make it run the split forward and backward of the same plan:

* time: on the first call, timed (interleaved) against the split step, the fused
  step runs more than ``STEP_TIME_SLACK`` times longer. CPU timing is noise, so
  there the choice is made only with ``step_choice.step_timer`` set: these
  tests set it to a fake timer, and fix which programs peak higher, so that
  they state the same behaviour on every platform;
* peak: its compiled peak is over the plan's byte budget and the split
  programs' is not.

Either way the answers are JAX's, the signature keeps only the executables of
the step that runs, and its ``FusedChoice`` (``runs``, ``why``) says which and why.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.fusion import budget_choice, choose_step, step_choice
from jaxaot._src.partition import StepPeak
from zoo import assert_trees_close, deep_mlp, deep_mlp_args, kept_step


def _split_peaks(monkeypatch, factor: float) -> None:
    """Make the split programs' compiled peaks ``factor`` times the fused step's (fused steps carry their
    ``variant``)."""
    monkeypatch.setattr(step_choice, "compiled_peak",
                        lambda exe: 1000 if hasattr(exe, "variant") else int(factor * 1000))


def _fake_timer(fused: float, split: float):
    calls = []

    def timer(which, run):
        jax.block_until_ready(run())
        calls.append(which)
        return fused if which == "fused" else split

    return timer, calls


def test_choose_step_keeps_fused_within_the_slack():
    assert choose_step([1.01, 1.01, 1.01], [1.0, 1.0, 1.0])[0] == "fused"
    assert choose_step([1.03, 1.05, 1.04], [1.0, 1.0, 1.0])[0] == "split"
    assert "1.04" in choose_step([1.03, 1.05, 1.04], [1.0, 1.0, 1.0])[1]


def test_where_the_ratio_is_too_close_to_the_slack_the_fused_step_must_time_faster():
    spread = [1.0, 1.1, 0.9, 1.05, 0.95]
    slightly_slower = choose_step([1.01 * t for t in spread], spread)  # 1.01x, the spread a tenth
    assert slightly_slower[0] == "split" and "too close to 1.02x to call" in slightly_slower[1]
    slightly_faster = choose_step([0.99 * t for t in spread], spread)
    assert slightly_faster[0] == "fused" and "too close" in slightly_faster[1]
    assert choose_step([1.01] * 5, [1.0] * 5)[0] == "fused"  # no spread: 1.01x is within the slack


def test_short_steps_time_for_a_quarter_second_before_the_choice():
    settled, rounds = step_choice.timing_settled, step_choice.STEP_TIME_ROUNDS
    assert settled([0.1] * rounds, [0.2] * rounds)  # 1.5 s in all
    short = step_choice.STEP_TIME_MIN_SECONDS / (6 * rounds)  # the two steps' fewest rounds: half of it
    assert not settled([short] * rounds, [2 * short] * rounds)
    k = next(k for k in range(rounds, step_choice.STEP_TIME_MAX_ROUNDS + 1) if settled([short] * k, [2 * short] * k))
    assert k in (2 * rounds, 2 * rounds + 1)  # twice the rounds: a quarter second (within a sum's rounding)
    assert settled([1e-6] * step_choice.STEP_TIME_MAX_ROUNDS, [2e-6] * step_choice.STEP_TIME_MAX_ROUNDS)


def test_a_timed_call_waits_for_its_inputs_before_its_clock_starts(monkeypatch):
    events = []

    class Pending:  # an input the caller's earlier work still computes
        def block_until_ready(self):
            events.append("inputs ready")
            return self

    def timer(which, run):
        events.append(f"{which} timed")
        run()
        return 1.0

    monkeypatch.setattr(step_choice, "step_timer", timer)
    seconds, result = step_choice.timed("fused", lambda: events.append("ran") or 7, [Pending()])
    assert (seconds, result) == (1.0, 7) and events == ["inputs ready", "fused timed", "ran"]


def test_timed_rounds_take_turns_going_first():
    orders = [step_choice.timing_order(r) for r in range(4)]
    assert orders == [("fused", "split"), ("split", "fused")] * 2


def test_timing_goes_on_while_the_medians_are_too_close_to_the_slack_to_call(noisy_times):
    settled = step_choice.timing_settled
    rounds, most = step_choice.STEP_TIME_ROUNDS, step_choice.STEP_TIME_MAX_ROUNDS
    assert not settled([1.5] * (rounds - 1), [1.0] * (rounds - 1))  # never before the fewest rounds
    assert settled([1.5] * rounds, [1.0] * rounds) and settled([1.0] * rounds, [1.0] * rounds)
    fused, split, taken = noisy_times
    assert not settled(fused[:rounds], split[:rounds])  # 1.0 against 1.0, each spread by a tenth
    assert rounds < taken < most and not settled(fused[:taken - 1], split[:taken - 1])
    assert choose_step(fused[:taken], split[:taken])[0] == "split"
    near = [1.02, 1.1, 0.94, 1.0], [1.0, 1.08, 0.92, 1.02]  # a spread that never narrows
    assert not any(settled(near[0] * k, near[1] * k) for k in range(2, most // 4))
    assert settled(near[0] * (most // 4 + 1), near[1] * (most // 4 + 1))  # the most rounds end it


def test_a_first_call_times_on_until_the_two_steps_are_told_apart(monkeypatch, noisy_timer):
    calls, rounds = noisy_timer
    _split_peaks(monkeypatch, 0.5)
    args = deep_mlp_args(layers=2, width=16, batch=8)
    f = jaxaot.aot_function(deep_mlp, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    with jaxaot.config.override(tune_in_background=False):
        value, grads = jaxaot.value_and_grad(f, argnums=(0, 1))(*args)
    assert_trees_close((value, grads), jax.value_and_grad(deep_mlp, argnums=(0, 1))(*args))
    choice = kept_step(f, args)
    assert calls.count("fused") == calls.count("split") == rounds > step_choice.STEP_TIME_ROUNDS
    assert calls[:4] == ["fused", "split", "split", "fused"]  # the rounds take turns going first
    assert choice.runs == "split" and f"more than 1.02x; {rounds} calls of each" in choice.why


def test_a_first_call_times_past_the_fewest_rounds_for_a_bounded_while(monkeypatch, noisy_timer):
    calls, rounds = noisy_timer
    monkeypatch.setattr(step_choice, "FIRST_CALL_EXTRA_SECONDS", 0.0)  # its caller waits: one more round at most
    _split_peaks(monkeypatch, 0.5)
    args = deep_mlp_args(layers=2, width=16, batch=8)
    f = jaxaot.aot_function(deep_mlp, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    with jaxaot.config.override(tune_in_background=False):
        got = jaxaot.value_and_grad(f, argnums=(0, 1))(*args)
    assert_trees_close(got, jax.value_and_grad(deep_mlp, argnums=(0, 1))(*args))
    assert calls.count("fused") == calls.count("split") == step_choice.STEP_TIME_ROUNDS + 1 < rounds
    assert kept_step(f, args).runs in ("fused", "split")


@pytest.mark.parametrize("fused_seconds, runs", [(1.5, "split"), (1.0, "fused")])
def test_a_slower_fused_step_runs_split(monkeypatch, fused_seconds, runs):
    timer, calls = _fake_timer(fused_seconds, 1.0)
    monkeypatch.setattr(step_choice, "step_timer", timer)
    _split_peaks(monkeypatch, 0.5)
    args = deep_mlp_args(layers=3, width=32, batch=256)
    f = jaxaot.aot_function(deep_mlp, partition_fn=functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
                                                                     memory_budget=0.5))
    vg = jaxaot.value_and_grad(f, argnums=(0, 1))
    for _ in range(2):  # decided once, on the first call
        value, grads = vg(*args)
        ref_value, ref_grads = jax.value_and_grad(deep_mlp, argnums=(0, 1))(*args)
        assert_trees_close((value, grads), (ref_value, ref_grads))
    choice = kept_step(f, args)
    assert choice.runs == runs and "timed" in choice.why
    assert calls.count("fused") == calls.count("split") == step_choice.STEP_TIME_ROUNDS
    entry = f.cache_info().entries[0]
    assert {"fused", "forward", "backward"} <= set(entry.compiles)  # both compiled, the loser dropped
    assert entry.fused == (choice,)


def test_a_timed_fused_win_drops_the_split_pair_and_its_hot_path(monkeypatch):
    timer, _ = _fake_timer(1.0, 1.0)
    monkeypatch.setattr(step_choice, "step_timer", timer)
    _split_peaks(monkeypatch, 0.5)
    args = deep_mlp_args(layers=2, width=16, batch=8)
    f = jaxaot.aot_function(deep_mlp)
    jaxaot.value_and_grad(f)(*args)
    choice = kept_step(f, args)
    assert choice.runs == "fused"
    suffix = choice.executable.removeprefix("fused")
    (tr,) = f.lookup(args, {}).programs._training.values()
    assert tr.eager_forward is None  # nothing keeps the timed forward alive
    got = jaxaot.value_and_grad(f, fused=False)(*args)  # the split pair, asked for: compiled again, kept beside
    assert_trees_close(got, jax.value_and_grad(deep_mlp)(*args))
    entry = f.cache_info().entries[0]
    assert set(entry.executables) == {name + suffix for name in ("fused", "forward", "backward")}
    assert entry.compiles.count("forward" + suffix) == 2


def test_split_programs_that_peak_higher_are_not_timed(monkeypatch):
    timer, calls = _fake_timer(2.0, 1.0)
    monkeypatch.setattr(step_choice, "step_timer", timer)
    monkeypatch.setattr(step_choice, "free_device_bytes", lambda exe: 1500)  # room for less than the excess
    _split_peaks(monkeypatch, 2.0)
    args = deep_mlp_args(layers=3, width=32, batch=16)
    f = jaxaot.aot_function(deep_mlp, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    assert_trees_close(jaxaot.value_and_grad(f)(*args)[1], jax.grad(deep_mlp)(*args))
    choice = kept_step(f, args)
    assert choice.runs == "fused" and "peak higher" in choice.why and not calls


def test_split_programs_that_peak_higher_are_timed_where_the_device_has_room(monkeypatch):
    timer, calls = _fake_timer(2.0, 1.0)
    monkeypatch.setattr(step_choice, "step_timer", timer)
    monkeypatch.setattr(step_choice, "free_device_bytes", lambda exe: 10_000)  # the 1000 bytes' excess fits
    _split_peaks(monkeypatch, 2.0)
    args = deep_mlp_args(layers=3, width=32, batch=16)
    f = jaxaot.aot_function(deep_mlp, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    assert_trees_close(jaxaot.value_and_grad(f)(*args)[1], jax.grad(deep_mlp)(*args))
    choice = kept_step(f, args)
    assert choice.runs == "split" and "timed" in choice.why and calls


def test_free_device_bytes_is_the_backend_s_word():
    f = jaxaot.aot_function(lambda x: jnp.sum(jnp.sin(x)))
    exe = f.lower(jnp.ones(3)).compile().executables["forward"]
    free = step_choice.free_device_bytes(exe)
    stats = jax.devices()[0].memory_stats()
    assert (free is None) == (not stats or "bytes_limit" not in stats)
    assert free is None or 0 <= free <= stats["bytes_limit"]


def test_without_a_timer_the_cpu_runs_fused_untimed(monkeypatch):
    monkeypatch.setattr(step_choice, "step_timer", None)
    monkeypatch.setattr(step_choice, "TIME_CHOICE_PLATFORMS", frozenset())  # as on CPU, on every platform
    args = deep_mlp_args(layers=2, width=16, batch=8)
    f = jaxaot.aot_function(deep_mlp)
    jaxaot.value_and_grad(f)(*args)
    choice = kept_step(f, args)
    assert choice.runs == "fused" and "not timed" in choice.why
    assert "forward" not in f.cache_info().entries[0].compiles  # the split step was never compiled


def test_a_fused_step_over_the_byte_budget_runs_split(monkeypatch):
    monkeypatch.setattr(step_choice, "step_timer", None)
    args = deep_mlp_args(layers=3, width=32, batch=16)

    def squeezed(joint):  # a plan whose budget the split programs fit and the fused step does not
        part = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.5)
        return dataclasses.replace(part, step_peak=StepPeak(fused=1, forward=1, backward=1, budget=1))

    f = jaxaot.aot_function(deep_mlp, partition_fn=squeezed)
    vg = jaxaot.value_and_grad(f)
    assert_trees_close(vg(*args)[1], jax.grad(deep_mlp)(*args))
    choice = kept_step(f, args)
    assert choice.runs == "split" and "memory_budget" in choice.why
    compiled = vg.lower(*args).compile()
    peaks = [jaxaot._src.partition.compiled_peak(compiled.executables[k]) for k in ("forward", "backward")]
    assert compiled.peak_bytes == max(peaks)


def test_budget_choice():
    plan = StepPeak(fused=900, forward=500, backward=800, budget=1000)
    assert budget_choice(plan, 1100)[0] == "split"
    assert budget_choice(plan, 1000) is None
    assert budget_choice(dataclasses.replace(plan, backward=1200), 1100) is None  # neither fits: stays fused
    assert budget_choice(None, 10**9) is None
    assert budget_choice(StepPeak(fused=900), 1100) is None  # no byte budget


def test_under_a_byte_budget_split_programs_over_it_are_never_timed():
    """Time alone chooses between steps that both fit: where the split programs peak over the byte budget, the
    fused step runs untimed, whatever a timer would say."""
    def training(split_peak):
        peak = StepPeak(fused=900, forward=500, backward=split_peak, budget=1000)
        program = jax.make_jaxpr(jnp.sin)(1.0)  # no effects
        part = SimpleNamespace(step_peak=peak, forward=program, backward=program)
        return SimpleNamespace(partition=part, programs=SimpleNamespace())

    assert "over memory_budget" in step_choice._untimed(training(1200))
    assert step_choice._untimed(training(800)) is None
