"""jaxaot._src.viz's short texts: byte sizes, source locations, avals."""

import jax
import jax.numpy as jnp

from jaxaot import viz


def test_formatting_helpers():
    assert viz.format_bytes(100) == "100 B" and viz.format_bytes(2048) == "2.0 KiB"
    assert viz.short_source("/a/b/model.py:12:3 (f)") == ("model.py:12", "f")
    assert viz.aval_str(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)) == "bf16[2,3]"
