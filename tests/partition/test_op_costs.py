"""Measured per-op costs: the OpCosts protocol, MeasuredCosts' table and where costs decide.

The knapsack below ``memory_budget=1`` and the offload timeline ask an
``OpCosts`` what an eqn costs. These tests check that FLOP estimates reproduce
the old order exactly, that a cost model which ranks two eqns the other way
round changes the plan (and the gradients stay JAX's), and that measured costs
are timed once per distinct eqn, persisted, and survive a bad table file.
"""

from __future__ import annotations

import functools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import PartitionError
from jaxaot._src import workers
from jaxaot._src.partition import DeviceModel, FlopCosts, MeasuredCosts, OpCosts, Timeline, resolve_costs
from jaxaot._src.partition.costs import cost_model, op_profile
from jaxaot._src.partition.mincut import knapsack, saved_values
from zoo import assert_trees_close
from zoo_models import MODELS

CPU = jax.devices("cpu")[0]


def two_branches(w1, w2, x):
    """Two matmuls with equal FLOPs per output byte (same contraction), of different widths."""
    a = jnp.tanh(x @ w1)  # (32, 64)
    b = jnp.tanh(x @ w2)  # (32, 32)
    return jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(b))


def branch_args(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.normal(k1, (16, 64)), jax.random.normal(k2, (16, 32)), jax.random.normal(k3, (32, 16)))


class WideIsCheap:
    """A synthetic cost model: the 32-wide matmul costs 100x per FLOP what the 64-wide one does."""

    note = "recompute costs: synthetic"

    def __init__(self):
        self.asked = []

    def seconds(self, eqn):
        self.asked.append(eqn.primitive.name)
        slow = eqn.primitive.name == "dot_general" and eqn.outvars[0].aval.shape[-1] == 32
        return cost_model.flops(eqn) * (100.0 if slow else 1.0) * 1e-12


def first_recomputed_width(joint, costs):
    graph = saved_values.build_flow_graph(joint, costs=costs)
    prefix = saved_values.recompute_prefix(graph, 0.5)
    assert prefix.k >= 1
    return graph.values[prefix.order[0]].aval.shape[-1]


def test_flop_costs_reproduce_the_flop_order():
    joint = jaxaot.partition.trace_joint(MODELS["llama_block"].loss, *MODELS["llama_block"].make_args(jax.random.key(0)))
    graph = saved_values.build_flow_graph(joint)
    never, candidates = saved_values._candidates(graph, recompute_loops=False)
    flops = np.array([cost_model.flops(graph.producers[i]) for i in candidates])
    expected = candidates[knapsack.recompute_order(graph.nbytes[candidates], flops)]
    assert len(candidates) > 3
    np.testing.assert_array_equal(saved_values._ordered(graph, candidates)[0], expected)
    assert isinstance(graph.costs, FlopCosts) and isinstance(graph.costs, OpCosts)


def test_costs_that_rank_otherwise_change_the_plan_and_keep_the_gradients():
    args = branch_args(jax.random.key(np.random.randint(1 << 20)))
    joint = jaxaot.partition.trace_joint(two_branches, *args)
    assert first_recomputed_width(joint, FlopCosts()) == 32  # a FLOP tie: the smaller value first
    assert first_recomputed_width(joint, WideIsCheap()) == 64  # measured otherwise: the cheaper one first
    expected = jax.value_and_grad(two_branches, argnums=(0, 1, 2))(*args)
    plans = {}
    for name, costs in [("flops", "flops"), ("synthetic", WideIsCheap())]:
        part_fn = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5, op_costs=costs)
        plans[name] = tuple(sorted(r.aval.shape for r in part_fn(joint).residuals))
        f = jaxaot.aot_function(two_branches, partition_fn=part_fn)
        assert_trees_close(jaxaot.value_and_grad(f, argnums=(0, 1, 2))(*args), expected)
    assert plans["flops"] != plans["synthetic"]


def test_budget_one_prices_nothing():
    costs = WideIsCheap()
    joint = jaxaot.partition.trace_joint(two_branches, *branch_args(jax.random.key(1)))
    part = jaxaot.partition.min_cut_rematerialization_partition(joint, op_costs=costs)
    assert costs.asked == [] and part.cost_note == ""
    part = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.5, op_costs=costs)
    assert costs.asked and part.cost_note == "recompute costs: synthetic"


class RandomCosts:
    """Made-up prices, a fresh random order of the knapsack's items on each draw."""

    note = "recompute costs: random"

    def __init__(self, seed):
        self.rng, self.asked = np.random.default_rng(seed), []

    def seconds(self, eqn):
        self.asked.append(eqn.primitive.name)
        return float(self.rng.exponential())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_budget_zero_prices_nothing_and_cuts_as_every_priced_order_would(name):
    # Every candidate unbanned, the cut closest to the sink recomputes only what the least bytes need, so the
    # knapsack's prefix in any price order (random here) that reaches those bytes leaves the same cut.
    loss, make_args = MODELS[name]
    joint = jaxaot.partition.trace_joint(loss, *make_args(jax.random.key(np.random.randint(1 << 20))))
    costs = RandomCosts(np.random.randint(1 << 20))
    graph = saved_values.build_flow_graph(joint, costs=costs)
    unpriced = saved_values.min_cut(graph, saved_values.budget_bans(graph, saved_values.recompute_prefix(graph, 0.0)))
    assert costs.asked == []
    never, candidates = saved_values._candidates(graph, recompute_loops=True)
    for _ in range(3):
        priced = saved_values._priced_prefix(graph, never, candidates, 0.0)
        cut = saved_values.min_cut(graph, saved_values.budget_bans(graph, priced))
        np.testing.assert_array_equal(np.sort(cut.saved), np.sort(unpriced.saved))
    assert len(candidates) == 0 or costs.asked  # the priced prefixes did ask
    asked = len(costs.asked)
    part = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.0, op_costs=costs)
    assert len(costs.asked) == asked and part.cost_note == ""  # the partitioner at budget 0 prices nothing either


def test_measured_costs_time_each_distinct_eqn_once_and_persist(tmp_path):
    path = tmp_path / "costs.json"
    costs = MeasuredCosts(CPU, path=path, fallback=FlopCosts())
    dots = [e for e in jax.make_jaxpr(lambda a, b, c: (a @ b, a @ b + 1, a @ c))(
        jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64, 128))).jaxpr.eqns if e.primitive.name == "dot_general"]
    times = [costs.seconds(e) for e in dots]
    assert costs.measured == 2 and times[0] == times[1] and all(t > 0 for t in times)
    record = json.loads(path.read_text())
    assert set(record["seconds"]) == {op_profile.signature(dots[0]), op_profile.signature(dots[2]), "<empty kernel>"}
    launch = record["seconds"]["<empty kernel>"]
    assert times[0] == max(record["seconds"][op_profile.signature(dots[0])] - launch,
                           record["seconds"][op_profile.signature(dots[0])] / 100)  # an empty kernel's time less
    assert record["environment"]["jax"] == jax.__version__
    again = MeasuredCosts(CPU, path=path, fallback=FlopCosts())  # another process, say
    assert [again.seconds(e) for e in dots] == times and again.measured == 0
    assert "2 distinct ops timed" in again.note and str(path) in again.note


def test_measured_costs_never_time_fusible_or_value_dependent_eqns():
    costs = MeasuredCosts(CPU, path=None, fallback=FlopCosts())
    sin = jax.make_jaxpr(jnp.sin)(jnp.ones(8)).jaxpr.eqns[0]
    loop = jax.make_jaxpr(lambda x: jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ c[1]),
                                                       (0, x)))(jnp.ones((4, 4))).jaxpr.eqns[0]
    assert costs.seconds(sin) == FlopCosts().seconds(sin)
    assert costs.seconds(loop) == FlopCosts().seconds(loop) and not op_profile.measurable(loop)
    assert costs.measured == 0 and "1 not timeable" in costs.note


def test_a_corrupt_table_warns_and_is_rewritten(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring the op-cost table"):
        costs = MeasuredCosts(CPU, path=path, fallback=FlopCosts())
    dot = jax.make_jaxpr(jnp.dot)(jnp.ones((32, 32)), jnp.ones((32, 32))).jaxpr.eqns[0]
    assert costs.seconds(dot) > 0
    assert sorted(json.loads(path.read_text())["seconds"]) == sorted([op_profile.signature(dot), "<empty kernel>"])


def test_an_unwritable_table_warns_once_and_keeps_measuring(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    costs = MeasuredCosts(CPU, path=blocker / "sub" / "costs.json", fallback=FlopCosts())
    eqns = [jax.make_jaxpr(jnp.dot)(jnp.ones((n, 16)), jnp.ones((16, 16))).jaxpr.eqns[0] for n in (8, 16)]
    with pytest.warns(RuntimeWarning, match="cannot write the op-cost table"):
        assert costs.seconds(eqns[0]) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert costs.seconds(eqns[1]) > 0
    assert costs.measured == 2


def test_profile_seconds_ranks_a_large_matmul_above_a_small_one():
    small, large = (jax.make_jaxpr(jnp.dot)(jnp.ones((n, n)), jnp.ones((n, n))).jaxpr.eqns[0] for n in (32, 512))
    assert op_profile.profile_seconds(large, CPU) > 4 * op_profile.profile_seconds(small, CPU)  # 4096x the FLOPs


def test_profile_many_compiles_together_and_ranks_like_profile_seconds():
    small, large = (jax.make_jaxpr(jnp.dot)(jnp.ones((n, n)), jnp.ones((n, n))).jaxpr.eqns[0] for n in (32, 512))
    sin = jax.make_jaxpr(jnp.sin)(jnp.ones(8)).jaxpr.eqns[0]
    loop = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c @ c, x))(jnp.ones((4, 4))).jaxpr.eqns[0]
    times = op_profile.profile_many([small, loop, large, sin], CPU, threads=2)
    assert times[1] is None and times[3] > 0  # a loop is not timed; a fusible eqn alone is
    assert times[2] > 4 * times[0]  # 4096x the FLOPs


def test_a_timed_chain_holds_no_more_than_the_byte_limit_xla_temporaries_included(monkeypatch):
    # A cumulative sum's chain holds XLA temporaries beside the operands and results the plan counts:
    # under a limit the plan's 8 copies fit but the compiled chain does not, fewer copies are timed.
    from jaxaot._src import allowance
    eqn = jax.make_jaxpr(lambda x: jax.lax.cumsum(x, 0))(jnp.ones((512, 512))).jaxpr.eqns[0]
    limit = 8 * op_profile._run_bytes(eqn) + 1024
    held, run_timing = [], op_profile.run_timing

    def recorded(timing, device, repeats=3):
        held.append((timing.copies, op_profile.held_bytes(timing.many)))
        return run_timing(timing, device, repeats)

    monkeypatch.setattr(op_profile, "run_timing", recorded)
    with allowance.byte_limit(limit):
        assert op_profile.plan_timing(eqn).copies == 8
        seconds = op_profile.profile_many([eqn], CPU)[0]
    assert seconds is not None and seconds > 0
    [(copies, nbytes)] = held
    if nbytes is not None:  # a backend that reports its buffers: the chain kept to the limit
        assert 2 <= copies < 8 and nbytes <= limit
    held.clear()
    limit = op_profile._run_bytes(eqn) + 1024  # two runs do not fit: timed at smaller shapes, kept to the limit
    with allowance.byte_limit(limit):
        assert op_profile.profile_many([eqn], CPU)[0] > 0
    [(copies, nbytes)] = held
    assert nbytes is None or nbytes <= limit


def test_prefetch_times_each_distinct_eqn_once_then_seconds_reads_the_table(tmp_path, monkeypatch):
    calls = []
    real = op_profile.profile_many
    monkeypatch.setattr(op_profile, "profile_many", lambda eqns, *a, **k: calls.append(len(eqns)) or real(eqns, *a, **k))
    costs = MeasuredCosts(CPU, path=tmp_path / "costs.json", fallback=FlopCosts())
    eqns = jax.make_jaxpr(lambda a, b, c: (jnp.sin(a @ b), a @ b + 1, a @ c, jnp.sum(c, axis=0)))(
        jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64, 128))).jaxpr.eqns
    timed = {op_profile.signature(e) for e in eqns
             if cost_model.classify(e) is not cost_model.Recompute.CHEAP and op_profile.measurable(e)}

    @jax.jit
    def traced(x):  # a partitioner may price eqns while a caller traces
        costs.prefetch(eqns)
        return x

    traced(1.0)
    assert calls == [len(timed) + 1] and costs.measured == len(timed) >= 2  # and the empty kernel
    times = [costs.seconds(e) for e in eqns]
    assert costs.measured == len(timed) and calls == [len(timed) + 1] and all(t >= 0 for t in times)
    costs.prefetch(eqns)  # nothing left to time
    assert calls == [len(timed) + 1]
    assert set(json.loads((tmp_path / "costs.json").read_text())["seconds"]) == timed | {"<empty kernel>"}


def test_a_budget_plan_prefetches_its_knapsack_items():
    joint = jaxaot.partition.trace_joint(two_branches, *branch_args(jax.random.key(3)))
    costs = MeasuredCosts(CPU, path=None, fallback=FlopCosts())
    seen = []
    costs.prefetch = lambda eqns: seen.append([e.primitive.name for e in eqns])
    jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.5, op_costs=costs)
    assert seen and "dot_general" in seen[0]


def test_resolve_costs():
    on_accelerator = jax.devices()[0].platform != "cpu"
    assert isinstance(resolve_costs("auto"), MeasuredCosts if on_accelerator else FlopCosts)
    model = DeviceModel(host_bandwidth=1e9, device_flops=5e9, device_bandwidth=1e10)
    assert resolve_costs("auto", model, model_given=True) == FlopCosts(5e9, 1e10)  # a chosen device's rates
    assert resolve_costs("flops", model) == FlopCosts(5e9, 1e10)
    assert isinstance(resolve_costs("measured"), MeasuredCosts)
    synthetic = WideIsCheap()
    assert resolve_costs(synthetic).inner is synthetic and resolve_costs(synthetic).note == synthetic.note
    with pytest.raises(PartitionError, match="op_costs must be"):
        jaxaot.partition.min_cut_rematerialization_partition(
            jaxaot.partition.trace_joint(two_branches, *branch_args(jax.random.key(2))), op_costs="fast")


class BrokenCosts:
    """Prices every eqn alike with one bad answer."""

    note = "recompute costs: broken"

    def __init__(self, answer):
        self.answer = answer

    def seconds(self, eqn):
        return self.answer


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), -1e-3, "fast", None, True])
def test_an_op_costs_answer_that_cannot_be_ordered_is_refused(answer):
    """A NaN price would sort the knapsack arbitrarily: the plan would depend on where it fell."""
    joint = jaxaot.partition.trace_joint(two_branches, *branch_args(jax.random.key(np.random.randint(1 << 20))))
    with pytest.raises(PartitionError, match=r"BrokenCosts.seconds returned .* for the eqn .*finite number"):
        jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.5, op_costs=BrokenCosts(answer))
    fine = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=0.5, op_costs=BrokenCosts(0))
    assert fine.cost_note == "recompute costs: broken"


def test_the_offload_timeline_uses_the_costs():
    joint = jaxaot.partition.trace_joint(two_branches, *branch_args(jax.random.key(3)))
    model = DeviceModel(host_bandwidth=1e9, device_flops=1e12)
    plain, priced = Timeline.of(joint, model), Timeline.of(joint, model, WideIsCheap())
    assert priced.forward_seconds > plain.forward_seconds  # the 32-wide matmul is 100x slower
    assert Timeline.of(joint, model, model.flop_costs).forward_seconds == plain.forward_seconds


@pytest.mark.parametrize("name", ["llama_block", "gpt2_block_2h"])
def test_measured_budgets_stay_monotone_and_match_jax(name):
    model = MODELS[name]
    args = model.make_args(jax.random.key(np.random.randint(1 << 20)))
    joint = jaxaot.partition.trace_joint(model.loss, *args)
    costs = MeasuredCosts(CPU, path=None, fallback=FlopCosts())
    sizes = [jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=b, op_costs=costs).saved_bytes
             for b in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert sizes == sorted(sizes) and costs.measured > 0
    if name == "llama_block":  # float32: compare gradients at float32 tolerances
        part_fn = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5, op_costs=costs)
        f = jaxaot.aot_function(model.loss, partition_fn=part_fn)
        argnums = tuple(range(len(args)))
        assert_trees_close(jaxaot.value_and_grad(f, argnums=argnums)(*args),
                           jax.value_and_grad(model.loss, argnums=argnums)(*args), rtol=5e-5, atol=1e-5)


def test_lower_prints_the_cost_note():
    args = branch_args(jax.random.key(4))
    f = jaxaot.aot_function(two_branches, partition_fn=functools.partial(
        jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5, op_costs="flops"))
    text = str(f.lower(*args).residuals)
    assert "recompute costs: FLOP estimates" in text


def test_the_cost_note_survives_the_persistent_cache(tmp_path):
    from jaxaot._src.compile import cache

    args = branch_args(jax.random.key(5))
    part_fn = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5, op_costs="flops")
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        cache.reset_stats()
        texts = [str(jaxaot.aot_function(two_branches, partition_fn=part_fn).lower(*args).residuals) for _ in range(2)]
        assert cache.stats().partition_hits >= 1
    assert texts[0] == texts[1] and "recompute costs: FLOP estimates" in texts[1]


class WideIsCheapPerByte:
    """Per byte the 64-wide matmul is the cheaper item; in seconds the 32-wide one is."""

    note = "recompute costs: synthetic"

    def seconds(self, eqn):
        if eqn.primitive.name == "dot_general":
            return 1e-6 if eqn.outvars[0].aval.shape[-1] == 64 else 0.9e-6
        return cost_model.flops(eqn) * 1e-15


def test_the_last_step_is_the_cheapest_that_reaches_the_budget():
    """Just below budget 1 the greedy's first item (the 64-wide matmul, cheapest per byte) saves
    more than asked; recomputing the 32-wide one reaches the target in fewer seconds."""
    args = branch_args(jax.random.key(np.random.randint(1 << 20)))
    joint = jaxaot.partition.trace_joint(two_branches, *args)
    costs = WideIsCheapPerByte()
    graph = saved_values.build_flow_graph(joint, costs=costs)
    prefix = saved_values.recompute_prefix(graph, 0.9)
    assert prefix.k == 1 and graph.values[prefix.order[0]].aval.shape == (32, 64)  # the prefix would recompute this
    shapes = {b: sorted(tuple(r.aval.shape) for r in jaxaot.partition.min_cut_rematerialization_partition(
        joint, memory_budget=b, op_costs=costs).residuals) for b in (1.0, 0.9, 0.5, 0.0)}
    assert (32, 32) in shapes[1.0] and (32, 64) in shapes[1.0]
    assert (32, 32) not in shapes[0.9] and (32, 64) in shapes[0.9]  # the cheaper last step instead
    assert (32, 64) not in shapes[0.5]
    part_fn = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.9, op_costs=costs)
    f = jaxaot.aot_function(two_branches, partition_fn=part_fn)
    assert_trees_close(jaxaot.value_and_grad(f, argnums=(0, 1, 2))(*args),
                       jax.value_and_grad(two_branches, argnums=(0, 1, 2))(*args))


def test_loops_are_estimated_not_timed():
    """A scan of layers is the whole forward: it is FLOP-estimated, its body's eqns are timed when planned."""
    eqns = jax.make_jaxpr(lambda w, h, xs: jax.lax.scan(lambda c, x: (jnp.tanh(c @ w + x), c), h, xs))(
        jnp.ones((8, 8)), jnp.ones(8), jnp.ones((4, 8))).jaxpr.eqns
    (scan,) = [e for e in eqns if e.primitive.name == "scan"]
    costs = MeasuredCosts(CPU, path=None, fallback=FlopCosts())
    assert not op_profile.measurable(scan)
    assert costs.seconds(scan) == FlopCosts().seconds(scan) and costs.measured == 0


def test_fallback_costs_measure_compute_rates_alone(monkeypatch):
    """MeasuredCosts' FLOP fallback measures the device's compute rates, never the host-memory probes."""
    from jaxaot._src.partition.costs import device_model

    def no_host_probes(device, rates=None):
        raise AssertionError("the full device model was measured")

    monkeypatch.setattr(device_model, "_measure", no_host_probes)
    monkeypatch.setattr(device_model, "_RATES", {})
    fallback = MeasuredCosts(jax.devices()[0], path=None).fallback
    assert 0 < fallback.device_flops < np.inf and 0 < fallback.device_bandwidth < np.inf
    assert DeviceModel.compute_costs() is fallback  # once per device kind
    monkeypatch.undo()
    monkeypatch.setattr(device_model, "_MEASURED", {})
    monkeypatch.setattr(device_model, "_RATES", {device_model._key(jax.devices()[0]):
                                                 fallback})
    model = DeviceModel.measure()  # the full model, later: the same rates, not timed again
    assert model.flop_costs == fallback


@pytest.mark.parametrize("budget", [0.0, 0.5, 1.0, "bytes"])
def test_a_planner_that_prices_eqns_measures_the_rates_on_a_worker_first(monkeypatch, budget):
    """Where the min-cut will price eqns (a fraction strictly between 0 and 1, a byte budget), the device's rate
    probes begin on a worker thread before its cuts; fractions 0 and 1 price nothing and measure no rates."""
    import threading
    from jaxaot._src.partition.costs import device_model

    calls, running = [], []
    real = device_model._rates

    def rates(device):
        calls.append(threading.current_thread().name)
        running.append(1)
        try:
            return real(device)
        finally:
            running.pop()

    monkeypatch.setattr(device_model, "_rates", rates)
    monkeypatch.setattr(device_model, "_RATES", {})
    x = jax.random.normal(jax.random.key(int(np.random.default_rng().integers(1 << 30))), (64, 64))
    loss = lambda w: jnp.sum(jnp.tanh(jnp.tanh(w @ w) @ w))  # noqa: E731
    joint = jaxaot.partition.trace_joint(loss, x)
    if budget == "bytes":
        fraction_one = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=1.0)
        budget = 10 * fraction_one.saved_bytes + (1 << 20)  # fits: the search prices the plan it measures
    costs = MeasuredCosts(jax.devices()[0], path=None)
    part = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=budget, op_costs=costs)
    assert part.residuals is not None
    priced = budget not in (0.0, 1.0)
    assert len(calls) <= int(priced) and not running  # at most once, where priced, and ended with the plan
    if priced and budget != 0.5:  # a byte budget's plan measured here recomputes nothing: the probes may be dropped
        return
    assert len(calls) == int(priced)
    if priced and workers.threads() > 1:
        assert calls[0].startswith("jaxaot-compile")  # on a worker, beside the cuts


def test_rate_probes_run_one_at_a_time(monkeypatch):
    """The rate probes' buffers never sit beside each other: the matmul's are freed before the copy's exist."""
    from jaxaot._src.partition.costs import device_model

    before = {id(a) for a in jax.live_arrays()}
    alive = []
    real = device_model._per_step_seconds

    def counted(step, x, n):
        alive.append(sum(a.nbytes for a in jax.live_arrays() if id(a) not in before))
        return real(step, x, n)

    monkeypatch.setattr(device_model, "_per_step_seconds", counted)
    flops, bandwidth = device_model._rates(jax.devices()[0])
    n = device_model.RATE_MATMUL.get(jax.devices()[0].platform, device_model.RATE_MATMUL_ACCELERATOR)
    copy = device_model._MEASURE_BYTES // (8 if jax.devices()[0].platform == "cpu" else 1)
    assert flops > 0 and bandwidth > 0 and len(alive) == 2
    assert alive[0] <= n * n * 4 and alive[1] == copy  # only the probe being timed


class _Lowered:
    """A lowered program that records the options each compile asks for (with ``refuse``, refusing any; with
    ``broken``, every compile)."""

    def __init__(self, refuse: bool = False, broken: bool = False):
        self.calls, self.refuse, self.broken = [], refuse, broken

    def compile(self, compiler_options=None):
        self.calls.append(compiler_options)
        if self.broken or (compiler_options and self.refuse):
            raise ValueError("No such compile option: 'xla_gpu_autotune_level'")
        return "compiled"


@pytest.fixture
def fresh_refusals(monkeypatch):
    """No platform's refusal of the untuned options remembered (and none left behind)."""
    from jaxaot._src.partition.costs import autotune_bytes

    monkeypatch.setattr(autotune_bytes, "_REFUSED", set())


@pytest.mark.parametrize("platform", ["gpu", "cuda", "rocm", "cpu", "tpu"])
def test_timing_programs_compile_untuned_where_the_platform_autotunes(platform, fresh_refusals):
    from jaxaot._src.partition.costs.autotune_bytes import UNTUNED_OPTIONS, compile_untuned

    low = _Lowered()
    assert compile_untuned(low, platform) == "compiled"
    gpu = platform in ("gpu", "cuda", "rocm")
    assert low.calls == [{"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False} if gpu else None]
    assert (platform in UNTUNED_OPTIONS) == gpu


def test_an_xla_refusing_the_options_compiles_with_its_defaults_from_then_on(fresh_refusals):
    from jaxaot._src.partition.costs import autotune_bytes

    dot = jax.make_jaxpr(jnp.dot)(jnp.ones((256, 128)), jnp.ones((128, 64))).jaxpr.eqns[0]
    assert autotune_bytes.compiles_untuned("gpu") and autotune_bytes.untuned_bytes([dot], "gpu") == 0
    broken = _Lowered(broken=True)  # a program no compile takes: its error, and the options still used
    with pytest.raises(ValueError):
        autotune_bytes.compile_untuned(broken, "gpu")
    assert autotune_bytes.compiles_untuned("gpu") and len(broken.calls) == 2
    low = _Lowered(refuse=True)
    assert autotune_bytes.compile_untuned(low, "gpu") == "compiled"
    assert low.calls == [dict(autotune_bytes.UNTUNED_OPTIONS["gpu"]), None]
    assert not autotune_bytes.compiles_untuned("gpu")  # from then on: defaults, whose autotuning holds device bytes
    assert autotune_bytes.untuned_bytes([dot], "gpu") == autotune_bytes.eqns_bytes([dot], "gpu") > 0
    again = _Lowered(refuse=True)
    autotune_bytes.compile_untuned(again, "gpu")
    assert again.calls == [None] and autotune_bytes.compiles_untuned("cuda")  # asked once; other platforms keep theirs


def test_a_convolution_s_timing_keeps_xla_s_defaults(fresh_refusals):
    """Matrix products time untuned on a GPU; a convolution's program compiles, and holds, as XLA's defaults
    have it (the library's heuristic algorithm was not measured against the autotuned one)."""
    from jaxaot._src.partition.costs import autotune_bytes

    dot = jax.make_jaxpr(jnp.dot)(jnp.ones((256, 128)), jnp.ones((128, 64))).jaxpr.eqns[0]
    conv = jax.make_jaxpr(lambda x, k: jax.lax.conv(x, k, (1, 1), "SAME"))(
        jnp.ones((2, 3, 16, 16)), jnp.ones((4, 3, 3, 3))).jaxpr.eqns[0]
    assert conv.primitive.name in autotune_bytes.KEEP_TUNED
    low, kept = _Lowered(), _Lowered()
    autotune_bytes.compile_untuned(low, "gpu", [dot])
    autotune_bytes.compile_untuned(kept, "gpu", [conv])
    assert low.calls == [dict(autotune_bytes.UNTUNED_OPTIONS["gpu"])] and kept.calls == [None]
    assert autotune_bytes.untuned_bytes([dot], "gpu") == 0
    assert autotune_bytes.untuned_bytes([conv], "gpu") == autotune_bytes.eqns_bytes([conv], "gpu") > 0
    assert autotune_bytes.compiles_untuned("gpu") and autotune_bytes.compiles_untuned("gpu", [conv]) is False


def test_untuned_rate_probes_hold_no_autotuning(fresh_refusals):
    from jaxaot._src.partition.costs import autotune_bytes, device_model

    class Gpu:
        platform = "gpu"

    alone, offload = device_model.probe_bytes(Gpu()), device_model.probe_bytes(Gpu(), offload=True)
    autotune_bytes._REFUSED.add("gpu")
    assert device_model.probe_bytes(Gpu()) == alone + 6 * autotune_bytes.REDZONE_BYTES
    assert device_model.probe_bytes(Gpu(), offload=True) == offload  # the host-memory probes' compiles autotune


def test_op_and_rate_timings_compile_untuned_on_this_backend(monkeypatch):
    """Every program that times an op or a rate compiles through ``compile_untuned``; on a platform with
    options, XLA takes them and the untuned program computes what ``jit`` does."""
    from jaxaot._src.partition.costs import autotune_bytes, device_model

    device = jax.devices()[0]
    seen = []

    def spy(lowered, platform, eqns=()):
        seen.append(platform)
        return autotune_bytes.compile_untuned(lowered, platform, eqns)

    monkeypatch.setattr(op_profile, "compile_untuned", spy)
    monkeypatch.setattr(device_model, "compile_untuned", spy)
    big = 512 if device.platform == "cpu" else 2048  # apart by more than a GPU's launch noise
    small, large = (jax.make_jaxpr(jnp.dot)(jnp.ones((n, n)), jnp.ones((n, n))).jaxpr.eqns[0] for n in (64, big))
    times = op_profile.profile_many([small, large], device, threads=2)
    assert seen == [device.platform] * 4 and times[1] > times[0] > 0
    seen.clear()
    flops, bandwidth = device_model._rates(device)
    assert seen == [device.platform] * 4 and flops > 0 and bandwidth > 0
    options = autotune_bytes.UNTUNED_OPTIONS.get(device.platform)
    assert autotune_bytes.compiles_untuned(device.platform) == (options is not None)  # this XLA took them
    if options:  # and a program compiled with them computes what jit's does
        a, b = (jax.random.normal(k, (256, 256)) for k in jax.random.split(jax.random.key(7)))
        dot = jax.jit(jnp.dot).lower(a, b).compile(compiler_options=dict(options))
        np.testing.assert_allclose(dot(a, b), jax.jit(jnp.dot)(a, b), rtol=2e-2, atol=1e-2)


def test_a_table_timed_untuned_is_kept_apart_from_one_timed_with_defaults(tmp_path, fresh_refusals):
    """The table's file is chosen by how its programs compile: a GPU whose XLA refused the untuned options
    reads and writes another table than one that took them."""
    from jaxaot._src.partition.costs import autotune_bytes, measured_costs

    class Gpu:
        platform, device_kind = "gpu", "a GPU"

    untuned = measured_costs._default_path(Gpu(), str(tmp_path))
    assert measured_costs._environment(Gpu())["compile"] == "untuned"
    autotune_bytes._REFUSED.add("gpu")
    assert measured_costs._environment(Gpu())["compile"] == "default"
    assert measured_costs._default_path(Gpu(), str(tmp_path)) != untuned
    assert measured_costs._environment(CPU)["compile"] == "default"
