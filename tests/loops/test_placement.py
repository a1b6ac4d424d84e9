"""A bounded loop's checkpointing read from tables: the placement and the split points against revolve's.

``max_steps=N, checkpoints=k`` on a CPU runs the binomial schedule with its forward's snapshot
decisions and its backward's split points made at trace time (``jaxaot._src.loops.schedule_tables``) and its
backward as one loop (``jaxaot._src.loops.sweep``). The tables must be revolve's exactly, the gradients
``lax.scan``'s, and the program's copies of the body must not grow with N or k.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src.loops import checkpointed, offline, revolve, schedule_tables
from jaxaot._src.loops.wrappers import while_loop
from zoo import body_runs_and_gradient


def _online_decisions(n: int, k: int) -> tuple[list, list]:
    """The steps and slots ``revolve.place`` stores, in NumPy, one decision per step."""
    pos, slot_of, m = np.full(k, -1, np.int64), np.arange(k), 1
    pos[0] = 0
    steps, slots = [0], [0]
    for i in range(1, n):
        slot, pos, slot_of, m = revolve.place(np, i, pos, slot_of, m, k)
        if slot != k:
            steps.append(i)
            slots.append(int(slot))
    return steps, slots


@pytest.mark.parametrize("k", [1, 2, 3, 5, 10, 17, 40])
def test_stored_steps_are_the_online_placements_decisions(k):
    steps, slots, held = schedule_tables.stored_steps(1200, k)
    want_steps, want_slots = _online_decisions(1200, k)
    assert steps.tolist() == want_steps + [-1] and slots.tolist() == want_slots + [k]
    assert held[0] == 1 and held.max() <= k and np.all(np.diff(held[:-1]) >= 0)


@pytest.mark.parametrize("n,k", [(1, 3), (2, 2), (57, 3), (400, 10), (999, 40)])
def test_the_forward_holds_what_the_online_placement_holds(n, k):
    # The forward's recorder, run on the device for n steps, against revolve's own positions.
    levels0, decide, finish = schedule_tables.recorder(1000, k)

    def step(i, levels):
        return decide(i, levels)[1]

    pos, slot_of, top = jax.jit(lambda: finish(lax.fori_loop(0, n, step, levels0)))()
    want = revolve.snapshots_after_forward(n, k)
    assert pos.tolist() == want and int(top) == sum(p >= 0 for p in want) - 1
    assert sorted(slot_of.tolist()) == list(range(k))


@pytest.mark.parametrize("n,k", [(30, 3), (500, 10), (2000, 40), (100, 2), (7, 1)])
def test_split_points_are_revolves(n, k):
    points = schedule_tables.split_points(n, k).reshape(k + 1, n + 1)
    for s in range(2, k + 1):
        assert [int(points[s, length]) for length in range(2, n + 1)] == \
            [revolve.split_point(length, s) for length in range(2, n + 1)]


def _drift(x, n, **kw):
    return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 0.05 * jnp.tanh(c[1] @ c[2]), c[2]),
                      (0, x, kw.pop("w")), **kw)[1]


def _drift_scan(x, w, n):
    return lax.scan(lambda v, _: (v + 0.05 * jnp.tanh(v @ w), None), x, None, length=n)[0]


@pytest.mark.parametrize("bound,k,n", [(300, 3, 300), (300, 40, 211), (1000, 10, 1000), (64, 5, 0)])
@pytest.mark.parametrize("search", [False, True])
def test_gradients_equal_scans_with_either_split_point(bound, k, n, search, monkeypatch):
    # search: no table of split points (a loop too long for one), a binary search of the binomial table
    if search:
        monkeypatch.setattr(schedule_tables, "MAX_SPLIT_POINTS", 0)
    kx, kw = jax.random.split(jax.random.key(bound * 7 + k))
    x, w = jax.random.normal(kx, (3, 8)), jax.random.normal(kw, (8, 8)) / 3
    loss = lambda x, w: jnp.sum(_drift(x, n, w=w, max_steps=bound, checkpoints=k) ** 2)  # noqa: E731
    with jaxaot.config.override(offline_schedule="binomial"):
        got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    ref = jax.value_and_grad(lambda x, w: jnp.sum(_drift_scan(x, w, n) ** 2), argnums=(0, 1))(x, w)
    chex.assert_trees_all_close(got, ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n,k,bound", [(0, 3, 400), (1, 2, 10), (150, 3, 400), (257, 10, 1000), (640, 12, 640)])
def test_body_evaluations_are_revolves_counts(n, k, bound):
    # Effects are allowed where no nested plan fits; count the body's runs in the compiled gradient.
    assert offline.plan(bound, k) is None
    runs, got, ref = body_runs_and_gradient(n, 0.3, max_steps=bound, checkpoints=k)
    c = revolve.revolve_counts(n, k)
    assert runs == c.forward + c.vjps  # the forward, the recomputation, one evaluation per VJP
    if n >= 100:
        assert c.ratio <= 1.10, c
    chex.assert_trees_all_close(got, ref, rtol=1e-5)


def _body_copies(max_steps, checkpoints=None):
    """How many times the gradient's program evaluates the body (its sinh) and its derivative (cosh)."""
    def loss(x, w):
        out = jaxaot.loops.while_loop(lambda c: c[0] < 50, lambda c: (c[0] + 1, jnp.sinh(c[1] @ w) * 0.5), (0, x),
                                max_steps=max_steps, checkpoints=checkpoints)
        return jnp.sum(out[1])

    closed = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(jnp.ones((2, 4)), jnp.eye(4))
    names = [str(eqn.primitive) for eqn in C.iter_eqns(closed)]
    return names.count("sinh"), names.count("cosh")


def test_the_platforms_schedule_of_a_bounded_loop():
    # GPUs run nested scans (no host round trip per iteration) and, where no nested plan fits, the
    # binomial schedule in blocks of GPU_BLOCK steps per predicate check; other platforms run the
    # binomial schedule one step per check. The settings force either anywhere.
    gpu = jax.default_backend() in offline.NESTED_PLATFORMS
    with jaxaot.config.override(offline_schedule=None, online_block=None):
        assert offline.schedule() == ("nested" if gpu else "binomial")
        assert checkpointed.online_block() == (checkpointed.GPU_BLOCK if gpu else 1)
    with jaxaot.config.override(offline_schedule="binomial" if gpu else "nested"):
        assert offline.schedule() == ("binomial" if gpu else "nested")


@pytest.mark.parametrize("block", [1, checkpointed.GPU_BLOCK], ids=["one_step_per_check", "gpu_blocks"])
def test_the_gradients_program_holds_the_body_a_fixed_number_of_times(block):
    # The compile time of an XLA program grows with the copies of the body it holds, which must not
    # grow with N or k. The binomial schedule (every platform's where no nested plan fits, forced
    # here where one does) holds, one step per check (CPUs, TPUs), three forwards (the forward
    # loop's, the backward's advance, the VJP's recomputation) and one derivative; in blocks
    # (GPUs), four forwards (the forward loop's, the recomputation sweep's, and the recomputation
    # of the VJP after a sweep and of the run of VJPs from stored snapshots) and those two VJPs'
    # derivatives. max_steps alone holds two forwards (the stacking loop's, and the loop run on past max_steps
    # without a stack, which runs no iteration unless the forward overflows) and one derivative.
    with jaxaot.config.override(offline_schedule="binomial", online_block=block):
        copies = {(n, k): _body_copies(n, k) for n in (100, 1000, 5000) for k in (3, 10, 40)}
    assert set(copies.values()) == {(3, 1) if block == 1 else (4, 2)}, copies
    assert _body_copies(1000) == (2, 1)
