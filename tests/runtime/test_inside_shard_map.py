"""An ``aot_function`` called inside ``jax.shard_map``: each input keeps the manual axes it varies over.

Under ``shard_map``'s default ``check_vma=True`` a replicated parameter and a sharded batch are values of
different types (invariant, varying over the batch axis). The function's programs are traced from inputs of
those types, so they replay there as the function itself would run: values and gradients equal
``shard_map`` of the plain function under ``jax.jit`` and ``jax.grad``, with every partitioner. The mesh takes
the largest of 1, 2, 4 and 8 devices the backend has (eight CPU host devices under tests/conftest.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxaot
from jaxaot.errors import PartitionError
from zoo import assert_trees_close

N = max(n for n in (1, 2, 4, 8) if n <= jax.device_count())
PARTITIONERS = {
    "default": jaxaot.partition.default_partition,
    "min_cut_0.5": functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5),
}


def _mesh():
    return jax.make_mesh((N,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:N])


def replicated_times_sharded(w, x):
    """A replicated weight meets a sharded batch: JAX inserts the ``pvary`` the weight needs."""
    return jnp.tanh(x @ w) * 2.0


def summed_over_devices(w, x):
    """A ``psum`` of sharded values: replicated out."""
    return lax.psum(jnp.sum(jnp.sin(x @ w) ** 2), "d")


def varying_from_replicated(w, x):
    """Replicated in, varying out: the device's index enters the value."""
    del x
    return jnp.cos(w) * (lax.axis_index("d") + 1.0)


#: name -> (function, out_specs)
CASES = {"replicated_times_sharded": (replicated_times_sharded, P("d")),
         "summed_over_devices": (summed_over_devices, P()),
         "varying_from_replicated": (varying_from_replicated, P("d"))}


def _args():
    rng = np.random.default_rng()
    return (jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), jnp.asarray(rng.normal(size=(2 * N, 3)), jnp.float32))


@pytest.mark.parametrize("partitioner", sorted(PARTITIONERS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_the_plain_function_s(name, partitioner):
    fn, out_spec = CASES[name]
    aot = jaxaot.aot_function(fn, partition_fn=PARTITIONERS[partitioner])

    def mapped(f):
        return jax.shard_map(f, mesh=_mesh(), in_specs=(P(), P("d")), out_specs=out_spec)

    def loss(f):
        return lambda w, x: jnp.sum(mapped(f)(w, x) ** 2)

    for _ in range(2):  # fresh inputs each time; the second call reuses the programs
        w, x = _args()
        assert_trees_close(jax.jit(mapped(aot))(w, x), jax.jit(mapped(fn))(w, x), rtol=1e-5, atol=1e-5)
        assert_trees_close(mapped(aot)(w, x), mapped(fn)(w, x), rtol=1e-5, atol=1e-5)
        want = jax.value_and_grad(loss(fn), argnums=(0, 1))(w, x)
        assert_trees_close(jax.value_and_grad(loss(aot), argnums=(0, 1))(w, x), want, rtol=1e-5, atol=1e-5)
        assert_trees_close(jax.jit(jax.grad(loss(aot), argnums=(0, 1)))(w, x), want[1], rtol=1e-5, atol=1e-5)


def test_an_input_of_another_variance_is_another_signature():
    """The same shapes, once replicated and once sharded over the axis, are traced apart."""
    aot = jaxaot.aot_function(replicated_times_sharded)
    mesh = _mesh()
    w, x = _args()
    for specs in ((P(), P("d")), (P(), P())):
        xs = x if specs[1] == P("d") else x[:2]  # replicated: each device's rows are the whole array's
        got = jax.jit(jax.shard_map(aot, mesh=mesh, in_specs=specs, out_specs=specs[1]))(w, xs)
        want = jax.jit(jax.shard_map(replicated_times_sharded, mesh=mesh, in_specs=specs, out_specs=specs[1]))(w, xs)
        assert_trees_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(aot.cache_info().entries) == 2  # varying over "d", or not: two types, on any number of devices


def _looped(loop, **options):
    """A replicated weight applied to a sharded batch five times in a loop, then averaged over the devices."""
    def body(w, xb):
        _, h = loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w + xb)), (0, xb), **options)
        return lax.pmean(jnp.mean(h ** 2), "d")
    return body


@pytest.mark.parametrize("options", [{"max_steps": 8}, {"checkpoints": 2}])
def test_a_while_loop_inside_keeps_its_carries_types(options):
    """The loop's carries, stacks and snapshots vary as the values written to them do: values and gradients equal
    ``lax.while_loop``'s (forward) and ``lax.fori_loop``'s (gradients), also as an ``aot_function``."""
    mesh = _mesh()
    mapped = lambda f: jax.shard_map(f, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())  # noqa: E731
    ours, ref = _looped(jaxaot.loops.while_loop, **options), _looped(lax.while_loop)
    rng = np.random.default_rng()
    w = jnp.asarray(rng.normal(size=(4, 4)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(2 * N, 4)), jnp.float32)
    fori = lambda w, xb: lax.pmean(jnp.mean(lax.fori_loop(0, 5, lambda i, h: jnp.tanh(h @ w + xb), xb) ** 2), "d")  # noqa: E731
    want = jax.value_and_grad(mapped(fori))(w, x)
    assert_trees_close(jax.jit(mapped(ours))(w, x), jax.jit(mapped(ref))(w, x), rtol=1e-6)
    for body in (ours, jaxaot.aot_function(ours)):
        assert_trees_close(jax.jit(jax.value_and_grad(mapped(body)))(w, x), want, rtol=1e-5, atol=1e-6)


def test_a_byte_budget_inside_is_refused_with_what_to_do_instead():
    """Per-device programs compile only inside their shard_map, so a byte budget cannot be measured there; a
    fraction plans, and the aot_function of the whole shard_map measures bytes per device."""
    mesh = _mesh()
    min_cut = jaxaot.partition.min_cut_rematerialization_partition
    mapped = lambda f: jax.shard_map(f, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())  # noqa: E731
    w, x = _args()
    want = jax.value_and_grad(mapped(summed_over_devices))(w, x)
    inner = jaxaot.aot_function(summed_over_devices, partition_fn=functools.partial(min_cut, memory_budget="1MB"))
    with pytest.raises(PartitionError, match="inside jax.shard_map.*Give a fraction"):
        jax.value_and_grad(mapped(inner))(w, x)
    fraction = jaxaot.aot_function(summed_over_devices, partition_fn=functools.partial(min_cut, memory_budget=0.5))
    assert_trees_close(jax.value_and_grad(mapped(fraction))(w, x), want, rtol=1e-5, atol=1e-6)
    outer = jaxaot.aot_function(mapped(summed_over_devices), partition_fn=functools.partial(min_cut, memory_budget="1MB"))
    assert_trees_close(jaxaot.value_and_grad(outer)(w, x), want, rtol=1e-5, atol=1e-6)


def test_compiled_autograd_of_an_eager_shard_map_falls_back_with_jax_s_gradients():
    """Called eagerly, a shard_map is not recorded: the step runs under jax.vjp, says so, and equals JAX's; jitted,
    it is one recorded operation."""
    mapped = jax.shard_map(summed_over_devices, mesh=_mesh(), in_specs=(P(), P("d")), out_specs=P())
    jaxaot.compiled_autograd.reset()
    for fn in (mapped, jax.jit(mapped)):
        vg = jaxaot.compiled_value_and_grad(fn)
        for _ in range(2):
            w, x = _args()
            assert_trees_close(vg(w, x), jax.value_and_grad(mapped)(w, x), rtol=1e-5, atol=1e-6)
    fallbacks = jaxaot.compiled_autograd.stats().fallbacks
    assert len(fallbacks) == 1 and "eager shard_map" in fallbacks[0], fallbacks
