"""AOTModule (flax.nnx): training against eager Flax, transformations, methods and statics."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxaot
from flax_models import TOL, X, Block, assert_states_equal, batch, block_loss, nnx_model, xent

STEPS = 20


def nnx_train(name: str, aot: bool):
    model = nnx_model(name)
    m = jaxaot.nn.aot_module(model) if aot else model
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

    def loss_fn(mm, x, y):
        return xent(mm(x), y)

    losses = []
    for step in range(STEPS):
        x, y = batch(name, step)
        loss, grads = nnx.value_and_grad(loss_fn)(m, x, y)
        opt.update(m, grads)
        losses.append(loss)
    return jnp.stack(losses), nnx.state(model), m


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_nnx_training_matches_eager(name):
    ref_losses, ref_state, _ = nnx_train(name, aot=False)
    losses, state, aot_model = nnx_train(name, aot=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    assert_states_equal(state, ref_state)  # parameters, batch statistics, RNG counts
    # Training built only the forward and backward executables, once.
    (entry,) = aot_model.cache_info().entries
    assert all(e.startswith(("forward", "backward")) for e in entry.executables), entry.executables


@pytest.mark.smoke
def test_inference_only_builds_inference_executable():
    model = Block()
    model.eval()
    aot = jaxaot.nn.aot_module(model)
    for _ in range(3):
        aot(X)
    info = aot.cache_info()
    assert info.misses == 1 and info.hits == 2
    assert info.entries[0].executables == ("inference",)


def test_nnx_grad_and_jax_grad_over_split_state():
    # The Linear's bias feeds a BatchNorm: its gradient is exactly zero, and what either program
    # computes for it is rounding noise of about 1e-6 (it varies with the CPU's vector width).
    grad_tol = dict(TOL, atol=max(TOL["atol"], 1e-5))
    ref, model = Block(), Block()
    aot = jaxaot.nn.aot_module(model)
    g_ref = nnx.grad(block_loss)(ref, X)
    g = nnx.grad(block_loss)(aot, X)
    chex.assert_trees_all_close(g, g_ref, **grad_tol)
    assert_states_equal(nnx.state(model), nnx.state(ref))

    def split_loss(graphdef, params, rest):
        m = nnx.merge(graphdef, params, rest, copy=True)  # fresh Variables: this trace may mutate them
        return block_loss(m, X), nnx.state(m, nnx.Not(nnx.Param))

    gd_ref, p_ref, r_ref = nnx.split(ref, nnx.Param, ...)
    gd, p, r = nnx.split(aot, nnx.Param, ...)
    (l_ref, s_ref), g_ref = jax.value_and_grad(split_loss, argnums=1, has_aux=True)(gd_ref, p_ref, r_ref)
    (l, s), g = jax.value_and_grad(split_loss, argnums=1, has_aux=True)(gd, p, r)
    chex.assert_trees_all_close(l, l_ref, **TOL)
    chex.assert_trees_all_close(g, g_ref, **grad_tol)
    assert_states_equal(s, s_ref)


def test_train_step_under_nnx_jit():
    ref, model = Block(), Block()
    aot = jaxaot.nn.aot_module(model)

    def make_step(m):
        opt = nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param)

        @nnx.jit
        def step(m, opt, x):
            loss, grads = nnx.value_and_grad(block_loss)(m, x)
            opt.update(m, grads)
            return loss

        return lambda: step(m, opt, X)

    step_ref, step = make_step(ref), make_step(aot)
    for _ in range(3):
        chex.assert_trees_all_close(step(), step_ref(), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))


def test_custom_method_and_static_argnames():
    class Scaled(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            self.count = nnx.BatchStat(jnp.zeros(()))

        def score(self, x, *, double: bool):
            self.count[...] += 1.0
            return self.lin(x) * (2.0 if double else 1.0)

    ref, model = Scaled(), Scaled()
    aot = jaxaot.nn.aot_module(model, method="score", static_argnames="double")
    chex.assert_trees_all_close(aot(X, double=True), ref.score(X, double=True), **TOL)
    chex.assert_trees_all_close(aot(X, double=False), ref.score(X, double=False), **TOL)
    assert float(model.count[...]) == 2.0
    assert aot.cache_info().misses == 2
