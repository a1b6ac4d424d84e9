"""``jaxaot.patch_value_and_grad``: Flax's gradient names, the compiled step, Flax's results."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxaot
from jaxaot._src.autograd.direct import module as module_step
from jaxaot._src.autograd.direct.flax_functions import FLAX_GRAD, FLAX_VALUE_AND_GRAD
from flax_models import TOL, assert_states_equal, batch, nnx_model, xent


def _loss(m, x, y):
    return xent(m(x), y)


def _train(aot: bool, patched: bool, steps: int = 3):
    model = nnx_model("cnn")
    m = jaxaot.nn.aot_module(model) if aot else model
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
    losses = []
    ctx = jaxaot.patch_value_and_grad() if patched else _nothing()
    with ctx:
        for step in range(steps):
            loss, grads = nnx.value_and_grad(_loss)(m, *batch("cnn", step))
            opt.update(m, grads)
            losses.append(loss)
    return jnp.stack(losses), nnx.state(model)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.fixture
def spy(monkeypatch):
    """Counts the compiled-step calls an ``aot_module`` receives."""
    calls = []
    original = module_step.module_value_and_grad

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module_step, "module_value_and_grad", counting)
    return calls


def test_training_matches_flax_and_takes_the_compiled_step(spy):
    ref_losses, ref_state = _train(aot=False, patched=False)
    losses, state = _train(aot=True, patched=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    assert_states_equal(state, ref_state, **TOL)
    assert len(spy) == 3
    assert nnx.value_and_grad is FLAX_VALUE_AND_GRAD and nnx.grad is FLAX_GRAD  # restored


def test_grad_has_aux_and_decorator_form(spy):
    x, y = batch("cnn", 0)
    ref_model, model = nnx_model("cnn"), jaxaot.nn.aot_module(nnx_model("cnn"))

    def loss_aux(m, x, y):
        logits = m(x)
        return xent(logits, y), jnp.argmax(logits, -1)

    ref_g, ref_aux = nnx.grad(loss_aux, has_aux=True)(ref_model, x, y)
    with jaxaot.patch_value_and_grad():
        g, aux = nnx.grad(loss_aux, has_aux=True)(model, x, y)
        g2 = nnx.grad(argnums=0)(_loss)(jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
    chex.assert_trees_all_equal(aux, ref_aux)
    assert_states_equal(g, ref_g, **TOL)
    assert_states_equal(g2, ref_g, **TOL)
    assert len(spy) == 2


def test_falls_back_to_flax(spy):
    """Plain modules, DiffState argnums and options other than Flax's defaults take Flax's function."""
    x, y = batch("cnn", 1)
    ref = FLAX_VALUE_AND_GRAD(_loss)(nnx_model("cnn"), x, y)
    with jaxaot.patch_value_and_grad():
        plain = nnx.value_and_grad(_loss)(nnx_model("cnn"), x, y)
        diff_state = nnx.value_and_grad(_loss, argnums=nnx.DiffState(0, nnx.Param))(
            jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
        allow_int = nnx.value_and_grad(_loss, allow_int=True)(jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
    chex.assert_trees_all_close(plain[0], ref[0], **TOL)
    assert_states_equal(plain[1], ref[1], **TOL)
    for loss, grads in (diff_state, allow_int):
        chex.assert_trees_all_close(loss, ref[0], **TOL)
        assert_states_equal(grads, ref[1], **TOL)
    assert not spy


def test_under_nnx_jit_and_restored_on_error():
    x, y = batch("cnn", 2)
    ref_loss, ref_grads = FLAX_VALUE_AND_GRAD(_loss)(nnx_model("cnn"), x, y)
    with jaxaot.patch_value_and_grad():
        loss, grads = nnx.jit(lambda m, x, y: nnx.value_and_grad(_loss)(m, x, y))(
            jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
    chex.assert_trees_all_close(loss, ref_loss, **TOL)
    assert_states_equal(grads, ref_grads, **TOL)
    with pytest.raises(ZeroDivisionError):
        with jaxaot.patch_value_and_grad():
            assert nnx.value_and_grad is not FLAX_VALUE_AND_GRAD
            1 / 0
    assert nnx.value_and_grad is FLAX_VALUE_AND_GRAD and nnx.grad is FLAX_GRAD
    assert jax.tree_util.tree_leaves(grads)  # something was computed


def test_one_tuple_argnums_give_a_tuple_of_gradients(spy):
    """``argnums=(0,)``: the gradients come in a 1-tuple, as Flax returns them, on both entries."""
    x, y = batch("cnn", 3)
    ref_loss, ref_grads = FLAX_VALUE_AND_GRAD(_loss, argnums=(0,))(nnx_model("cnn"), x, y)
    assert isinstance(ref_grads, tuple) and len(ref_grads) == 1
    loss, grads = jaxaot.value_and_grad(_loss, argnums=(0,))(jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
    with jaxaot.patch_value_and_grad():
        g_only = nnx.grad(_loss, argnums=(0,))(jaxaot.nn.aot_module(nnx_model("cnn")), x, y)
    for got in (grads, g_only):
        assert isinstance(got, tuple) and len(got) == 1
        assert_states_equal(got[0], ref_grads[0], **TOL)
    chex.assert_trees_all_close(loss, ref_loss, **TOL)
    assert len(spy) == 2
