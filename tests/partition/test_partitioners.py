"""default_partition: what it saves, against jax.fwd_and_bwd."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import _compat as C
from zoo import ZOO


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
    part = jaxaot.default_partition(jaxaot.trace_joint(fn, *args))
    C.check_jaxpr(part.forward)
    C.check_jaxpr(part.backward)
    assert part.saved_bytes <= fwd_and_bwd_bytes(fn, args)


def test_saved_values_are_unique_and_typed():
    def f(x, w):
        h = jnp.tanh(x @ w)
        return h, (h * h).sum()

    part = jaxaot.default_partition(jaxaot.trace_joint(f, jnp.ones((2, 3)), jnp.ones((3, 4))))
    assert part.num_outputs == 2
    srcs = [(r.source, r.index) for r in part.residuals]
    assert len(srcs) == len(set(srcs))
    assert ("output", 0) in srcs  # tanh's output is captured from the outputs
    assert part.saved_bytes == sum(r.nbytes for r in part.residuals)
    assert part.saved_activation_bytes == sum(r.nbytes for r in part.residuals if r.source != "input")
    assert not part.recomputed


def test_constants_are_recomputed_not_saved():
    part = jaxaot.default_partition(jaxaot.trace_joint(lambda x, unused: jnp.sin(x).sum(), jnp.ones(3), jnp.ones(1000)))
    assert part.saved_bytes == 3 * 4  # only x: the zeros for `unused` are made in the backward


def test_split_joint_refuses_insufficient_saves():
    joint = jaxaot.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
    with pytest.raises(jaxaot.PartitionError, match="neither saves nor can recompute"):
        from jaxaot.partition.split import split_joint

        split_joint(joint, [])
