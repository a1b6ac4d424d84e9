"""A float an equality compares is never recomputed where the backward depends on the comparison.

JAX's derivative of a max finds its argmax with ``eq(x, max(x))``. A plan that saves the max and recomputes ``x``
in the backward compares a recomputed ``x``, which XLA need not compute bit for bit as the forward did, with the
forward's max: the mask can come out empty and the max's gradient vanish. Each plan is compared with ``jax.grad``
on fresh random inputs.
Saved, the value is the forward's own, and the comparison recomputes exactly.
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


def test_the_inputs_where_a_recomputation_differed_give_jax_s_gradient():
    """Inputs on which XLA:CPU recomputed ``h`` a few bits off the forward's, so that the plan that saved the max
    found no element equal to it (the max's gradient, about 4, was lost)."""
    k = jax.random.split(jax.random.key(4), 3)
    args = jax.random.normal(k[0], (40, 40)) * 0.2, jnp.ones(40), jax.random.normal(k[2], (64, 40))
    f = jaxaot.aot_function(_normalised_max, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    assert_trees_close(jax.grad(f, (0, 1))(*args), jax.grad(_normalised_max, (0, 1))(*args), rtol=1e-4, atol=1e-5)


def test_a_dead_comparison_keeps_softmax_s_scores_recomputable():
    """``jax.nn.softmax``'s joint compares the scores with their max behind a ``stop_gradient``; the backward does
    not depend on that comparison, so it bans nothing: the plan is the one without any comparison."""
    k = jax.random.split(fresh_key(), 2)
    w, x = jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (4, 8))
    plans = [jaxaot.partition.min_cut_rematerialization_partition(jaxaot.partition.trace_joint(f, w, x))
             for f in (lambda w, x: jnp.sum(jax.nn.softmax(jnp.tanh(x @ w)) ** 2),
                       lambda w, x: jnp.sum(jax.nn.softmax(jnp.tanh(x @ w) + 0.0) ** 2))]
    assert plans[0].saved_bytes == plans[1].saved_bytes
