"""``checkpoints=k`` on device: body evaluations per the schedule, and the linear primitive's rules."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot.loops import revolve
from jaxaot.loops.api import while_loop


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
    c = revolve.revolve_counts(n, k)
    assert calls[0] == c.forward + c.vjps
    ref = jax.grad(lambda x: lax.fori_loop(0, n, lambda i, v: jnp.sin(v) * 1.1, x))(0.3)
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
