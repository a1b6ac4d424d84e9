"""trace_joint: the joint jaxpr and its metadata."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from zoo import ZOO, assert_trees_close, random_cotangents


def _key():
    return jax.random.key(np.random.randint(1 << 30))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_joint_computes_vjp(name):
    fn, make_args = ZOO[name]
    args = make_args(_key())
    joint = jaxaot.partition.trace_joint(fn, *args)
    C.check_jaxpr(joint.jaxpr)
    out_ref, vjp_ref = jax.vjp(fn, *args)
    ct = random_cotangents(_key(), out_ref)
    leaves = jax.tree_util.tree_leaves(args)
    ct_leaves = [c for c, need in zip(jax.tree_util.tree_leaves(ct), joint.needs_cotangent) if need]
    res = C.eval_closed(joint.jaxpr, *leaves, *ct_leaves)
    outs, grads = res[: joint.num_outputs], res[joint.num_outputs :]
    assert_trees_close(jax.tree_util.tree_unflatten(joint.out_tree, outs), out_ref)
    ref_grads = jax.tree_util.tree_leaves(vjp_ref(ct))
    ref_grads = [g for g, d in zip(ref_grads, joint.differentiable) if d]
    assert_trees_close(grads, ref_grads)


@pytest.mark.smoke
def test_metadata():
    def f(x, n, d):
        return {"y": jnp.sin(x) * n, "i": n + 1, "same": d["z"]}

    joint = jaxaot.partition.trace_joint(f, jnp.ones(3), jnp.int32(2), {"z": jnp.ones(2)})
    assert joint.differentiable == (True, False, True)
    # outputs flatten as i, same, y
    assert joint.needs_cotangent == (False, True, True)
    assert joint.output_is_input == (None, 2, None)
    assert joint.num_cotangents == 2 and joint.num_grads == 2
    assert jax.tree_util.tree_structure(({}, {})) != joint.in_tree
    jaxpr = joint.jaxpr.jaxpr
    assert len(joint.is_backward) == len(jaxpr.eqns)
    for eqn, bwd in zip(jaxpr.eqns, joint.is_backward):
        if str(eqn.primitive) == "sin":
            assert not bwd
        if str(eqn.primitive) == "cos":  # the derivative of sin is forward work too
            assert not bwd
    assert any(joint.is_backward)


def test_kwargs_are_inputs():
    joint = jaxaot.partition.trace_joint(lambda x, *, w: (x * w).sum(), jnp.ones(2), w=jnp.ones(2))
    assert joint.num_primals == 2 and joint.num_grads == 2


def test_inner_jit_is_inlined():
    inner = jax.jit(lambda a, b: a @ b)
    joint = jaxaot.partition.trace_joint(lambda a, b: jnp.tanh(inner(a, b)).sum(), jnp.ones((2, 3)), jnp.ones((3, 2)))
    assert all(e.primitive not in C.INLINABLE_CALLS for e in joint.eqns)


def test_bad_leaf():
    with pytest.raises(jaxaot.errors.InvalidInputError, match=r"arg\[0\]\[1\] is a object"):
        jaxaot.partition.trace_joint(lambda t: t[0], (jnp.ones(2), object()))
