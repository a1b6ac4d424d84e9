"""A float equality is never recomputed: the forward's own result is saved.

JAX's derivative of a max finds its argmax with ``eq(x, max(x))``. A plan that saves the max and recomputes ``x``
in the backward compares a recomputed ``x``, which XLA need not compute bit for bit as the forward did, with the
forward's max: the mask can come out empty and the max's gradient vanish. Each plan is compared with ``jax.grad``
on fresh random inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.partition import remat_policy
from zoo import assert_trees_close, key_stream

fresh_key = key_stream(7100)


def _normalised_max(w, g, x):
    h = x @ w
    h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5) * g
    return jnp.sum(jax.nn.relu(h)) / h.size + jnp.max(h)


def _args():
    k = jax.random.split(fresh_key(), 3)
    return jax.random.normal(k[0], (40, 40)) * 0.2, 1.0 + 0.1 * jax.random.normal(k[1], (40,)), \
        jax.random.normal(k[2], (64, 40))


@pytest.mark.parametrize("budget", [1.0, 0.3, 0.0, "1.5MiB"])
def test_the_gradient_of_a_max_over_recomputed_values_is_jax_s(budget):
    mc = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(_normalised_max, partition_fn=mc)
    args = _args()
    want = jax.value_and_grad(_normalised_max, (0, 1))(*args)
    assert_trees_close(jax.value_and_grad(f, (0, 1))(*args), want, rtol=1e-4, atol=1e-5)
    assert_trees_close(jaxaot.value_and_grad(f, (0, 1))(*args), want, rtol=1e-4, atol=1e-5)


def test_a_remat_policy_keeps_the_forward_s_comparison():
    args = _args()
    policy = remat_policy(_normalised_max, *args, memory_budget=1.0)
    got = jax.jit(jax.grad(jax.checkpoint(_normalised_max, policy=policy), (0, 1)))(*args)
    assert_trees_close(got, jax.grad(_normalised_max, (0, 1))(*args), rtol=1e-4, atol=1e-5)


def _equalities(part, inexact: bool) -> list:
    return [e for e in part.recomputed.eqns if e.primitive.name in ("eq", "ne")
            and any(jnp.issubdtype(v.aval.dtype, jnp.inexact) == inexact for v in e.invars)]


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_a_float_equality_is_never_recomputed_and_an_integer_one_may_be(budget):
    joint = jaxaot.partition.trace_joint(_normalised_max, *_args())
    part = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=budget)
    assert part.recomputed.eqns and not _equalities(part, inexact=True)
    one_hot = lambda w, x: jnp.sum(jnp.where(jnp.argmax(x, -1)[:, None] == jnp.arange(8), jnp.tanh(x @ w), 0) ** 2)
    w, x = jnp.ones((8, 8)), jax.random.normal(fresh_key(), (4, 8))
    ints = jaxaot.partition.min_cut_rematerialization_partition(jaxaot.partition.trace_joint(one_hot, w, x),
                                                                memory_budget=0.0)
    assert _equalities(ints, inexact=False)  # an integer comparison recomputes exactly
