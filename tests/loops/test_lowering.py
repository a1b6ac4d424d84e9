"""The impl/lowering: the blocked GPU forms compute what the plain loop computes."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src.loops.common import counted_loop, stack_loop
from jaxaot._src.loops.lowering import run_loop

LENGTH = 40  # long enough to block (blocks of 6) and to speculate (blocks of 8)


@pytest.mark.parametrize("reverse", [False, True])
def test_blocked_counted_loop_matches_the_plain_loop(reverse):
    body = jax.make_jaxpr(lambda w, c, x: [c * w + x, c])(0.0, 0.0, 0.0)
    loop = counted_loop(body, num_consts=1, num_carry=1, length=LENGTH, reverse=reverse)
    xs = jnp.asarray(np.random.default_rng(0).normal(size=LENGTH), jnp.float32)
    run = jax.jit(lambda n, blocked: run_loop(loop, [n, 0.9, 0.0, xs], blocked), static_argnums=1)
    for n in (0, 1, 5, 6, 7, 36, 39, LENGTH):
        chex.assert_trees_all_close(run(n, True), run(n, False), rtol=1e-6)


@pytest.mark.parametrize("nested", [False, True])
def test_speculative_stacking_loop_matches_the_plain_loop(nested):
    def step(v):  # a cond-driven loop inside the body disables speculation
        return lax.while_loop(lambda u: u < 0.0, lambda u: u + 1.0, v) if nested else v

    cond = jax.make_jaxpr(lambda n, i, v: i < n)(0, 0, 0.0)
    body = jax.make_jaxpr(lambda n, i, v: [i + 1, jnp.sin(step(v)) + 1.0, v])(0, 0, 0.0)
    loop = stack_loop(cond, body, num_consts=1, num_carry=2, length=LENGTH)
    run = jax.jit(lambda n, blocked: run_loop(loop, [n, 0, 0.5], blocked), static_argnums=1)
    for n in (0, 3, 8, 31, 32, 33, 39, LENGTH, LENGTH + 1, 100):
        i, v, ys, num_steps, overflowed = run(n, True)
        i0, v0, ys0, num_steps0, overflowed0 = run(n, False)
        assert (int(i), int(num_steps), bool(overflowed)) == (int(i0), int(num_steps0), bool(overflowed0))
        assert int(num_steps) == min(n, LENGTH) and bool(overflowed) == (n > LENGTH)
        chex.assert_trees_all_close((v, ys), (v0, ys0), rtol=1e-6)  # rows past num_steps: zero in both
