"""CallMetadata from ``aot_model.lower(...)``: input kinds, mutations, aliases and duplicates."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

import jaxaot
from flax_models import X, Block


def test_call_metadata_of_a_training_call():
    lowered = jaxaot.nn.aot_module(Block()).lower(X)
    meta = lowered.meta
    kinds = {i.name: (i.kind, i.differentiable, i.mutated) for i in meta.inputs}
    assert kinds["lin.kernel"] == ("parameter", True, False)
    assert kinds["bn.mean"] == ("state", False, True)
    assert kinds["drop.rngs.count"] == ("state", False, True)
    assert kinds["drop.rngs.key"] == ("state", False, False)
    assert kinds["calls"] == ("state", False, True)
    assert kinds["arg[0]"] == ("user_input", True, False)
    user, *state = meta.outputs
    assert (user.kind, user.takes_cotangent, user.is_input) == ("user_output", True, None)
    assert {o.name for o in state} == {"bn.mean", "bn.var", "drop.rngs.count", "calls"}
    for o in state:
        assert o.kind == "mutated_state" and not o.takes_cotangent
        assert meta.inputs[o.mutates].name == o.name
    assert "mutated_state" in str(meta)
    # The runtime agrees: the backward takes the user output's cotangent only,
    # and computes gradients for the parameters and the input only.
    assert lowered.lowered.partition.cotangent_outputs == (0,)
    differentiable = tuple(i for i, x in enumerate(meta.inputs) if x.differentiable)
    assert lowered.lowered.partition.grad_inputs == differentiable


def test_call_metadata_aliases_and_duplicates():
    class Aliases(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(3))
            self.a = nnx.BatchStat(jnp.zeros(3))
            self.b = nnx.BatchStat(jnp.ones(3))

        def __call__(self, x):
            self.a[...] = self.b[...]  # a state update that is another input
            y = x * self.w[...]
            return x, y, y, self.w[...]

    model = Aliases()
    aot = jaxaot.nn.aot_module(model)
    meta = aot.lower(jnp.ones(3)).meta
    names = [i.name for i in meta.inputs]
    x_out, y, y_dup, w_out = meta.outputs
    assert names[x_out.is_input] == "arg[0]" and names[w_out.is_input] == "w"
    assert y.duplicate_of is None and y_dup.duplicate_of == 1
    assert meta.inputs[names.index("a")].mutated and not meta.inputs[names.index("b")].mutated
    assert meta.num_mutated_state_outputs == 0  # a's new value is b itself: no output
    x = jnp.full(3, 2.0)
    outs = aot(x)
    # as nnx.jit returns and writes them: new arrays of the inputs' values, no two Variables sharing one
    assert outs[0] is not x and bool(jnp.all(outs[0] == x))
    assert model.a.get_value() is not model.b.get_value()
    assert bool(jnp.all(model.a.get_value() == model.b.get_value()))
