"""Side effects (callbacks, prints) run once per call, in order, through aot_module."""

from __future__ import annotations

from flax import nnx

import jaxaot
from effects import FWD, Recorder, effectful
from flax_models import X


class Effectful(nnx.Module):
    def __init__(self, rec: Recorder):
        self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(3, rngs=nnx.Rngs(0))
        self.f = effectful(rec)

    def __call__(self, x):
        return self.f(self.bn(self.lin(x)))


def test_effects_once_per_call_aot_module():
    rec = Recorder()
    aot = jaxaot.nn.aot_module(Effectful(rec))
    for _ in range(2):
        aot(X)
        assert sorted(rec.take()) == sorted(FWD)
        nnx.grad(lambda m: m(X))(aot)
        log = rec.take()
        assert sorted(log) == sorted(FWD + ["bwd"])
        # JAX orders each kind of ordered effect, not different kinds relative to each other
        # (the H100 ran "io" before "a"): forward effects come before the backward's.
        assert log.index("a") < log.index("bwd") and log.index("io") < log.index("bwd")
        nnx.jit(lambda m: nnx.grad(lambda m: m(X))(m))(aot)
        assert sorted(rec.take()) == sorted(FWD + ["bwd"])
