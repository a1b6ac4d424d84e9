"""``aot_module``'s checks on the module and its options, and Flax loading only on first use."""

from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxaot
from flax_models import X, Block
from zoo import child_env


def test_bad_module_and_options_raise_documented_errors():
    with pytest.raises(jaxaot.errors.InvalidInputError, match="expects a flax.nnx.Module or a flax.linen.Module"):
        jaxaot.nn.aot_module(lambda x: x)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="has no method 'nope'"):
        jaxaot.nn.aot_module(Block(), method="nope")
    with pytest.raises(jaxaot.errors.InvalidInputError, match="static_argnums must be non-negative"):
        jaxaot.nn.aot_module(Block(), static_argnums=-1)


class _Scaled(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

    def __call__(self, x, scale, *, train=True):
        return self.lin(x) * (scale if train else 1.0)


@pytest.mark.parametrize("nums", [1, np.int64(1), [1], (1,), range(1, 2), {1}, (1, 1)])
def test_static_argnums_takes_what_jax_jit_takes(nums):
    """An int (numpy integers too) or any iterable of them, as ``jax.jit``; duplicates are one position."""
    model = _Scaled()
    aot = jaxaot.nn.aot_module(model, static_argnums=nums)
    assert jnp.allclose(aot(X, 2.0), model(X, 2.0))
    assert aot.cache_info().entries[0].signature.endswith("arg[1]=2.0>")


@pytest.mark.parametrize("names", ["train", ["train"], ("train",), iter(["train"])])
def test_static_argnames_takes_what_jax_jit_takes(names):
    model = _Scaled()
    aot = jaxaot.nn.aot_module(model, static_argnames=names)
    assert jnp.allclose(aot(X, 2.0, train=False), model(X, 2.0, train=False))


@pytest.mark.parametrize("option, bad, words", [
    ("static_argnums", 1.5, "an int or a sequence of ints"), ("static_argnums", True, "an int or a sequence"),
    ("static_argnums", "1", "got str '1'"), ("static_argnums", [0, None], "got list [0, None]"),
    ("static_argnums", (1, -2), "non-negative positions, got (1, -2)"),
    ("static_argnames", 3, "a str or a sequence of str"), ("static_argnames", ["train", 1], "got list ['train', 1]"),
    ("static_argnames", None, "got NoneType None"),
])
def test_bad_static_arguments_name_the_option_the_value_and_what_to_pass(option, bad, words):
    with pytest.raises(jaxaot.errors.InvalidInputError) as raised:
        jaxaot.nn.aot_module(_Scaled(), **{option: bad})
    text = str(raised.value)
    assert text.startswith(option) and words in text and ("Pass" in text or "name them" in text), text


def test_flax_loads_only_when_a_module_api_is_used():
    code = ("import sys, jaxaot; assert 'flax' not in sys.modules, 'import jaxaot imported flax'; "
            "jaxaot.nn.aot_module; assert 'flax' in sys.modules; from jaxaot import GraphSignature")
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=300)


def _signature_names(entry):
    return [part.split(":")[0] for part in entry.signature.split(", ") if ":" in part]


def test_entries_name_inputs_by_module_path_and_parameter_name():
    """The module's parameters and state by their paths in it, the call's arguments by the method's names, a
    loss's by the loss function's; a reason names the argument that changed."""
    aot = jaxaot.nn.aot_module(Block())
    aot(X)
    aot(jnp.concatenate([X, X]))
    call = aot.cache_info().entries
    assert _signature_names(call[0]) == ["params['bn']['bias']", "params['bn']['scale']", "params['lin']['bias']",
                                         "params['lin']['kernel']", "state['bn']['mean']", "state['bn']['var']",
                                         "state['calls']", "state['drop']['rngs']['count']",
                                         "state['drop']['rngs']['key']", "x"]
    assert call[1].reason == "x: shape (4, 3) → (8, 3)"

    def loss(targets, model, inputs, det):
        return jnp.mean((model(inputs) - targets) ** 2) * (2.0 if det else 1.0)

    jaxaot.value_and_grad(loss, argnums=1)(jnp.ones((4, 4)), aot, X, False)
    jaxaot.value_and_grad(loss, argnums=1)(jnp.ones((4, 4)), aot, X, True)
    entries = [e for e in aot.cache_info().entries if "loss" in e.signature]
    assert _signature_names(entries[0])[-2:] == ["targets", "inputs"]
    assert entries[1].reason.startswith("loss's argument det: False → True")


class _Me(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

    def __call__(me, x, scale=1.0, train=False):  # noqa: N805 - the instance under another name
        return me.lin(x) * scale + (1.0 if train else 0.0)


def test_a_reason_names_the_argument_whatever_the_method_calls_its_instance():
    aot = jaxaot.nn.aot_module(_Me())
    aot(X, 0.5)
    aot(X, 1.0, True)
    assert aot.cache_info().entries[1].reason == "train (arg[2]): not static → True"
