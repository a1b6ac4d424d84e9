"""AOTLinenModule (flax.linen): training against eager Flax, returned collections, bad variables, the
wrapped module's variables at the top level and as a submodule of a plain Linen module."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import linen as nn

import jaxaot
from flax_models import TOL, X, batch, linen_model, xent

STEPS = 20


def linen_train(name: str, aot: bool):
    module = linen_model(name)
    x0, _ = batch(name, 0)
    variables = module.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x0, train=False)
    apply = jaxaot.nn.aot_module(module, static_argnames="train").apply if aot else module.apply
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
    aot = jaxaot.nn.aot_module(module, static_argnames="train")
    out, updates = aot.apply(variables, x, train=False, mutable=["batch_stats"])
    ref_out, ref_updates = module.apply(variables, x, train=False, mutable=["batch_stats"])
    chex.assert_trees_all_close(out, ref_out, **TOL)
    assert jax.tree.structure(updates) == jax.tree.structure(ref_updates)
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(variables["batch_stats"])):
        assert a is b  # unchanged statistics come back without a round trip


def test_apply_rejects_variables_that_are_not_a_mapping():
    with pytest.raises(jaxaot.errors.InvalidInputError, match="variables mapping"):
        jaxaot.nn.aot_module(linen_model("cnn")).apply([1, 2], X)


def test_init_is_the_wrapped_modules():
    module = linen_model("cnn")
    x, _ = batch("cnn", 0)
    keys = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    aot = jaxaot.nn.aot_module(module, static_argnames="train")
    ref = module.init(keys, x, train=False)
    got = aot.init(keys, x, train=False)
    assert jax.tree.structure(got) == jax.tree.structure(ref)
    chex.assert_trees_all_close(got, ref)
    assert aot.wrapped is module


class _Block(nn.Module):
    """Dense -> BatchNorm -> GELU -> Dense, no bias before the BatchNorm (its gradient is exactly zero)."""

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(16, use_bias=False)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(8)(nn.gelu(x))


class _SetupParent(nn.Module):
    aot: bool

    def setup(self):
        self.pre = nn.Dense(8)
        self.block = jaxaot.nn.aot_module(_Block(), static_argnames="train") if self.aot else _Block()
        self.head = nn.Dense(5)

    def __call__(self, x, train: bool):
        return self.head(self.block(nn.relu(self.pre(x)), train=train))


class _CompactParent(nn.Module):
    aot: bool

    @nn.compact
    def __call__(self, x, train: bool):
        block = _Block()
        block = jaxaot.nn.aot_module(block, static_argnames="train") if self.aot else block
        return nn.Dense(5)(block(nn.relu(nn.Dense(8)(x)), train=train))


@pytest.mark.parametrize("parent", [_SetupParent, _CompactParent])
def test_submodule_keeps_the_variables_and_trains_as_the_plain_parent(parent):
    """A plain Linen module holding an aot_module: init's variables (collections, paths, values) are the
    plain parent's; applying, differentiating and training give the plain parent's results."""
    x0 = jax.random.normal(jax.random.key(3), (8, 6))
    ref_vars = parent(False).init(jax.random.key(0), x0, train=False)
    variables = parent(True).init(jax.random.key(0), x0, train=False)
    assert jax.tree.structure(variables) == jax.tree.structure(ref_vars)
    chex.assert_trees_all_close(variables, ref_vars)

    def train(aot: bool):
        model, tx = parent(aot), optax.adam(1e-2)
        params, stats = ref_vars["params"], ref_vars["batch_stats"]
        opt_state = tx.init(params)

        def loss_fn(p, s, x, y):
            logits, new = model.apply({"params": p, "batch_stats": s}, x, train=True, mutable=["batch_stats"])
            return xent(logits, y), new["batch_stats"]

        losses = []
        for step in range(4):
            kx, ky = jax.random.split(jax.random.fold_in(jax.random.key(9), step))
            x, y = jax.random.normal(kx, (8, 6)), jax.random.randint(ky, (8,), 0, 5)
            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            losses.append(loss)
        out = model.apply({"params": params, "batch_stats": stats}, x0, train=False)
        return jnp.stack(losses), {"params": params, "batch_stats": stats}, out

    ref_losses, ref_final, ref_out = train(False)
    losses, final, out = train(True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    chex.assert_trees_all_close(final, ref_final, **TOL)
    chex.assert_trees_all_close(out, ref_out, **TOL)
    # The parent builds its wrapper on every apply: equal wrappers share one compiled program.
    info = jaxaot.nn.aot_module(_Block(), static_argnames="train").cache_info()
    assert info.misses == 2  # training (traced: forward and backward) and evaluation (inference)


class _AutoEncoder(nn.Module):
    """Encoder and decoder as methods of their own, the encoder with BatchNorm (a collection it updates)."""

    def setup(self):
        self.enc, self.norm, self.dec = nn.Dense(3), nn.BatchNorm(momentum=0.8), nn.Dense(6)

    def encode(self, x, train: bool):
        return self.norm(self.enc(x), use_running_average=not train)

    def decode(self, z):
        return self.dec(z)

    def __call__(self, x, train: bool):
        return self.decode(self.encode(x, train))


class _MethodsParent(nn.Module):
    aot: bool

    def setup(self):
        self.ae = jaxaot.nn.aot_module(_AutoEncoder(), static_argnames="train") if self.aot else _AutoEncoder()

    def __call__(self, x, train: bool):
        return self.ae.decode(jnp.tanh(self.ae.encode(x, train=train)))


def test_a_parent_calls_the_wrapped_module_s_other_methods_compiled():
    """A parent calling ``self.ae.encode(x)`` on the wrapper runs the wrapped module's ``encode``, compiled, as the
    plain parent does: the same variables at init, outputs, updated collections and gradients; an attribute the
    wrapped module lacks is Linen's ``AttributeError``."""
    keys = iter(jax.random.split(jax.random.key(int(jax.random.randint(jax.random.key(5), (), 0, 1 << 20))), 4))
    x = jax.random.normal(next(keys), (8, 6))
    init_key = next(keys)
    ref_vars = _MethodsParent(False).init(init_key, x, train=False)
    chex.assert_trees_all_close(_MethodsParent(True).init(init_key, x, train=False), ref_vars)

    def loss(aot, params, stats):
        out, new = _MethodsParent(aot).apply({"params": params, "batch_stats": stats}, x, train=True,
                                             mutable=["batch_stats"])
        return jnp.sum(out ** 2), new

    want = jax.value_and_grad(loss, argnums=1, has_aux=True)(False, ref_vars["params"], ref_vars["batch_stats"])
    got = jax.value_and_grad(loss, argnums=1, has_aux=True)(True, ref_vars["params"], ref_vars["batch_stats"])
    chex.assert_trees_all_close(got, want, **TOL)
    assert jaxaot.nn.aot_module(_AutoEncoder(), static_argnames="train").cache_info().misses == 2  # per method

    class Asks(nn.Module):
        @nn.compact
        def __call__(self, x):
            return jaxaot.nn.aot_module(_AutoEncoder(), static_argnames="train").missing(x)

    with pytest.raises(AttributeError, match="missing"):
        Asks().init(next(keys), x)


def test_differentiating_a_collection_other_than_params_names_its_leaf_and_the_fix():
    """``jax.grad`` of a Linen apply over the whole variables, ``batch_stats`` included: refused, naming the first
    such leaf and saying to differentiate ``variables['params']``; that gradient is plain Flax's."""
    module = _Block()
    x = jax.random.normal(jax.random.key(int(jax.random.randint(jax.random.key(8), (), 0, 1 << 20))), (4, 6))
    variables = module.init(jax.random.key(1), x, train=False)
    aot = jaxaot.nn.aot_module(module, static_argnames="train")
    with pytest.raises(jaxaot.errors.InvalidInputError, match=r"\['batch_stats'\].*variables\['params'\]"):
        jax.grad(lambda v: aot.apply(v, x, train=False).sum())(variables)
    grad = lambda apply: jax.grad(lambda p: apply({**variables, "params": p}, x, train=False).sum())  # noqa: E731
    chex.assert_trees_all_close(grad(aot.apply)(variables["params"]), grad(module.apply)(variables["params"]), **TOL)


@pytest.mark.parametrize("mutable", [nn.DenyList(["params"]), nn.DenyList(("params",)), ["batch_stats"]])
def test_every_mutable_filter_flax_takes_is_taken(mutable):
    """A ``DenyList`` holding a list is a filter Flax takes (the wrapper keys it as the equal tuple one)."""
    module = _Block()
    x = jax.random.normal(jax.random.key(int(jax.random.randint(jax.random.key(6), (), 0, 1 << 20))), (4, 6))
    variables = module.init(jax.random.key(2), x, train=False)
    got = jaxaot.nn.aot_module(module, static_argnames="train").apply(variables, x, train=True, mutable=mutable)
    chex.assert_trees_all_close(got, module.apply(variables, x, train=True, mutable=mutable), **TOL)


def test_tabulate_is_the_wrapped_module_s_table():
    x = jax.random.normal(jax.random.key(5), (2, 3))
    want = nn.Dense(4).tabulate(jax.random.key(0), x, compute_flops=False)
    assert jaxaot.nn.aot_module(nn.Dense(4)).tabulate(jax.random.key(0), x, compute_flops=False) == want
