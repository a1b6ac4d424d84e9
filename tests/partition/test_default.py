"""default_partition (what it saves, against jax.fwd_and_bwd) and differentiate() (f/df with
TorchScript's bookkeeping reproduce jax.vjp)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from zoo import ZOO, assert_trees_close, random_cotangents


def _key():
    return jax.random.key(np.random.randint(1 << 30))


def _diff_argnums(args):
    return tuple(
        i for i, a in enumerate(args)
        if all(jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in jax.tree_util.tree_leaves(a))
    )


def fwd_and_bwd_bytes(fn, args):
    fwd, _ = jax.fwd_and_bwd(fn, argnums=_diff_argnums(args))
    _, res = fwd(*args)
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(res) if hasattr(x, "nbytes"))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_never_saves_more_than_fwd_and_bwd(name):
    fn, make_args = ZOO[name]
    args = make_args(_key())
    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(fn, *args))
    C.check_jaxpr(part.forward)
    C.check_jaxpr(part.backward)
    assert part.saved_bytes <= fwd_and_bwd_bytes(fn, args)


def test_saved_values_are_unique_and_typed():
    def f(x, w):
        h = jnp.tanh(x @ w)
        return h, (h * h).sum()

    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(f, jnp.ones((2, 3)), jnp.ones((3, 4))))
    assert part.num_outputs == 2
    srcs = [(r.source, r.index) for r in part.residuals]
    assert len(srcs) == len(set(srcs))
    assert ("output", 0) in srcs  # tanh's output is captured from the outputs
    assert part.saved_bytes == sum(r.nbytes for r in part.residuals)
    assert part.saved_activation_bytes == sum(r.nbytes for r in part.residuals if r.source != "input")
    assert not part.recomputed


def test_constants_are_recomputed_not_saved():
    part = jaxaot.partition.default_partition(jaxaot.partition.trace_joint(lambda x, unused: jnp.sin(x).sum(), jnp.ones(3), jnp.ones(1000)))
    assert part.saved_bytes == 3 * 4  # only x: the zeros for `unused` are made in the backward


def test_split_joint_refuses_insufficient_saves():
    joint = jaxaot.partition.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
    with pytest.raises(jaxaot.errors.PartitionError, match="neither saves nor can recompute"):
        from jaxaot._src.partition import split_joint

        split_joint(joint, [])


# --------------------------------------------------------------------------- differentiate
def run_gradient(g: jaxaot.partition.Gradient, inputs, cts_all):
    f_outs = C.eval_closed(g.f, *inputs)
    df_args = (
        [cts_all[i] for i in g.df_input_vjps]
        + [inputs[i] for i in g.df_input_captured_inputs]
        + [f_outs[i] for i in g.df_input_captured_outputs]
    )
    grads = C.eval_closed(g.df, *df_args)
    return f_outs[: g.f_real_outputs], dict(zip(g.df_output_vjps, grads))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_differentiate_reproduces_vjp(name):
    fn, make_args = ZOO[name]
    args = make_args(_key())
    g = jaxaot.partition.differentiate(fn, *args)
    inputs = jax.tree_util.tree_leaves(args)
    out_ref, vjp_ref = jax.vjp(fn, *args)
    ct = random_cotangents(_key(), out_ref)
    outs, grads = run_gradient(g, inputs, jax.tree_util.tree_leaves(ct))
    assert_trees_close(outs, jax.tree_util.tree_leaves(out_ref))
    ref = jax.tree_util.tree_leaves(vjp_ref(ct))
    for i, r in enumerate(ref):
        if i in grads:
            assert_trees_close(grads[i], r)
        else:
            assert r.dtype == jax.dtypes.float0


def test_bookkeeping_fields():
    def f(x, w, n):
        y = jnp.exp(x @ w)  # exp's output is reused by its derivative
        return y, n * 2

    x, w = jnp.ones((2, 3)), jnp.ones((3, 4))
    g = jaxaot.partition.differentiate(f, x, w, jnp.int32(1))
    assert g.f_real_outputs == 2
    assert g.df_input_vjps == (0,)  # the int output takes no cotangent
    assert g.df_output_vjps == (0, 1)
    assert set(g.df_input_captured_inputs) == {0, 1}
    assert 0 in g.df_input_captured_outputs  # y is captured from the outputs, not re-emitted
    f_out = g.f.jaxpr.outvars
    assert len(set(map(id, f_out))) == len(f_out)  # values are deduplicated
    assert not any(v in g.f.jaxpr.invars for v in f_out[g.f_real_outputs:])  # inputs never re-emitted
    assert len(g.df.jaxpr.invars) == 1 + len(g.df_input_captured_inputs) + len(g.df_input_captured_outputs)


def test_unused_cotangent_is_not_materialised():
    g = jaxaot.partition.differentiate(lambda x: (jnp.sin(x), jnp.argmax(x)), jnp.ones(3))
    assert g.df_input_vjps == (0,)
    assert all(v.aval.dtype != jax.dtypes.float0 for v in g.df.jaxpr.invars)


def test_not_callable():
    with pytest.raises(TypeError, match="callable"):
        jaxaot.partition.differentiate(None, jnp.ones(2))
