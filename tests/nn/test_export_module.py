"""aot_export_module: forward and joint signatures, values against eager Flax, loss checks."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxaot
from jaxaot._src import compat as C
from flax_models import X, batch, linen_model


class LossNet(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(params=0, dropout=1)
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, y):
        h = self.drop(self.bn(self.lin(x)))
        return ((h - y) ** 2).mean(), jax.lax.stop_gradient(h)


Y = jnp.ones((4, 4))


def test_export_forward_signature():
    jaxpr, sig = jaxaot.nn.aot_export_module(LossNet(), (X, Y), trace_joint=False)
    assert sig.parameters == ("bn.bias", "bn.scale", "lin.bias", "lin.kernel")
    assert sig.buffers == ("bn.mean", "bn.var", "drop.rngs.count", "drop.rngs.key")
    assert sig.inputs_to_parameters == {"in0": "bn.bias", "in1": "bn.scale", "in2": "lin.bias", "in3": "lin.kernel"}
    assert sig.inputs_to_buffers == {"in4": "bn.mean", "in5": "bn.var", "in6": "drop.rngs.count",
                                     "in7": "drop.rngs.key"}
    assert sig.user_inputs == ("in8", "in9")
    assert sig.buffers_to_mutate == {"out0": "bn.mean", "out1": "bn.var", "out2": "drop.rngs.count"}
    assert sig.user_outputs == ("out3", "out4")
    assert sig.backward_signature is None
    assert len(C.jaxpr_of(jaxpr).invars) == len(sig.input_names) == 10
    assert len(C.jaxpr_of(jaxpr).outvars) == len(sig.output_names) == 5


def test_export_joint_signature_and_values():
    model = LossNet()
    jaxpr, sig = jaxaot.nn.aot_export_module(model, (X, Y), trace_joint=True, output_loss_index=0)
    bw = sig.backward_signature
    assert bw.loss_output == "out3"
    assert bw.gradients_to_parameters == {"out5": "bn.bias", "out6": "bn.scale", "out7": "lin.bias",
                                          "out8": "lin.kernel"}
    assert bw.gradients_to_user_inputs == {}
    # The exported program computes what eager Flax computes.
    _, params, rest = nnx.split(model, nnx.Param, ...)
    leaves = jax.tree.leaves(params) + jax.tree.leaves(rest) + [X, Y]
    outs = C.eval_closed(jaxpr, *leaves)
    (loss, _), grads = nnx.value_and_grad(lambda m: m(X, Y), has_aux=True)(model)
    # Op-by-op evaluation against eager Flax: GPU reductions are not bitwise reproducible.
    tol = dict(rtol=1e-4, atol=1e-5)
    chex.assert_trees_all_close(outs[3], loss, **tol)
    chex.assert_trees_all_close(outs[5:], jax.tree.leaves(grads), **tol)
    chex.assert_trees_all_close(outs[:2], [model.bn.mean.get_value(), model.bn.var.get_value()], **tol)


def test_export_gradients_to_user_inputs():
    _, sig = jaxaot.nn.aot_export_module(LossNet(), (X, Y), trace_joint=True, output_loss_index=0,
                                      grad_user_inputs=True)
    assert sig.backward_signature.gradients_to_user_inputs == {"out9": "in8", "out10": "in9"}


def test_export_linen_signature():
    module = linen_model("cnn")
    x, _ = batch("cnn", 0)
    variables = module.init(jax.random.key(0), x, train=False)
    _, sig = jaxaot.nn.aot_export_module(module, (x,), kwargs={"train": True}, variables=variables,
                                      rngs={"dropout": jax.random.key(2)}, trace_joint=False)
    assert sig.buffers == ("batch_stats.BatchNorm_0.mean", "batch_stats.BatchNorm_0.var")
    assert set(sig.buffers_to_mutate.values()) == set(sig.buffers)
    assert "Conv_0.kernel" in sig.parameters
    assert len(sig.user_inputs) == 2  # the dropout key and x


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), "You must specify the which (index) output is the loss with output_loss_index"),
        (dict(output_loss_index=1), "the output at index 0 requires gradients"),
        (dict(output_loss_index=2), "out of range"),
    ],
)
def test_export_loss_errors(kwargs, message):
    with pytest.raises(jaxaot.errors.LossOutputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jaxaot.nn.aot_export_module(LossNet(), (X, Y), trace_joint=True, **kwargs)


def test_export_non_scalar_loss_and_loss_without_parameters():
    class Bad(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.lin(x), (x**2).sum()

    with pytest.raises(jaxaot.errors.LossOutputError, match=r"to be a scalar, but it has shape \(4, 2\)"):
        jaxaot.nn.aot_export_module(Bad(), (X,), trace_joint=True, output_loss_index=0)
    with pytest.raises(jaxaot.errors.LossOutputError, match="the output at index 0 requires gradients"):
        jaxaot.nn.aot_export_module(Bad(), (X,), trace_joint=True, output_loss_index=1)

    class Detached(Bad):
        def __call__(self, x):
            return jax.lax.stop_gradient(self.lin(x)), (x**2).sum()

    with pytest.raises(jaxaot.errors.LossOutputError, match="was marked as the loss, but it does not require gradients"):
        jaxaot.nn.aot_export_module(Detached(), (X,), trace_joint=True, output_loss_index=1)


def test_export_linen_needs_variables():
    with pytest.raises(jaxaot.errors.InvalidInputError, match="needs its variables"):
        jaxaot.nn.aot_export_module(linen_model("cnn"), (X,), trace_joint=False)
