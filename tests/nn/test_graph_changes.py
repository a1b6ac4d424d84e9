"""A forward that changes its module's graph other than through Variables is refused, not dropped.

Eager Flax and ``nnx.jit`` keep an attribute the forward assigns (``self.calls += 1``, ``self.last = self.l``), a
submodule it builds, a list it appends to; ``aot_module`` writes back Variable values only, so its call raises
:class:`~jaxaot.errors.InvalidInputError` naming the paths, leaves the module as it was, and keeps working for calls
that change nothing. Variable values, replaced Variables of the same type, sown values and RNG counts are written
back as in Flax. Each against plain ``flax.nnx`` on fresh random inputs.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxaot
from jaxaot.errors import InvalidInputError


def _x(shape=(3, 4)):
    return jax.random.normal(jax.random.key(int(np.random.default_rng().integers(1 << 30))), shape)


class Count(nnx.Variable):
    pass


class Changing(nnx.Module):
    """A forward that, when told to, changes one thing of the module's graph."""

    def __init__(self):
        self.l = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.calls = 0
        self.last = nnx.data(None)
        self.cache = nnx.data(None)
        self.proj = nnx.data(None)
        self.hist = []
        self.count = Count(jnp.array(0.0))

    def __call__(self, x, change=None):
        y = self.l(x)
        if change == "counter":
            self.calls += 1
        elif change == "alias":
            self.last = self.l
        elif change == "new variable":
            self.cache = nnx.Variable(y)
        elif change == "lazy submodule":
            self.proj = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
        elif change == "list append":
            self.hist.append(1)
        elif change == "value":
            self.count[...] += 1
        elif change == "replaced variable":
            self.count = Count(self.count[...] + 1)
        elif change == "sow":
            self.sow(nnx.Intermediate, "y", y)
        return y


CHANGES = {"counter": "`calls`: 0 → 1", "alias": "`last`: None → the Linear at `l`",
           "new variable": "`cache`: None → Variable", "lazy submodule": "`proj`: None → Linear",
           "list append": "`hist[0]` is new (1)"}


def _state(module):
    def plain(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return jax.tree.map(plain, nnx.to_pure_dict(nnx.state(module)))


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("how", ["call", "jaxaot.value_and_grad", "nnx.value_and_grad"])
def test_a_graph_change_is_refused_naming_it_and_the_module_keeps_working(change, how):
    plain, aot = Changing(), jaxaot.nn.aot_module(Changing())
    x = _x()
    before = _state(aot)
    run = {"call": lambda m, x, c: m(x, c),
           "jaxaot.value_and_grad": jaxaot.value_and_grad(lambda m, x, c: jnp.sum(m(x, c))),
           "nnx.value_and_grad": nnx.value_and_grad(lambda m, x, c: jnp.sum(m(x, c)))}[how]
    with pytest.raises(InvalidInputError, match="nnx.jit") as info:
        run(aot, x, change)
    assert CHANGES[change] in str(info.value)
    # The module is as it was: its structure, attributes and values.
    assert (aot.calls, aot.last, aot.cache, aot.proj, aot.hist) == (0, None, None, None, [])
    chex.assert_trees_all_equal(_state(aot), before)
    # A call that changes nothing runs as the eager module's.
    chex.assert_trees_all_close(aot(x), plain(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(InvalidInputError):  # and the change is refused again, not taken from a cache
        aot(x, change)


@pytest.mark.filterwarnings(r"ignore:Using .Module.sow\(\). outside:DeprecationWarning")
@pytest.mark.parametrize("change", ["value", "replaced variable", "sow"])
def test_variables_the_forward_changes_or_adds_are_written_back_as_in_flax(change):
    plain, aot = Changing(), jaxaot.nn.aot_module(Changing())
    jitted = nnx.jit(lambda m, x: m(x, change))
    reference = Changing()
    for _ in range(3):
        x = _x()
        chex.assert_trees_all_close(aot(x, change), plain(x, change), rtol=1e-6, atol=1e-6)
        jitted(reference, x)
    chex.assert_trees_all_close(_state(aot), _state(plain), rtol=1e-6, atol=1e-6)
    assert float(aot.count[...]) == float(reference.count[...]) == (0.0 if change == "sow" else 3.0)
    assert type(aot.count) is Count


def test_rng_counts_and_batch_statistics_are_written_back_as_in_flax():
    def make():
        return nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.BatchNorm(8, rngs=nnx.Rngs(0)),
                              nnx.Dropout(0.5, rngs=nnx.Rngs(1)))

    plain, aot = make(), jaxaot.nn.aot_module(make())
    # XLA fuses the batch statistics, so float32 rounding differs from eager nnx; a batch of three normalised and
    # doubled by the dropout reaches a few units, where 1e-5 relative is within a few ulps of the reduction.
    for _ in range(3):
        x = _x()
        chex.assert_trees_all_close(aot(x), plain(x), rtol=1e-4, atol=1e-5)
    chex.assert_trees_all_close(_state(aot), _state(plain), rtol=1e-4, atol=1e-5)


def test_a_loss_that_switches_the_module_s_mode_is_named_and_the_module_keeps_its_mode():
    """``m.eval()`` inside the loss of a model in train mode, back with ``m.train()``: nothing changed, it runs as
    ``nnx.value_and_grad``. The same loss on a model in eval mode ends in train mode: refused, naming the loss and
    the switch, and the model stays in eval mode."""
    def switching(m, x):
        m.eval()
        y = m(x)
        m.train()
        return jnp.sum(y)

    def make():
        return nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))

    x = _x()
    aot, plain = jaxaot.nn.aot_module(make()), make()
    chex.assert_trees_all_close(jaxaot.value_and_grad(switching)(aot, x), nnx.value_and_grad(switching)(plain, x),
                                rtol=1e-5, atol=1e-6)
    aot.eval()
    with pytest.raises(InvalidInputError, match=r"the loss function switching changed .*use_running_average.*"
                                                 r"m\.train\(\), m\.eval\(\)"):
        jaxaot.value_and_grad(switching)(aot, x)
    assert aot.layers[1].use_running_average
