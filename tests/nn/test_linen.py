"""AOTLinenModule (flax.linen): training against eager Flax, returned collections, bad variables."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

import jaxaot
from flax_models import TOL, X, batch, linen_model, xent

STEPS = 20


def linen_train(name: str, aot: bool):
    module = linen_model(name)
    x0, _ = batch(name, 0)
    variables = module.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x0, train=False)
    apply = jaxaot.aot_module(module, static_argnames="train").apply if aot else module.apply
    params, others = variables["params"], {k: v for k, v in variables.items() if k != "params"}
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    def loss_fn(params, others, x, y, key):
        logits, updates = apply({"params": params, **others}, x, train=True, mutable=list(others),
                                rngs={"dropout": key})
        return xent(logits, y), updates

    losses = []
    for step in range(STEPS):
        x, y = batch(name, step)
        (loss, others), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, others, x, y, jax.random.fold_in(jax.random.key(7), step))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        losses.append(loss)
    return jnp.stack(losses), {"params": params, **others}


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_linen_training_matches_eager(name):
    ref_losses, ref_vars = linen_train(name, aot=False)
    losses, variables = linen_train(name, aot=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    chex.assert_trees_all_close(variables, ref_vars, **TOL)


def test_eval_mode_linen_returns_inputs():
    module = linen_model("cnn")
    x, _ = batch("cnn", 0)
    variables = module.init(jax.random.key(0), x, train=False)
    aot = jaxaot.aot_module(module, static_argnames="train")
    out, updates = aot.apply(variables, x, train=False, mutable=["batch_stats"])
    ref_out, ref_updates = module.apply(variables, x, train=False, mutable=["batch_stats"])
    chex.assert_trees_all_close(out, ref_out, **TOL)
    assert jax.tree.structure(updates) == jax.tree.structure(ref_updates)
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(variables["batch_stats"])):
        assert a is b  # unchanged statistics come back without a round trip


def test_apply_rejects_variables_that_are_not_a_mapping():
    with pytest.raises(jaxaot.InvalidInputError, match="variables mapping"):
        jaxaot.aot_module(linen_model("cnn")).apply([1, 2], X)
