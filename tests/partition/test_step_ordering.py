"""The consume-first backward order (jaxaot._src.partition.step.ordering): same values, the intended barriers."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src.fusion import fused_program
from jaxaot._src.partition.step import ordering
import zoo
from zoo import assert_trees_close, backward_inputs

_KEY = jax.random.key(20261126)


def _partition(fn, args, budget):
    joint = jaxaot.partition.trace_joint(fn, *args)
    return jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=budget)


@pytest.mark.parametrize("budget", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_consume_first_backward_computes_the_same_gradients(name, budget):
    fn, make_args = zoo.ZOO[name]
    key = jax.random.fold_in(_KEY, hash((name, budget)) % 1000)
    args = make_args(key)
    loss = lambda *a: sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    part = _partition(loss, args, budget)
    cts, residuals = backward_inputs(part, args, key)
    want = C.eval_closed(part.backward, *cts, *residuals)
    got = jax.jit(lambda *xs: ordering.eval_backward(part.backward, len(cts), *xs))(*cts, *residuals)
    # Float32 rounding of other fusions, bounded against the gradients' own scale: a sum over the batch can
    # cancel to an element far smaller than the terms it rounded (1.6e-4 of a 0.27 element on fresh inputs).
    scale = max([float(jnp.max(jnp.abs(w))) for w in jax.tree.leaves(want)
                 if jnp.issubdtype(w.dtype, jnp.floating) and w.size] + [1e-3])
    assert_trees_close(got, want, rtol=1e-4, atol=3e-4 * scale)


def _attention_loss(q, k, v):
    s = jnp.einsum("qd,kd->qk", q, k)
    return jnp.sum(jax.nn.softmax(s, axis=-1) @ v)


def test_recomputed_softmax_feeding_a_matmul_is_ordered():
    # The plan saves the scores and recomputes the probabilities from them: the value
    # gradient's matmul reads the recomputed probabilities, so the scores pass a barrier after it.
    q, k, v = (jax.random.normal(jax.random.fold_in(_KEY, i), (16, 8)) for i in range(3))
    part = _partition(_attention_loss, (q, k, v), 1.0)
    ordered = ordering.ordered_eqns(part.backward, len(part.cotangent_outputs))
    assert len(ordered) >= 1
    assert any(tuple(s.aval.shape) == (16, 16) for srcs in ordered.values() for s in srcs)


def test_no_recomputation_no_order():
    q, k, v = (jax.random.normal(jax.random.fold_in(_KEY, i), (16, 8)) for i in range(3))
    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(_attention_loss, q, k, v))
    assert ordering.ordered_eqns(part.backward, len(part.cotangent_outputs)) == {}


def test_a_transposed_weight_is_not_ordered():
    # A matmul operand recomputed by data movement alone (a transposed weight) needs no order.
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w.T))

    w, x = jax.random.normal(_KEY, (8, 4)), jax.random.normal(jax.random.fold_in(_KEY, 1), (3, 4))
    part = _partition(loss, (w, x), 1.0)
    for eqn_sources in ordering.ordered_eqns(part.backward, len(part.cotangent_outputs)).values():
        assert all(tuple(s.aval.shape) != (8, 4) for s in eqn_sources)


def test_fused_program_consume_first_adds_barriers_and_matches_jax():
    q, k, v = (jax.random.normal(jax.random.fold_in(_KEY, 10 + i), (16, 8)) for i in range(3))
    f = jaxaot.aot_function(_attention_loss, partition_fn=functools.partial(
        jaxaot.partition.min_cut_rematerialization_partition, memory_budget=1.0))
    programs, leaves, _ = f.lookup((q, k, v), {})
    tr = programs.training((True, True, True))
    count = lambda c: sum(e.primitive.name == "optimization_barrier" for e in c.jaxpr.eqns)  # noqa: E731
    plain, ordered = fused_program(tr), fused_program(tr, order="consume_first")
    assert count(ordered) > count(plain)
    # The softmax's normalizer, recomputed for the value gradient's matmul, is recomputed again
    # from the barrier's outputs for the score gradient (the re-read keeps the two kernels apart).
    others = lambda c: len(c.jaxpr.eqns) - count(c)  # noqa: E731
    assert others(ordered) > others(plain)
    want = jax.value_and_grad(_attention_loss, argnums=(0, 1, 2))(q, k, v)
    got = C.eval_closed(ordered, *leaves)
    assert_trees_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert_trees_close(got[1:], list(want[1]), rtol=1e-5, atol=1e-6)


def test_a_long_recomputed_chain_does_not_recurse():
    # Recomputed values are computed on first read, iteratively: a chain of thousands of cheap
    # eqns between a residual and its matmul is fine.
    def loss(w, x):
        h = x @ w
        y = h
        for _ in range(3000):
            y = jnp.sin(y)
        return jnp.sum(y @ w.T)

    w, x = jax.random.normal(_KEY, (4, 4)), jax.random.normal(jax.random.fold_in(_KEY, 1), (2, 4))
    part = _partition(loss, (w, x), 1.0)
    cts, residuals = backward_inputs(part, (w, x), _KEY)
    got = ordering.eval_backward(part.backward, len(cts), *cts, *residuals)
    assert_trees_close(got, C.eval_closed(part.backward, *cts, *residuals), rtol=1e-5, atol=1e-6)
