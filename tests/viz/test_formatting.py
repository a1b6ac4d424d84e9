"""jaxaot._src.viz's short texts: source locations, avals (byte sizes: tests/test_units.py)."""

import jax
import jax.numpy as jnp

from jaxaot._src import viz


def test_formatting_helpers():
    assert viz.short_source("/a/b/model.py:12:3 (f)") == ("model.py:12", "f")
    assert viz.short_source("<unknown>") == ("<unknown>", "<unknown>")
    assert viz.aval_str(jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)) == "bf16[2,3]"
