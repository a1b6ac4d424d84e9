"""The hot path of a signature places a call as ``jit`` does. After a call on arrays committed to another device,
a call of uncommitted arrays runs on the default device, not where the last call ran; after uncommitted arrays,
arrays committed elsewhere run there. Checked for ``jaxaot.value_and_grad`` (fused and split), ``forward``,
the function itself and ``jax.value_and_grad`` of it, against ``jax.jit`` on fresh random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxaot
from zoo import assert_trees_close, key_stream

pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices "
                                "(XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU)")

fresh_key = key_stream(7300)


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _args():
    k1, k2 = jax.random.split(fresh_key())
    return jax.random.normal(k1, (16, 8)), jax.random.normal(k2, (4, 16))


def _placements():
    d0, d1 = jax.devices()[:2]
    mesh = Mesh(np.array([d0, d1]), ("d",))
    return {
        "plain": lambda a: a,  # uncommitted, on the default device
        "d1": lambda a: jax.device_put(a, d1),
        "d0": lambda a: jax.device_put(a, d0),  # committed to the default device
        "split": lambda a: jax.device_put(a, NamedSharding(mesh, PartitionSpec("d"))),
    }


def _entry_points():
    """name -> (jaxaot's callable, ``jax.jit``'s of the same)."""
    vg = jax.jit(jax.value_and_grad(loss))
    return {
        "value_and_grad": (jaxaot.value_and_grad(jaxaot.aot_function(loss)), vg),
        "value_and_grad_split": (jaxaot.value_and_grad(jaxaot.aot_function(loss), fused=False), vg),
        "forward": ((lambda f: lambda w, x: f.forward(w, x)[0])(jaxaot.aot_function(loss)), jax.jit(loss)),
        "call": (jaxaot.aot_function(loss), jax.jit(loss)),
        "jax_value_and_grad": (jax.value_and_grad(jaxaot.aot_function(loss)), vg),
    }


SEQUENCES = [
    [("d1", "d1"), ("plain", "plain")],
    [("plain", "plain"), ("d1", "d1")],
    [("d1", "d1"), ("d0", "d0")],
    [("d1", "plain"), ("plain", "plain")],
    [("d1", "plain"), ("plain", "d1")],
    [("split", "plain"), ("plain", "plain")],
    [("plain", "plain"), ("split", "plain"), ("plain", "plain")],
]


@pytest.mark.parametrize("sequence", SEQUENCES, ids=lambda s: "-".join("+".join(c) for c in s))
def test_results_live_where_jit_puts_them(sequence):
    put = _placements()
    for name, (got_fn, want_fn) in _entry_points().items():
        for w_at, x_at in sequence:
            for _ in range(2):  # the signature's first call, then its hot path
                w, x = _args()
                w, x = put[w_at](w), put[x_at](x)
                got, want = got_fn(w, x), want_fn(w, x)
                assert_trees_close(got, want)
                where = [leaf.devices() for leaf in jax.tree.leaves(got)]
                assert where == [leaf.devices() for leaf in jax.tree.leaves(want)], (name, w_at, x_at, where)


def test_the_hot_path_still_serves_a_loop_on_another_device():
    """A training loop on arrays committed to device 1 keeps running the hot path (its calls are cache hits)."""
    d1 = jax.devices()[1]
    f = jaxaot.aot_function(loss)
    vg = jaxaot.value_and_grad(f)
    for _ in range(4):
        w, x = jax.device_put(_args(), d1)
        value, grad = vg(w, x)
        assert grad.devices() == {d1}
        assert_trees_close((value, grad), jax.value_and_grad(loss)(w, x))
    info = f.cache_info()
    assert (info.misses, info.hits) == (1, 3)
