"""Side effects (callbacks, prints) run once per call, in order, through aot_function; typed key inputs."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest

import jaxaot
from effects import FWD, Recorder, effectful


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_effects_once_per_call_aot_function(mode, capsys):
    rec = Recorder()
    f = effectful(rec)
    aot = jaxaot.aot_function(f)
    x = jnp.arange(3.0)
    wrap = jax.jit if mode == "jit" else (lambda g: g)
    for _ in range(2):  # the second call hits the cache
        wrap(aot)(x)
        log = rec.take()
        assert sorted(log) == sorted(FWD) and [t for t in log if t != "b"] == ["a", "io"]
        jax.grad(aot)(x) if mode == "eager" else jax.jit(jax.grad(aot))(x)
        log = rec.take()
        assert sorted(log) == sorted(FWD + ["bwd"])
        # JAX orders each kind of ordered effect, not different kinds relative to each other
        # (the H100 ran "io" before "a"): forward effects come before the backward's.
        assert log.index("a") < log.index("bwd") and log.index("io") < log.index("bwd")
    assert capsys.readouterr().out.count("\n") == 4  # jax.debug.print: once per call


def test_effects_forward_and_backward_api():
    rec = Recorder()
    aot = jaxaot.aot_function(effectful(rec))
    y, res = aot.forward(jnp.arange(3.0))
    assert sorted(rec.take()) == sorted(FWD)
    aot.backward(res, jnp.float32(1.0))
    aot.backward(res, jnp.float32(1.0))
    assert rec.take() == ["bwd", "bwd"]  # once per backward, never the forward's


def test_effects_never_recomputed_by_a_remat_partitioner():
    rec = Recorder()
    aot = jaxaot.aot_function(effectful(rec), partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    jax.grad(aot)(jnp.arange(3.0))
    assert sorted(rec.take()) == sorted(FWD + ["bwd"])


def test_typed_key_inputs():
    # nnx keeps RngKey state as typed keys; the runtime takes them as is.
    aot = jaxaot.aot_function(lambda k, x: jax.random.normal(k, x.shape) + x)
    k = jax.random.key(0)
    chex.assert_trees_all_close(aot(k, jnp.ones(3)), jax.random.normal(k, (3,)) + 1)
