"""The revolve schedule of ``checkpoints=k``: counts against the optimum, and on device."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import pytest
from jax import lax

from jaxaot import checkpointing as ck
from jaxaot.while_loop import while_loop


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
    assert ck.revolve_optimum(n, k) == _dp_optimum(n, k)


@pytest.mark.parametrize("n", [2, 7, 50, 287, 1000])
@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_offline_backward_is_optimal(n, k):
    # From the initial state alone, the backward's schedule is the revolve optimum.
    assert ck.backward_advances(n, k, [0] + [-1] * (k - 1)) == ck.revolve_optimum(n, k)


def test_issue_target_n1000_k10():
    c = ck.revolve_counts(1000, 10)
    assert c.optimum == 3636 and c.vjps == 1000
    assert c.forward <= 1.10 * c.optimum, c


def test_online_counts_stay_near_the_optimum_on_average():
    for k in (3, 10):
        ratios = [ck.revolve_counts(n, k).forward / (ck.revolve_optimum(n, k) + 1) for n in range(20, 1200, 37)]
        assert sum(ratios) / len(ratios) < 1.15, (k, max(ratios))


@pytest.mark.parametrize("n,k", [(0, 2), (1, 1), (9, 2), (40, 3)])
def test_device_body_evaluations_match_the_schedule(n, k):
    calls = [0]

    def count():
        calls[0] += 1

    def body(c):
        jax.debug.callback(count)
        return c[0] + 1, jnp.sin(c[1]) * 1.1

    g = jax.jit(jax.grad(lambda x: while_loop(lambda c: c[0] < n, body, (0, x), checkpoints=k)[1]))
    g = g.lower(0.3).compile()  # tracing runs no callbacks; count only the execution
    calls[0] = 0
    got = g(0.3)
    jax.effects_barrier()
    c = ck.revolve_counts(n, k)
    assert calls[0] == c.forward + c.vjps
    ref = jax.grad(lambda x: lax.fori_loop(0, n, lambda i, v: jnp.sin(v) * 1.1, x))(0.3)
    chex.assert_trees_all_close(got, ref, rtol=1e-5)


def test_snapshots_never_exceed_k():
    for n in (3, 100, 700):
        pos = ck.snapshots_after_forward(n, 4)
        assert len(pos) == 4 and pos[0] == 0 and all(p < n for p in pos)
        held = [p for p in pos if p >= 0]
        assert held == sorted(held)
