"""The B/W split of a stage's backward: B then W equals the fused backward and jax.vjp, and W keeps few bytes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src.cli import demo_models
from jaxaot.errors import PartitionError
from jaxaot._src.partition import BWSplit, split_backward
from zoo import assert_trees_close, key_stream, random_tree, sds

TOL = dict(rtol=2e-5, atol=2e-5)
fresh_key = key_stream(9100)


# --------------------------------------------------------------------------- stages
def mlp_stage(params, x):
    for w, b in params:
        x = jax.nn.gelu(x @ w + b)
    return x


def mlp_args(key):
    return random_tree(key, ([(sds(16, 16), sds(16)) for _ in range(3)], sds(8, 16)))


def block_stage(params, x):
    return demo_models.block_apply(params, x, heads=2)


def block_args(key):
    shapes = jax.eval_shape(functools.partial(demo_models.block_init, width=16, heads=2, dtype=jnp.float32),
                            jax.random.key(0))
    return random_tree(key, (shapes, sds(2, 8, 16)))


def side_params_stage(params, x):
    """``bias`` and ``gain`` enter after the last use of x's path; ``unused`` not at all."""
    h = jnp.tanh(x @ params["w"])
    return h * params["gain"] + params["bias"]


def side_params_args(key):
    return random_tree(key, ({"w": sds(8, 8), "gain": sds(8), "bias": sds(8), "unused": sds(3)}, sds(4, 8)))


STAGES = {"mlp": (mlp_stage, mlp_args), "block": (block_stage, block_args),
          "side_params": (side_params_stage, side_params_args)}
PARTITIONERS = {"default": jaxaot.partition.default_partition, "min_cut": jaxaot.partition.min_cut_rematerialization_partition}


# --------------------------------------------------------------------------- helpers
def split_stage(fn, params, x, partition_fn, **options) -> tuple[jaxaot.partition.Partition, BWSplit]:
    joint = jaxaot.partition.trace_joint(fn, params, x)
    part = partition_fn(joint)
    n = len(jax.tree_util.tree_leaves(params))
    return part, split_backward(part, activations=[n], **options)


def run_split(fn, part, bw, params, x, ct):
    """``jax.vjp``'s grads, the fused backward's and B-then-W's (merged in grad order): one jitted program."""

    def all_three(params, x, ct):
        leaves = jax.tree_util.tree_leaves((params, x))
        fwd = C.eval_closed(part.forward, *leaves)
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd[i] for i in part.saved_outputs]
        args = [ct, *residuals]
        fused = C.eval_closed(part.backward, *args)
        b_out = C.eval_closed(bw.backward_input, *args)
        w_out = C.eval_closed(bw.backward_weight, *bw.weight_arguments(args, b_out))
        reference = jax.tree_util.tree_leaves(jax.vjp(fn, params, x)[1](ct))
        return reference, fused, bw.merge(part.grad_inputs, b_out[:len(bw.activation_inputs)], w_out)

    return jax.jit(all_three)(params, x, ct)


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_b_then_w_equals_fused_backward_and_vjp(stage, partitioner):
    fn, make_args = STAGES[stage]
    params, x = make_args(fresh_key())
    part, bw = split_stage(fn, params, x, PARTITIONERS[partitioner])
    out = jax.eval_shape(fn, params, x)
    ct = random_tree(fresh_key(), out, scale=1.0)
    reference, fused, merged = run_split(fn, part, bw, params, x, ct)
    assert_trees_close(merged, list(fused), **TOL)
    assert_trees_close(merged, reference, **TOL)


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_w_keeps_no_more_than_the_naive_handoff(stage, partitioner):
    fn, make_args = STAGES[stage]
    params, x = make_args(fresh_key())
    part, bw = split_stage(fn, params, x, PARTITIONERS[partitioner])
    _, naive = split_stage(fn, params, x, PARTITIONERS[partitioner], recompute=False)
    assert bw.live_bytes <= bw.naive_bytes == naive.live_bytes
    assert len(naive.recomputed) == 0
    # W repeats no matmul B ran: only cheap, fusible eqns are recomputed.
    assert not any("dot_general" in line for line in bw.recomputed)
    n = len(jax.tree_util.tree_leaves(params))
    assert bw.activation_inputs == (n,) and bw.weight_inputs == tuple(range(n))
    # B computes the activation gradient without any weight-gradient matmul: it has fewer dots than the fused backward.
    dots = lambda closed: sum(e.primitive.name == "dot_general" for e in C.jaxpr_of(closed).eqns)  # noqa: E731
    assert dots(bw.backward_input) + dots(bw.backward_weight) == dots(part.backward)


def test_min_cut_recomputes_cheap_values_to_keep_fewer_bytes():
    params, x = mlp_args(fresh_key())
    _, bw = split_stage(mlp_stage, params, x, jaxaot.partition.min_cut_rematerialization_partition)
    assert bw.live_bytes < bw.naive_bytes
    assert len(bw.recomputed) > 0


def test_side_params_go_to_w_and_b_does_not_need_them():
    params, x = side_params_args(fresh_key())
    part, bw = split_stage(side_params_stage, params, x, jaxaot.partition.default_partition)
    ct = random_tree(fresh_key(), sds(4, 8))
    reference, _, merged = run_split(side_params_stage, part, bw, params, x, ct)
    grads = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure((params, x)), merged)
    np.testing.assert_array_equal(grads[0]["unused"], np.zeros(3))
    assert_trees_close(merged, reference, **TOL)
    # B needs none of the side parameters' cotangent work: it returns only dx and the handoff.
    assert len(C.jaxpr_of(bw.backward_input).outvars) == 1 + bw.num_handoff


def scaled_weight_stage(params, x):
    """W reads the weights themselves: d(w) needs s and d(s) needs w."""
    return jnp.tanh(x @ (params["w"] * params["s"]))


def test_weights_saved_as_residuals_cost_nothing():
    params, x = random_tree(fresh_key(), ({"s": sds(8, 8), "w": sds(8, 8)}, sds(4, 8)), scale=1.0)
    part, bw = split_stage(scaled_weight_stage, params, x, jaxaot.partition.default_partition)
    invars = C.jaxpr_of(part.backward).invars
    kept = [invars[i].aval for i in bw.kept]
    assert sum(a.size * 4 for a in kept) - bw.kept_bytes == 2 * 8 * 8 * 4  # w and s are kept, and free
    ct = random_tree(fresh_key(), sds(4, 8))
    reference, _, merged = run_split(scaled_weight_stage, part, bw, params, x, ct)
    assert_trees_close(merged, reference, **TOL)


def test_every_gradient_in_b_leaves_w_empty():
    params, x = mlp_args(fresh_key())
    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(mlp_stage, params, x))
    bw = split_backward(part, activations=part.grad_inputs)
    assert bw.weight_inputs == () and bw.live_bytes == 0 and bw.num_handoff == 0


def test_activations_must_be_differentiated_inputs():
    params, x = mlp_args(fresh_key())
    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(mlp_stage, params, x))
    with pytest.raises(PartitionError, match=r"activations \[99\]"):
        split_backward(part, activations=[99])
