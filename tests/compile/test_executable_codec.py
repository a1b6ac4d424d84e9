"""A compiled program as a cache entry: a serialized jax.stages.Compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxaot._src.compile import compilers, executable_codec

AVALS = [jax.ShapeDtypeStruct((3,), jnp.float32)]


def _closed():
    return jax.make_jaxpr(lambda x: [jnp.sin(x), jnp.cos(x)])(jnp.ones(3))


def test_an_executable_round_trips():
    payload = executable_codec.encode(compilers.xla(_closed(), AVALS), 1, 2)
    exe = executable_codec.decode(payload)
    assert isinstance(exe, jax.stages.Compiled)
    assert [o.tolist() for o in exe(jnp.zeros(3))] == [[0.0] * 3, [1.0] * 3]


def test_what_cannot_be_rebuilt_is_not_encoded():
    assert executable_codec.encode(compilers.nop(_closed(), AVALS), 1, 2) is None  # not a Compiled
    assert executable_codec.encode(compilers.xla(_closed(), AVALS), 1, 3) is None  # trees do not match
    assert executable_codec.decode(b"\x00\x00\x00\x00junk") is None
