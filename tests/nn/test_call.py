"""Static and dynamic call arguments: unhashable statics, missing positions, Flax objects as inputs."""

from __future__ import annotations

import pytest
from flax import nnx

import jaxaot
from flax_models import X, Block


def test_bad_call_arguments_raise_documented_errors():
    aot = jaxaot.nn.aot_module(Block(), static_argnums=1)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="not hashable"):
        aot(X, [1, 2])
    with pytest.raises(jaxaot.errors.InvalidInputError, match="called with 1 positional"):
        aot(X)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="arg\\[0\\] is a Linear"):
        jaxaot.nn.aot_module(Block())(nnx.Linear(3, 3, rngs=nnx.Rngs(0)))
