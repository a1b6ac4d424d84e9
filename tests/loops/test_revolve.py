"""The revolve schedule of ``checkpoints=k``: counts against the optimum, NumPy against JAX."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src.loops import revolve
from jaxaot._src.loops.wrappers import while_loop
from jaxaot._src.loops.checkpointed import TABLE_CHECKPOINTS


@functools.lru_cache(maxsize=None)
def _dp_optimum(n: int, s: int) -> int:
    """Brute-force fewest forward steps to reverse n steps from a stored state, s slots."""
    if n <= 1:
        return 0
    if s == 1:
        return n * (n - 1) // 2
    return min(m + _dp_optimum(n - m, s - 1) + _dp_optimum(m, s) for m in range(1, n))


@pytest.mark.parametrize("n", [1, 2, 5, 13, 40])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_optimum_formula_matches_brute_force(n, k):
    assert revolve.revolve_optimum(n, k) == _dp_optimum(n, k)


@pytest.mark.parametrize("n", [2, 7, 50, 287, 1000])
@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_offline_backward_is_optimal(n, k):
    # From the initial state alone, the backward's schedule is the revolve optimum.
    assert revolve.backward_advances(n, k, [0] + [-1] * (k - 1)) == revolve.revolve_optimum(n, k)


def test_issue_target_n1000_k10():
    c = revolve.revolve_counts(1000, 10)
    assert c.optimum == 3636 and c.vjps == 1000
    assert c.forward <= 1.10 * c.optimum, c


@pytest.mark.parametrize("k", [2, 3, 5, 10, 17, 40])
def test_online_placement_is_within_ten_percent_of_the_optimum(k):
    # Every trip count from 100 on, in one sweep of the forward's decisions.
    worst = revolve.worst_ratio(k, first=100, last=2500)
    assert worst[0] <= 1.10, (k, worst)


@pytest.mark.parametrize("n,k", [(2, 2), (68, 10), (287, 10), (1200, 3), (2000, 40)])
def test_placement_cost_is_what_the_backward_runs(n, k):
    pos = revolve.snapshots_after_forward(n, k)
    assert revolve.placement_cost(n, k, pos) == n + revolve.backward_advances(n, k, pos)


def test_no_online_schedule_meets_ten_percent_for_small_n():
    # Why the goal starts at n = 100: with k = 2 (one movable snapshot), search every
    # online schedule. Whichever steps it moves the snapshot at, the forward steps
    # minus the last one (the optimum fuses it into a VJP) exceed 1.15x the optimum
    # for some n in 20..40.
    k, rho = 2, 1.15
    alive = {0}  # where the movable snapshot can be, over all schedules that met rho so far
    for n in range(2, 41):
        alive = alive | {n - 1}
        if n >= 20:
            alive = {p for p in alive
                     if revolve.placement_cost(n, k, [0, p] if p else [0]) - 1 <= rho * revolve.revolve_optimum(n, k)}
    assert not alive


def test_snapshots_never_exceed_k():
    for n in (3, 100, 700):
        pos = revolve.snapshots_after_forward(n, 4)
        assert len(pos) == 4 and pos[0] == 0 and all(p < n for p in pos)
        held = [p for p in pos if p >= 0]
        assert held == sorted(held)


@pytest.mark.parametrize("k", [2, 5, 40])
def test_segment_cost_agrees_in_numpy_and_jax(k):
    rng = np.random.default_rng(k)
    length = np.concatenate([np.arange(0, 40), rng.integers(1, 2**31 - 1, 40), rng.integers(1, 10**6, 40)])
    slots = rng.integers(1, k + 1, length.size)
    got_np = revolve.segment_cost(np, length.astype(np.int64), slots, k)
    got_jax = jax.jit(lambda x: revolve.segment_cost(jnp, x, slots, k))(length.astype(np.int32))
    np.testing.assert_array_equal(got_np, np.asarray(got_jax))
    cap = revolve.cost_cap(k)
    for length_, s, t in zip(length.tolist(), slots.tolist(), got_np.tolist()):
        if length_ <= revolve.beta(s, revolve.MAX_REPS):
            assert t == min(revolve.revolve_optimum(length_, s), cap), (length_, s)
        else:  # beyond the table: saturated, an option never worth taking
            assert t == cap, (length_, s)


def test_jax_placement_matches_the_numpy_mirror():
    k = 4

    def run(n):
        levels = (jnp.full((k,), -1, jnp.int32).at[0].set(0), jnp.arange(k, dtype=jnp.int32), jnp.int32(1))

        def body(i, state):
            return revolve.place(jnp, i, *state, k)[1:]

        return lax.fori_loop(1, n, body, levels)

    for n in (1, 2, 9, 57, 300):
        pos, _, m = jax.jit(run, static_argnums=0)(n)
        assert [int(p) for p in pos[: int(m)]] == [p for p in revolve.snapshots_after_forward(n, k) if p >= 0]


@pytest.mark.parametrize("k", [2, 5])
def test_split_point_agrees_in_python_and_jax(k):
    cases = [(length, slots) for length in (2, 3, 10, 57, 1000) for slots in range(2, k + 1)]
    got = jax.jit(jax.vmap(lambda n, s: revolve.split_point_jax(n, s, k)))(*map(jnp.asarray, zip(*cases)))
    assert [int(g) for g in got] == [revolve.split_point(n, s) for n, s in cases]


@pytest.mark.parametrize("k", [2, 5])
def test_the_backward_s_split_functions_agree_with_split_point(k):
    """The lookup table (segments up to 60 steps) and the binary search, as the one-loop backward reads them."""
    from jaxaot._src.loops import schedule_tables, sweep
    cases = [(length, slots) for length in (2, 3, 10, 57, 60) for slots in range(2, k + 1)]
    want = [revolve.split_point(n, s) for n, s in cases]
    for split in (sweep.lookup_split(schedule_tables.split_points(60, k), 60),
                  sweep.search_split(revolve.beta_table_jax(k))):
        got = jax.jit(jax.vmap(split))(*map(jnp.asarray, zip(*cases)))
        assert [int(g) for g in got] == want


@pytest.mark.parametrize("k", [1, 7, 60])
def test_device_table_equals_numpy_table(k):
    """The on-device binomial table (running sums, saturating at int32 max) is NumPy's, bit for bit."""
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: revolve.beta_table_jax(k))()), revolve.beta_table(k))


def test_program_size_does_not_grow_with_k():
    """Above TABLE_CHECKPOINTS the tables are computed on the device and lanes are iotas: StableHLO at
    k=1000 is within 10% of k=TABLE_CHECKPOINTS + 1. Below, the placement and split-point tables made
    at trace time are constants of at most about 0.3 MB (0.6 M characters of text)."""
    def size(k):
        def loss(x):
            out = while_loop(lambda c: c[0] < 20, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.01), (jnp.int32(0), x),
                             checkpoints=k)
            return out[1]
        return len(jax.jit(jax.grad(loss)).lower(1.0).as_text())

    above = size(TABLE_CHECKPOINTS + 1)
    assert size(1000) <= 1.1 * above
    assert max(size(k) for k in (2, 31, TABLE_CHECKPOINTS)) <= above + 700_000
