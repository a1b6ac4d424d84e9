"""What names a persistent-cache entry: program text, callables, avals."""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.compile import cache_keys, compilers


def counting_partition(joint):
    return jaxaot.partition.default_partition(joint)


def counting_xla(closed, avals, **kwargs):
    return compilers.xla(closed, avals, **kwargs)


def test_canonical_text_is_stable_across_processes():
    class Fake:
        def __init__(self, text):
            self.text = text

        def __str__(self):
            return self.text

    a = cache_keys.canonical_text(Fake("policy=S(frozenset({'b', 'a'})) cb=<function f at 0x7f12>"))
    b = cache_keys.canonical_text(Fake("policy=S(frozenset({'a', 'b'})) cb=<function f at 0x7e99>"))
    assert a == b
    assert a != cache_keys.canonical_text(Fake("policy=S(frozenset({'a', 'c'})) cb=<function f at 0x7e99>"))


def test_callable_identity_sees_code_options_and_closed_over_arrays():
    ident = cache_keys.callable_identity
    assert ident(counting_partition) == ident(counting_partition)
    assert ident(functools.partial(counting_xla, a=1)) != ident(functools.partial(counting_xla, a=2))

    def make(c):
        return lambda joint: c

    assert ident(make(np.zeros(3))) == ident(make(np.zeros(3)))
    assert ident(make(np.zeros(3))) != ident(make(np.ones(3)))


def test_program_fingerprint_sees_consts_inside_sub_jaxprs():
    def program(c):
        return jax.make_jaxpr(lambda x: jax.lax.cond(x > 0, lambda y: y + c, lambda y: y - c, x))(1.0)

    assert cache_keys.program_fingerprint(program(np.float32(2.0))) == cache_keys.program_fingerprint(
        program(np.float32(2.0)))
    assert cache_keys.program_fingerprint(program(np.float32(2.0))) != cache_keys.program_fingerprint(
        program(np.float32(3.0)))


def test_program_fingerprint_sees_the_devices_of_a_sharding_in_the_program():
    """A mesh prints its axes, not its devices: two orders of the same devices are two programs."""
    if jax.device_count() < 2:
        pytest.skip("needs two devices for two orders of them")
    devices = jax.devices()[:2]
    meshes = [jax.sharding.Mesh(np.array(d), ("x",)) for d in (devices, devices[::-1])]

    def program(mesh):
        spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        return jax.make_jaxpr(lambda v: jax.lax.with_sharding_constraint(v * 2, spec))(jnp.ones(4))

    assert str(program(meshes[0])) == str(program(meshes[1]))
    assert cache_keys.program_fingerprint(program(meshes[0])) == cache_keys.program_fingerprint(program(meshes[0]))
    assert cache_keys.program_fingerprint(program(meshes[0])) != cache_keys.program_fingerprint(program(meshes[1]))


def test_avals_key_reads_typed_prng_keys():
    key = jax.eval_shape(lambda: jax.random.key(0))
    text = cache_keys.avals_key([key, jax.ShapeDtypeStruct((2,), jnp.float32)])
    assert "key<fry>" in text and "<f4" in text


def test_unkeyable_values_give_no_key():
    closed = jax.make_jaxpr(jnp.sin)(1.0)
    avals = [jax.ShapeDtypeStruct((), jnp.float32)]
    key = cache_keys.executable_key(compilers.xla, closed, avals, {})
    assert key == cache_keys.executable_key(compilers.xla, closed, avals, {})
    assert key != cache_keys.executable_key(compilers.xla, closed, avals, {"donate_argnums": (0,)})
    assert cache_keys.executable_key(compilers.xla, closed, avals, {"opt": np.array([object()])}) is None


def test_partition_keys_follow_what_the_joint_graph_is_built_from():
    """A partition is keyed by its joint graph's recipe: every argument that changes the joint changes the key."""
    from jaxaot._src.loops import dynamic_capacity
    from jaxaot._src.tracing import JointRecipe

    def recipe(fn=lambda w, x: jnp.sum(jnp.tanh(x @ w)), **fields):
        avals = (jax.ShapeDtypeStruct((3, 2), jnp.float32), jax.ShapeDtypeStruct((4, 3), jnp.float32))
        return JointRecipe(jax.make_jaxpr(fn)(*avals), None, None, avals, **fields)

    key = functools.partial(cache_keys.partition_key, counting_partition)
    base = key(recipe())
    assert base is not None and base == key(recipe())  # traced again: the same key
    others = [
        key(recipe(lambda w, x: jnp.sum(jnp.sin(x @ w)))),                     # another primal program
        key(recipe(differentiated=(True, False))),                             # another differentiated mask
        key(recipe(decompositions={jax.lax.tanh_p: lambda x: 2 * jax.nn.sigmoid(2 * x) - 1})),
        key(recipe(aux_outputs=functools.partial(dynamic_capacity, 32))),      # the runtime's loop stack
        key(recipe(aux_outputs=functools.partial(dynamic_capacity, 64))),
        cache_keys.partition_key(jaxaot.partition.min_cut_rematerialization_partition, recipe()),
    ]
    with jax.numpy_dtype_promotion("strict"):  # JAX's trace context
        others.append(key(recipe()))
    assert None not in others and len({base, *others}) == len(others) + 1
    unkeyable = recipe(aux_outputs=functools.partial(dynamic_capacity, np.array([None], dtype=object)))
    assert key(unkeyable) is None


GAIN = 1.0


def gain_compiler(closed, avals, **kwargs):
    """A compiler that reads a setting of its module (``GAIN``) and calls a helper of it."""
    assert GAIN > 0
    return compilers.xla(_scaled(closed), avals, **kwargs)


def _scaled(closed):
    return closed


def recursive_partition(joint, depth=0):
    return jaxaot.partition.default_partition(joint) if depth else recursive_partition(joint, depth + 1)


def test_a_callable_is_keyed_by_the_module_globals_it_reads(monkeypatch):
    """A compiler or partitioner that reads a setting of its module keys by its value, and by the code of the
    helpers it calls; a recursive function keys once, and library functions by their versions alone."""
    ident = cache_keys.callable_identity
    base = ident(gain_compiler)
    assert base == ident(gain_compiler)
    monkeypatch.setattr(sys.modules[__name__], "GAIN", 2.0)
    assert ident(gain_compiler) != base
    monkeypatch.setattr(sys.modules[__name__], "GAIN", 1.0)
    assert ident(gain_compiler) == base
    monkeypatch.setattr(sys.modules[__name__], "_scaled", lambda closed: closed)  # another helper
    assert ident(gain_compiler) != base

    def countdown(n):
        return n if n <= 0 else countdown(n - 1)

    assert ident(countdown) == ident(countdown) and ident(recursive_partition) == ident(recursive_partition)
    assert ident(jaxaot.partition.min_cut_rematerialization_partition) == ident(
        jaxaot.partition.min_cut_rematerialization_partition)


def test_executable_keys_follow_jax_configuration_that_lowering_reads():
    """``jax_threefry_partitionable`` is read as ``random_bits`` lowers, ``blocked_loops`` as a loop lowers: the
    same program under either setting is another executable."""
    closed = jax.make_jaxpr(lambda k: jax.random.normal(jax.random.wrap_key_data(k), (3,)))(
        jax.random.key_data(jax.random.key(0)))
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    key = functools.partial(cache_keys.executable_key, compilers.xla, closed, avals, {})
    base = key()
    flipped = not jax.config.jax_threefry_partitionable
    with jax.threefry_partitionable(flipped):
        other = key()
    with jaxaot.config.override(blocked_loops=not jaxaot.config.blocked_loops):
        blocked = key()
    assert base is not None and len({base, other, blocked}) == 3 and key() == base


def test_partition_keys_read_the_code_of_custom_rules():
    """Two ``custom_jvp`` functions with one primal and other rules key apart; JAX's own (``jax.nn.relu``) key."""
    from jaxaot._src.tracing import JointRecipe

    def with_rule(scale):
        @jax.custom_jvp
        def act(z):
            return jnp.sin(z)

        act.defjvp(lambda p, t: (act(p[0]), scale * jnp.cos(p[0]) * t[0]))
        return lambda x: jnp.sum(act(x)) + jnp.sum(jax.nn.relu(x))

    def key(fn):
        avals = (jax.ShapeDtypeStruct((3,), jnp.float32),)
        return cache_keys.partition_key(counting_partition, JointRecipe(jax.make_jaxpr(fn)(*avals), None, None, avals))

    one, two = key(with_rule(1.0)), key(with_rule(2.0))
    assert None not in (one, two) and one != two and one == key(with_rule(1.0))
