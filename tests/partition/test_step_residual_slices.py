"""Residuals the backward only slices pass the fused step's barrier as their slices."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src.fusion import fused_program
from jaxaot._src.partition.step import slice_residual_reads
from zoo import assert_trees_close


def _key(seed):
    return jax.random.key(np.random.SeedSequence(seed).generate_state(1)[0])


def fused_qkv_attention(w, x):
    """One projection split into query, key and value: the backward only slices its output."""
    q, k, v = jnp.split(x @ w, 3, axis=-1)
    p = jax.nn.softmax(q @ k.T / np.sqrt(q.shape[-1]), axis=-1)
    return jnp.sum(jnp.tanh(p @ v) ** 2)


def _args(seed, n=8, d=4):
    k1, k2 = jax.random.split(_key(seed))
    return jax.random.normal(k1, (d, 3 * d)) / 2, jax.random.normal(k2, (n, d))


def _training(f, args):
    return f.lookup(args, {}).programs.training()


def _barrier_operands(closed):
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "optimization_barrier"]
    return [v.aval.shape for v in eqn.invars]


def test_a_residual_read_only_by_slices_is_replaced_by_them():
    def bwd(g, qkv, other):
        q, k, v = jnp.split(qkv, 3, axis=-1)
        return g * q + k * other, g * v + jax.lax.slice(other, (0, 0), (2, 4))

    args = (jnp.ones((2, 4)), jnp.arange(24.0).reshape(2, 12), jnp.ones((2, 4)))
    closed = jax.make_jaxpr(bwd)(*args)
    sliced = slice_residual_reads(closed, 1)
    assert [len(s) for s in sliced.slicers] == [1, 0]  # ``other`` is also read whole: it stays
    assert [v.aval.shape for v in C.jaxpr_of(sliced.backward).invars] == [(2, 4)] * 5
    assert not [e for e in C.jaxpr_of(sliced.backward).eqns if e.primitive.name == "split"]
    residuals, owner = sliced.expand(list(args[1:]))
    assert owner == [0, 0, 0, 1]
    got = C.eval_closed(sliced.backward, args[0], *residuals)
    assert_trees_close(got, list(bwd(*args)), rtol=0, atol=0)


def test_positions_and_outputs_keep_the_residual_whole_and_unread_slices_are_not_passed():
    def bwd(g, a, b, c):
        first, _ = jnp.split(c, 2)  # one slice unused: a dropped output
        return g * jnp.split(a, 2)[0], b, g * first

    args = (jnp.ones(2), jnp.ones(4), jnp.ones(4), jnp.ones(4))
    closed = jax.make_jaxpr(bwd)(*args)
    everything = slice_residual_reads(closed, 1)
    assert [len(s) for s in everything.slicers] == [1, 0, 1]  # ``b`` is an output
    assert [v.aval.shape for v in C.jaxpr_of(everything.backward).invars] == [(2,), (2,), (4,), (2,)]  # unread halves
    residuals, owner = everything.expand(list(args[1:]))
    assert owner == [0, 1, 2]
    assert_trees_close(C.eval_closed(everything.backward, args[0], *residuals), list(bwd(*args)), rtol=0, atol=0)
    assert [len(s) for s in slice_residual_reads(closed, 1, positions={1, 2}).slicers][0] == 0
    assert [len(s) for s in slice_residual_reads(closed, 1, positions={0}).slicers][0] == 1
    unchanged = slice_residual_reads(closed, 1, positions=set())
    assert unchanged.backward is closed


@pytest.mark.parametrize("order", ["xla", "consume_first"])
@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_fused_step_with_sliced_residuals_equals_jax(order, budget):
    w, x = _args(hash((order, budget)) % 991)
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(fused_qkv_attention, partition_fn=pf)
    tr = _training(f, (w, x))
    want = jax.value_and_grad(fused_qkv_attention, argnums=(0, 1))(w, x)
    for slices in (False, True):
        closed = fused_program(tr, order=order, slices=slices)
        got = C.eval_closed(closed, w, x)
        assert_trees_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert_trees_close(got[1:], list(want[1]), rtol=1e-4, atol=1e-6)


def test_the_projection_output_passes_the_barrier_as_three_slices():
    w, x = _args(3)
    f = jaxaot.aot_function(fused_qkv_attention, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    tr = _training(f, (w, x))
    fwd = C.jaxpr_of(tr.partition.forward)
    saved = [fwd.outvars[i].aval.shape for i in tr.partition.saved_outputs]
    whole = _barrier_operands(fused_program(tr, slices=False))
    pieces = _barrier_operands(fused_program(tr, slices=True))
    assert (8, 12) in saved and (8, 12) in whole  # the plan saves the projection's output ...
    assert (8, 12) not in pieces and pieces.count((8, 4)) >= whole.count((8, 4)) + 3  # ... passed as q, k, v
    assert sum(map(np.prod, pieces)) == sum(map(np.prod, whole))  # the same bytes


def test_value_and_grad_runs_the_sliced_step():
    w, x = _args(5)
    f = jaxaot.aot_function(fused_qkv_attention, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(w, x)
    assert_trees_close(got, jax.value_and_grad(fused_qkv_attention, argnums=(0, 1))(w, x), rtol=1e-4, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(pieces=st.integers(1, 4), axis=st.integers(0, 1), used=st.integers(1, 15), seed=st.integers(0, 2**16))
def test_any_split_read_by_any_subset_matches_the_unsliced_backward(pieces, axis, used, seed):
    # Generated splits: any axis, any number of pieces, any nonempty subset of them read.
    shape = (2 * pieces, 3 * pieces)
    read = [i for i in range(pieces) if used >> i & 1] or [0]

    def bwd(g, r):
        parts = jnp.split(r, pieces, axis=axis)
        return g * sum(jnp.sum(jnp.sin(parts[i]) * (i + 1)) for i in read)

    g, r = jnp.float32(1.5), jax.random.normal(_key(seed), shape)
    closed = jax.make_jaxpr(bwd)(g, r)
    sliced = slice_residual_reads(closed, 1)
    residuals, owner = sliced.expand([r])
    assert owner == [0] * len(read) and len(C.jaxpr_of(sliced.backward).invars) == 1 + len(read)
    assert_trees_close(C.eval_closed(sliced.backward, g, *residuals), C.eval_closed(closed, g, r), rtol=1e-6, atol=0)


def test_sliced_fused_step_on_a_mesh_keeps_gradient_shardings():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    size = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())  # 8 (tests/conftest.py), or the GPUs
    mesh = jax.make_mesh((size,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:size])
    w, x = _args(9, n=16, d=8)
    w = jax.device_put(w, NamedSharding(mesh, P(None, "data")))
    x = jax.device_put(x, NamedSharding(mesh, P("data")))
    f = jaxaot.aot_function(fused_qkv_attention, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    got = jaxaot.value_and_grad(f, argnums=(0, 1))(w, x)
    want = jax.jit(jax.value_and_grad(fused_qkv_attention, argnums=(0, 1)))(w, x)
    assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
    for g, a in zip(got[1], (w, x)):
        assert g.sharding.is_equivalent_to(a.sharding, a.ndim)
    tr = f.lookup((w, x), {}).programs.training()
    assert any(slice_residual_reads(tr.partition.backward, 1).slicers)  # the sliced path ran
