"""What names a persistent-cache entry: program text, callables, avals."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

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
