"""State written back after a call: batch statistics, RNG counts, user Variables, sown state."""

from __future__ import annotations

import chex
import pytest
from flax import nnx

import jaxaot
from flax_models import TOL, X, Block, assert_states_equal


def test_state_after_one_call_equals_eager():
    ref, model = Block(), Block()
    aot = jaxaot.nn.aot_module(model)
    chex.assert_trees_all_close(aot(X), ref(X), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))
    assert int(model.calls[...]) == 1 and int(model.drop.rngs.count[...]) == 1
    # And again: the second call starts from the written-back state.
    chex.assert_trees_all_close(aot(X), ref(X), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))


def test_eval_mode_leaves_batch_stats_unchanged():
    model = Block()
    aot = jaxaot.nn.aot_module(model)
    aot(X)  # one training call so the statistics are not the initial ones
    aot.eval()
    before = nnx.state(model, nnx.BatchStat)
    mean = model.bn.mean.get_value()
    y = aot(X)
    assert model.bn.mean.get_value() is mean  # not even a round trip
    assert_states_equal(nnx.state(model, nnx.BatchStat), before)
    ref = Block()
    ref(X)
    ref.eval()
    chex.assert_trees_all_close(y, ref(X), **TOL)
    # Eval mode is another graphdef: its own entry, inference only.
    assert aot.cache_info().entries[-1].executables == ("inference",)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside")
def test_sow_creates_state_like_eager():
    class Sower(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

        def __call__(self, x):
            y = self.lin(x)
            self.sow(nnx.Intermediate, "hidden", y)
            return y.sum()

    ref, model = Sower(), Sower()
    ref(X)
    jaxaot.nn.aot_module(model)(X)
    assert_states_equal(nnx.state(model), nnx.state(ref))
