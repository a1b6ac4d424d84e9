"""Static and dynamic call arguments: unhashable statics, missing positions, Flax objects as inputs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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


class _TaggedParam(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 2, rngs=rngs)
        self.tag = nnx.Param("hello")  # a str in a Param: eager Flax calls it, nnx.jit refuses it

    def __call__(self, x):
        return self.lin(x)


class _TaggedOutput(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 2, rngs=rngs)

    def __call__(self, x):
        return {"y": self.lin(x), "tag": "done"}


def test_a_variable_holding_a_str_and_a_str_output_are_named_as_the_user_wrote_them():
    x = jnp.asarray(np.random.default_rng().standard_normal((4, 3)), jnp.float32)
    tagged = jaxaot.nn.aot_module(_TaggedParam(nnx.Rngs(0)))
    for call in (lambda: tagged(x), lambda: jaxaot.grad(lambda m, x: m(x).sum())(tagged, x)):
        with pytest.raises(jaxaot.errors.InvalidInputError, match=r"attribute `tag` \(an nnx.Param\) holds a str"):
            call()
    with pytest.raises(jaxaot.errors.InvalidOutputError, match=r"^output\['tag'\] is a str.*returns arrays only"):
        jaxaot.nn.aot_module(_TaggedOutput(nnx.Rngs(0)))(x)
