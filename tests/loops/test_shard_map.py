"""Loops inside ``jax.shard_map`` whose trip count differs per device (a condition on the local shard).

The backward of such a loop runs a different number of iterations on each device, so it may hold no collective:
the cotangent of a replicated parameter the body reads is summed across devices once, after the loop. The
mesh takes the largest of 1, 2, 4 and 8 devices the backend has (eight CPU host devices under tests/conftest.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import jaxaot
from zoo import assert_trees_close

N = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())
MAX_STEPS = 6


def _mesh():
    return jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,), devices=jax.devices()[:N])


def _trips(xb):
    return jnp.clip(jnp.floor(jnp.abs(xb[0, 0]) * 3).astype(jnp.int32), 0, MAX_STEPS)


def _loss(while_options):
    def local(w, xb):
        n = _trips(xb)
        _, h = jaxaot.loops.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w + 0.1)), (0, xb),
                                       **while_options)
        return lax.psum(jnp.sum(h**2), "d")

    return jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("d")), out_specs=P())


def _masked_scan_loss(w, x):
    def local(w, xb):
        n = _trips(xb)
        step = lambda h, i: (jnp.where(i < n, jnp.tanh(h @ w + 0.1), h), None)
        h, _ = lax.scan(step, xb, jnp.arange(MAX_STEPS))
        return lax.psum(jnp.sum(h**2), "d")

    return jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("d")), out_specs=P())(w, x)


@pytest.mark.parametrize("options", [dict(max_steps=MAX_STEPS), dict(checkpoints=2),
                                     dict(max_steps=MAX_STEPS, checkpoints=2)], ids=["stack", "revolve", "offline"])
def test_replicated_parameter_gradient_with_trip_counts_differing_per_device(options):
    rng = np.random.default_rng()
    w = jnp.asarray(rng.normal(size=(4, 4)) / 2, jnp.float32)
    x = jnp.asarray(rng.normal(size=(2 * N, 4)), jnp.float32)
    x = x.at[0, 0].set(0.0).at[-2, 0].set(1.9)  # the first device runs no step, the last five
    got = jax.jit(jax.grad(_loss(options), argnums=(0, 1)))(w, x)
    assert_trees_close(got, jax.grad(_masked_scan_loss, argnums=(0, 1))(w, x), rtol=1e-5, atol=1e-5)
    assert_trees_close(jax.grad(_loss(options))(w, x), got[0], rtol=1e-5, atol=1e-5)


def _per_example(while_loop, options):
    def local(w, xb):
        def one(x):
            n = jnp.clip(jnp.floor(jnp.abs(x[0]) * 3).astype(jnp.int32), 0, MAX_STEPS)
            return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w + 0.1)), (0, x),
                              **options)[1]
        return jax.vmap(one)(xb)

    return jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("d")), out_specs=P("d"))


@pytest.mark.parametrize("options", [{}, dict(max_steps=MAX_STEPS)], ids=["forward", "stack"])
def test_vmap_of_a_loop_with_per_example_trip_counts_inside_shard_map(options):
    """Finished lanes keep their carry by a select on a predicate that varies over the mesh axis: the carries
    vary as it does, as ``lax.while_loop``'s run."""
    rng = np.random.default_rng()
    w = jnp.asarray(rng.normal(size=(4, 4)) / 2, jnp.float32)
    x = jnp.asarray(rng.normal(size=(2 * N, 4)), jnp.float32)
    got = _per_example(jaxaot.loops.while_loop, options)
    assert_trees_close(got(w, x), _per_example(lax.while_loop, {})(w, x), rtol=1e-6, atol=1e-6)
    if options:
        def masked(w, x):
            def one(x):
                n = jnp.clip(jnp.floor(jnp.abs(x[0]) * 3).astype(jnp.int32), 0, MAX_STEPS)
                return lax.scan(lambda h, i: (jnp.where(i < n, jnp.tanh(h @ w + 0.1), h), None), x,
                                jnp.arange(MAX_STEPS))[0]
            return jax.shard_map(lambda w, xb: jax.vmap(one)(xb), mesh=_mesh(), in_specs=(P(), P("d")),
                                 out_specs=P("d"))(w, x)

        loss = lambda f: lambda w, x: jnp.sum(f(w, x) ** 2)  # noqa: E731
        assert_trees_close(jax.grad(loss(got), argnums=(0, 1))(w, x), jax.grad(loss(masked), argnums=(0, 1))(w, x),
                           rtol=1e-5, atol=1e-5)
