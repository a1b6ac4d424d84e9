"""``checkpoints=k`` on device: body evaluations per the schedule, and the linear primitive's rules."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import jaxaot
from jaxaot._src.loops import blocked, checkpointed, revolve
from jaxaot._src.loops.wrappers import while_loop
from jaxaot.errors import InvalidLoopOptionError
from zoo import body_runs_and_gradient


@pytest.mark.parametrize("n,k", [(0, 2), (1, 1), (9, 2), (40, 3)])
def test_device_body_evaluations_match_the_schedule(n, k):
    runs, got, ref = body_runs_and_gradient(n, 0.3, checkpoints=k)
    c = revolve.revolve_counts(n, k)
    assert runs == c.forward + c.vjps
    chex.assert_trees_all_close(got, ref, rtol=1e-5)


@pytest.mark.parametrize("table_steps,table_checkpoints", [
    pytest.param(16, 128, id="past_the_table"), pytest.param(4096, 2, id="k_above_the_tables", marks=pytest.mark.slow)])
def test_body_evaluations_without_the_trace_time_tables(table_steps, table_checkpoints, monkeypatch):
    # Past online_table_steps(k) steps the placement is decided online and the backward searches its
    # split points (the loop is longer than the lookup's); above TABLE_CHECKPOINTS every step decides online.
    monkeypatch.setattr(checkpointed, "online_table_steps", lambda k: table_steps)
    monkeypatch.setattr(checkpointed, "TABLE_CHECKPOINTS", table_checkpoints)
    runs, got, ref = body_runs_and_gradient(40, 0.3, checkpoints=3)
    c = revolve.revolve_counts(40, 3)
    assert runs == c.forward + c.vjps
    chex.assert_trees_all_close(got, ref, rtol=1e-5)


def _ck_loop(x, n=6):
    return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.2 + 0.1 * c[1] ** 2), (0, x),
                      checkpoints=2)[1]


def _ref_loop(x, n=6):
    return lax.fori_loop(0, n, lambda i, v: jnp.sin(v) * 1.2 + 0.1 * v ** 2, x)


def test_linearized_checkpointed_loop_under_vmap_and_jvp():
    rng = np.random.default_rng(3)
    x, v = (jnp.asarray(rng.normal(size=3), jnp.float32) for _ in range(2))
    basis = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    _, lin = jax.linearize(_ck_loop, x)
    _, ref = jax.linearize(_ref_loop, x)
    # vmap over tangents keeps the checkpointed primitive, so it still transposes
    chex.assert_trees_all_close(jax.vmap(lin)(basis), jax.vmap(ref)(basis), rtol=1e-5)
    chex.assert_trees_all_close(jax.linear_transpose(jax.vmap(lin), basis)(basis),
                                jax.linear_transpose(jax.vmap(ref), basis)(basis), rtol=1e-5)
    # forward mode over the linear map: in its linear inputs, and in the primal point
    chex.assert_trees_all_close(jax.jvp(lin, (v,), (basis[0],)), jax.jvp(ref, (v,), (basis[0],)), rtol=1e-5)
    got = jax.jvp(lambda p: jax.linearize(_ck_loop, p)[1](v), (x,), (basis[1],))
    want = jax.jvp(lambda p: jax.linearize(_ref_loop, p)[1](v), (x,), (basis[1],))
    chex.assert_trees_all_close(got, want, rtol=1e-4)
    # vmap over the primal point: each lane replays its own states
    got = jax.vmap(lambda p: jax.linearize(_ck_loop, p)[1](v))(basis)
    want = jax.vmap(lambda p: jax.linearize(_ref_loop, p)[1](v))(basis)
    chex.assert_trees_all_close(got, want, rtol=1e-5)


def test_linearize_stages_the_checkpointed_linear_primitive():
    # The tangent map replays the primal states from k snapshots: no residual stack.
    _, lin = jax.linearize(_ck_loop, jnp.float32(0.5))
    text = str(jax.make_jaxpr(lin)(1.0))
    assert "checkpointed_linear_loop[" in text and "while_loop_stack_output" not in text
    chex.assert_trees_all_close(lin(1.0), jax.linearize(_ref_loop, jnp.float32(0.5))[1](1.0), rtol=1e-5)


def _scan_ref(x, n):
    return lax.scan(lambda v, _: (jnp.sin(v) * 1.2 + 0.1 * v ** 2, None), x, None, length=n)[0]


@pytest.mark.parametrize("block", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_blocked_online_schedule_matches_scan(block, monkeypatch):
    # Blocks of B steps per predicate check (the GPU default), forced on the CPU: trip counts
    # that are and are not multiples of B, zero, one, and lanes of different trip counts.
    loop = lambda x, n, k: while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.2 + 0.1 * c[1] ** 2),  # noqa: E731
                                      (0, x), checkpoints=k)[1]
    with jaxaot.config.override(online_block=block):
        g = jax.jit(jax.grad(loop), static_argnums=2)
        for n, k in [(0, 2), (1, 2), (block, 2), (3 * block + 1, 2), (4 * block, 3), (37, 3)]:
            chex.assert_trees_all_close(g(0.3, n, k), jax.grad(_scan_ref)(0.3, n), rtol=1e-5,
                                        custom_message=f"n={n} k={k}")
        xs, ns = jnp.linspace(0.1, 0.5, 5), jnp.array([0, 1, block, 2 * block + 1, 11])
        lanes = jax.jit(jax.grad(lambda xs: jnp.sum(jax.vmap(lambda x, n: loop(x, n, 3))(xs, ns))))(xs)
        chex.assert_trees_all_close(lanes, jnp.stack([jax.grad(_scan_ref)(x, int(n)) for x, n in zip(xs, ns)]),
                                    rtol=1e-5)
        per_lane = jax.jit(jax.vmap(jax.grad(lambda x, n: loop(x, n, 2))))(xs, ns)
        chex.assert_trees_all_close(per_lane, lanes, rtol=1e-5)


def _three_carries(p, x, y, n, wl):
    """An int counter, a vector and a scalar carry: the blocks pack each step's integers into one
    vector and store every carry in its own snapshot buffer."""
    def body(c):
        i, x, y = c
        return i + 1, x * jnp.cos(p * y) + 0.1 * jnp.sin(x), y + 0.05 * jnp.sum(x ** 2)
    return wl(lambda c: c[0] < n, body, (jnp.int32(0), x, y))


@pytest.mark.parametrize("k,unroll", [(1, True), pytest.param(2, False, id="2-looped", marks=pytest.mark.slow),
                                      pytest.param(2, True, marks=pytest.mark.slow)])
def test_blocked_schedule_with_one_or_two_snapshots_and_several_carries(k, unroll):
    # k=1 (no split points: every step recomputed from the initial state) and k=2, trip counts
    # below, at and past a block of 2, several carries; gradients in all of them equal lax.scan's,
    # the blocks' steps looped or unrolled.
    def loss(p, x, y, n, k):
        _, x, y = _three_carries(p, x, y, n, lambda c, b, i: while_loop(c, b, i, checkpoints=k))
        return jnp.sum(x ** 2) + y

    def ref(p, x, y, n):
        _, x, y = _three_carries(p, x, y, n, lambda c, b, i: lax.scan(lambda s, _: (b(s), None), i, length=n)[0])
        return jnp.sum(x ** 2) + y

    rng = np.random.default_rng(7)
    x, y = jnp.asarray(rng.normal(size=3), jnp.float32), jnp.float32(0.2)
    with jaxaot.config.override(online_block=2, unroll_blocks=unroll):
        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=4)
        want = jax.jit(jax.grad(ref, argnums=(0, 1, 2)), static_argnums=3)
        for n in (0, 1, 2, 7):
            chex.assert_trees_all_close(g(0.7, x, y, n, k), want(0.7, x, y, n), rtol=1e-5,
                                        custom_message=f"n={n} k={k}")


@pytest.mark.slow
def test_blocked_schedule_reverse_over_reverse_equals_scans():
    # Reverse over reverse through the blocks: the blocked backward's loops are checkpoints=k loops.
    step = lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1 + 0.05 * c[1] ** 2)  # noqa: E731
    loss = lambda x, n: jnp.sum(while_loop(lambda c: c[0] < n, step, (0, x), checkpoints=2)[1] ** 2)  # noqa: E731
    ref = lambda x, n: jnp.sum(lax.scan(lambda c, _: (step(c), None), (0, x), None, length=n)[0][1] ** 2)  # noqa: E731
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.normal(size=3), jnp.float32)

    def second_order(f):
        return lambda x, n: jax.grad(lambda x: jnp.sum(jnp.sin(jax.grad(f)(x, n))))(x)

    with jaxaot.config.override(online_block=3):
        got, want = jax.jit(second_order(loss)), jax.jit(second_order(ref), static_argnums=1)
        for n in (0, 4, 11):
            chex.assert_trees_all_close(got(x, n), want(x, n), rtol=1e-5, custom_message=f"n={n}")


@pytest.mark.parametrize("block", [1, 4])
def test_past_the_split_point_table_the_backward_searches(block):
    # An unbounded loop looks its split points up while it is no longer than online_table_steps(k) and
    # searches the binomial table past that (a lax.cond on the trip count): both branches, one loop and blocks.
    loop = lambda p, x, n: while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 1e-3 * jnp.sin(p * c[1])),  # noqa: E731
                                      (0, x), checkpoints=3)[1]
    ref = lambda p, x, n: lax.scan(lambda c, _: (c + 1e-3 * jnp.sin(p * c), None), x, None, length=n)[0]  # noqa: E731
    x = jax.random.uniform(jax.random.key(block), (3,))
    with jaxaot.config.override(online_block=block):
        g = jax.jit(jax.grad(lambda p, x, n: jnp.sum(loop(p, x, n) ** 2), argnums=(0, 1)))
        for n in (29, checkpointed.online_table_steps(3) + 37):
            want = jax.grad(lambda p, x: jnp.sum(ref(p, x, n) ** 2), argnums=(0, 1))(1.3, x)
            chex.assert_trees_all_close(g(1.3, x, n), want, rtol=2e-5, custom_message=f"n={n}")


def test_blocked_counts_and_checks():
    # Blocks trade predicate checks (host waits on a GPU) for masked steps past each run's end.
    plain, blocked = revolve.revolve_counts(2000, 40), revolve.revolve_counts(2000, 40, block=4)
    assert plain.checks > 3 * blocked.checks and blocked.ratio <= 1.10 and blocked.vjps < 1.25 * plain.vjps
    assert revolve.revolve_counts(40, 3, block=1) == revolve.revolve_counts(40, 3)


def test_blocks_only_for_bodies_without_effects():
    with jaxaot.config.override(online_block=None):
        assert checkpointed.online_block() == (checkpointed.GPU_BLOCK if jax.default_backend() == "gpu" else 1)
    with jaxaot.config.override(online_block=4):
        assert checkpointed.online_block() == 4
        assert checkpointed.online_block(jax.make_jaxpr(lambda: jax.debug.print("x"))().effects) == 1


def _logged_step(effect):
    def body(c):
        effect(c[0])
        return c[0] + 1, jnp.sin(c[1]) * 1.1
    return body


def _logged(effect, **options):
    """``x -> `` a 5-step ``while_loop`` whose body runs ``effect(step)``."""
    return lambda x: while_loop(lambda c: c[0] < 5, _logged_step(effect), (0, x), **options)[1]


def _log_effects(calls):
    """The effects a recomputing backward refuses, each appending its step to ``calls``."""
    def log(i):
        calls.append(int(i))
        return np.int32(0)
    return {
        "ordered_io_callback": lambda i: io_callback(log, jax.ShapeDtypeStruct((), jnp.int32), i, ordered=True),
        "io_callback": lambda i: io_callback(log, jax.ShapeDtypeStruct((), jnp.int32), i),
        "ordered_debug_callback": lambda i: jax.debug.callback(log, i, ordered=True),
    }


_REF_GRAD = jax.grad(lambda x: lax.fori_loop(0, 5, lambda i, v: jnp.sin(v) * 1.1, x))


@pytest.mark.parametrize("kind", ["ordered_io_callback", "io_callback", "ordered_debug_callback"])
@pytest.mark.parametrize("options", [dict(checkpoints=2), dict(max_steps=20, checkpoints=2)],
                         ids=["checkpoints", "max_steps_without_a_nested_plan"])
def test_effects_the_backward_would_replay_are_refused_when_the_gradient_is_traced(kind, options):
    calls = []
    effect = _log_effects(calls)[kind]
    f = _logged(effect, **options)
    f(1.3)  # the loop itself, and its forward mode, run each step's effect once, in order
    jax.jvp(f, (1.3,), (1.0,))
    jax.effects_barrier()
    assert calls == [0, 1, 2, 3, 4] * 2
    with pytest.raises(InvalidLoopOptionError, match=r"checkpoints=2, reverse mode recomputes.*"
                                                      r"Use max_steps without checkpoints"):
        jax.make_jaxpr(jax.grad(f))(1.3)
    calls.clear()
    jax.grad(lambda x: lax.scan(lambda c, _: (_logged_step(effect)(c), None), (0, x), None, length=5)[0][1])(1.3)
    jax.effects_barrier()
    scan_calls, calls[:] = list(calls), []
    stacked = jax.grad(_logged(effect, max_steps=20))(1.3)  # nothing recomputed: as lax.scan under grad
    jax.effects_barrier()
    assert calls == scan_calls and len(calls) <= 5
    chex.assert_trees_all_close(stacked, _REF_GRAD(1.3), rtol=1e-6)


@pytest.mark.parametrize("options", [dict(checkpoints=2), dict(max_steps=20, checkpoints=2)])
def test_debug_callbacks_run_again_where_the_backward_evaluates_the_body(options):
    # docs/concepts/loops.md, "Effects": the forward's 5 calls, then one per recomputed step and VJP.
    calls = []
    f = _logged(lambda i: jax.debug.callback(lambda v: calls.append(int(v)), i), **options)
    g = jax.grad(f)(1.3)
    jax.effects_barrier()
    c = revolve.revolve_counts(5, 2)
    assert calls[:5] == [0, 1, 2, 3, 4] and len(calls) == c.forward + c.vjps == 13
    assert sorted(calls[5:]) == sorted([3, 4, 3, 0, 1, 2, 1, 0])
    chex.assert_trees_all_close(g, _REF_GRAD(1.3), rtol=1e-6)
