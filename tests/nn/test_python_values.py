"""Python values beside a module's arrays, as Flax treats them.

A loss's ``aux`` leaves that are not traced (Python numbers, bools, strings, None, NumPy scalars and arrays) come
back from ``jaxaot.value_and_grad`` as the objects ``nnx.value_and_grad`` returns, with their values as traced;
a module's plain dict and list attributes (nested ones too) work, and changed in place they are read anew, as the
eager module reads them; a Linen module with an unhashable field is refused with a typed error naming it. Each
against plain ``flax.nnx`` on fresh random inputs.
"""

from __future__ import annotations

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import jaxaot
from jaxaot.errors import StaticArgumentError

TOL = dict(rtol=2e-4, atol=2e-4)


def _x(shape=(3, 4)):
    return jax.random.normal(jax.random.key(int(np.random.default_rng().integers(1 << 30))), shape)


def _linear():
    return nnx.Linear(4, 2, rngs=nnx.Rngs(0))


CONSTANT = jnp.arange(3.0)


def _aux_loss(m, x):
    y = m(x)
    return jnp.sum(y ** 2), {
        "step": 3, "lr": 0.5, "ok": True, "phase": "train", "none": None, "complex": 1 + 2j, "bytes": b"tag",
        "rows": x.shape[0], "np_scalar": np.float32(1.5), "np_int": np.int64(7), "np_array": np.arange(3.0),
        "made": jnp.ones(2), "constant": CONSTANT, "computed": y, "nested": [("a", 1), {"b": 2.5}], "kind": float,
    }


def _same_leaves(got, want):
    """The same tree, the same type at every leaf, and equal values (arrays close)."""
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for a, b in zip(got_leaves, want_leaves):
        assert type(a) is type(b), (a, b)
        if isinstance(b, (jax.Array, np.ndarray, np.generic)):
            chex.assert_trees_all_close(np.asarray(a), np.asarray(b), **TOL)
        else:
            assert a == b


@pytest.mark.parametrize("how", ["fused", "split", "patched", "grad"])
def test_aux_python_and_numpy_leaves_come_back_as_nnx_value_and_grad_returns_them(how):
    plain, aot = _linear(), jaxaot.nn.aot_module(_linear())
    for _ in range(2):  # the traced call, then the compiled one
        x = _x()
        (want_value, want_aux), want_grads = nnx.value_and_grad(_aux_loss, has_aux=True)(plain, x)
        if how == "grad":
            got_grads, got_aux = jaxaot.grad(_aux_loss, has_aux=True)(aot, x)
            got_value = want_value
        elif how == "patched":
            with jaxaot.patch_value_and_grad():
                (got_value, got_aux), got_grads = nnx.value_and_grad(_aux_loss, has_aux=True)(aot, x)
        else:
            vg = jaxaot.value_and_grad(_aux_loss, has_aux=True, fused=how == "fused")
            (got_value, got_aux), got_grads = vg(aot, x)
        chex.assert_trees_all_close((got_value, got_grads), (want_value, want_grads), **TOL)
        _same_leaves(got_aux, want_aux)


def test_a_string_alone_in_aux_is_returned():
    plain, aot = _linear(), jaxaot.nn.aot_module(_linear())
    loss = lambda m, x: (jnp.mean(m(x)), {"phase": "train"})  # noqa: E731
    x = _x()
    got, want = jaxaot.value_and_grad(loss, has_aux=True)(aot, x), nnx.value_and_grad(loss, has_aux=True)(plain, x)
    assert got[0][1] == want[0][1] == {"phase": "train"}
    chex.assert_trees_all_close((got[0][0], got[1]), (want[0][0], want[1]), **TOL)


def test_a_numpy_array_in_aux_is_a_fresh_copy_at_each_call():
    aot = jaxaot.nn.aot_module(_linear())
    loss = lambda m, x: (jnp.sum(m(x)), np.zeros(2))  # noqa: E731
    first = jaxaot.value_and_grad(loss, has_aux=True)(aot, _x())[0][1]
    first[0] = 5.0
    second = jaxaot.value_and_grad(loss, has_aux=True)(aot, _x())[0][1]
    assert type(second) is np.ndarray and second is not first
    np.testing.assert_array_equal(second, np.zeros(2))


def test_a_python_value_in_aux_is_the_one_returned_when_traced_as_under_nnx_jit():
    counter = itertools.count(1)

    def loss(m, x):
        return jnp.sum(m(x)), {"count": next(counter)}

    aot = jaxaot.nn.aot_module(_linear())
    got = [jaxaot.value_and_grad(loss, has_aux=True)(aot, _x())[0][1]["count"] for _ in range(3)]
    assert got == [1, 1, 1] and all(type(c) is int for c in got)
    counter = itertools.count(1)
    jitted = nnx.jit(loss)
    assert [int(jitted(_linear(), _x())[1]["count"]) for _ in range(3)] == [1, 1, 1]


def test_a_python_value_in_aux_read_from_the_closure_is_read_at_each_call():
    seen = {"calls": 0}

    def loss(m, x):
        return jnp.sum(m(x)), {"calls": seen["calls"]}

    plain, aot = _linear(), jaxaot.nn.aot_module(_linear())
    for calls in (1, 2, 2):
        seen["calls"] = calls
        x = _x()
        got = jaxaot.value_and_grad(loss, has_aux=True)(aot, x)
        _same_leaves(got, nnx.value_and_grad(loss, has_aux=True)(plain, x))


def test_a_container_past_the_read_limits_is_read_by_identity_as_under_nnx_jit():
    """``docs/concepts/modules.md``: a list longer than 64 items is named by identity. Changed in place it keeps the
    traced values, as ``nnx.jit`` keeps them; a new list is read anew, and one within the limits at each call."""
    weights = {"long": [1.0] * 100, "short": [1.0] * 3}

    def loss(m, x):
        return jnp.sum(m(x)) * weights["long"][90] * weights["short"][2]

    aot, x = jaxaot.nn.aot_module(_linear()), _x()
    vg = lambda: jaxaot.value_and_grad(loss)(aot, x)[0]  # noqa: E731
    jitted = nnx.jit(lambda m, x: loss(m, x))
    base, base_jit = float(vg()), float(jitted(_linear(), x))
    weights["long"][90] = 5.0  # in place, past the limits: both keep the traced 1.0
    np.testing.assert_allclose([float(vg()), float(jitted(_linear(), x))], [base, base_jit], rtol=1e-6)
    weights["long"] = [1.0] * 90 + [5.0] * 10  # a new list: read anew
    np.testing.assert_allclose(float(vg()), 5 * base, rtol=1e-5)
    weights["short"][2] = 2.0  # within the limits: read at each call
    np.testing.assert_allclose(float(vg()), 10 * base, rtol=1e-5)


class Configured(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.cfg = {"scale": 2.0, "shift": {"by": [0.5, 1.0]}}
        self.acts = ["tanh", "relu"]

    def __call__(self, x):
        y = self.lin(x) * self.cfg["scale"] + self.cfg["shift"]["by"][-1]
        for name in self.acts:
            y = getattr(jax.nn, name)(y)
        return y


def _configs(m):
    yield "first"
    m.cfg["scale"] = 3.0
    yield "an item set"
    m.cfg["shift"]["by"].append(-2.0)
    yield "a nested list appended to"
    m.acts.pop()
    yield "a list item removed"
    m.cfg["extra"] = {"unused": [1]}
    yield "a key added"
    m.acts = ["tanh", "relu"]
    m.cfg = {"scale": 2.0, "shift": {"by": [0.5, 1.0]}}
    yield "back to the first, new objects"


def test_plain_dict_list_and_nested_attributes_work_and_are_read_at_each_call():
    plain, inner = Configured(), Configured()
    aot = jaxaot.nn.aot_module(inner)
    loss = lambda m, x: jnp.sum(m(x) ** 2)  # noqa: E731
    compiled = []
    for plain_step, aot_step in zip(_configs(plain), _configs(inner)):
        assert plain_step == aot_step
        compiled.append(aot.cache_info().misses)
        x = _x()
        chex.assert_trees_all_close(aot(x), plain(x), **TOL)
        chex.assert_trees_all_close(jaxaot.value_and_grad(loss)(aot, x), nnx.value_and_grad(loss)(plain, x), **TOL)
        chex.assert_trees_all_close(nnx.value_and_grad(loss)(aot, x), nnx.value_and_grad(loss)(plain, x), **TOL)
    assert aot.cache_info().misses == compiled[-1] > compiled[-2]  # the last configuration is the first one again


def test_a_model_holding_a_configured_aot_module_splits_merges_and_jits():
    class Net(nnx.Module):
        def __init__(self, body):
            self.body = body
            self.sizes = [4, 4]

        def __call__(self, x):
            return jnp.sum(self.body(x)) * len(self.sizes)

    plain, model = Net(Configured()), Net(jaxaot.nn.aot_module(Configured()))
    x = _x()
    chex.assert_trees_all_close(model(x), plain(x), **TOL)
    chex.assert_trees_all_close(nnx.merge(*nnx.split(model))(x), plain(x), **TOL)
    chex.assert_trees_all_close(nnx.jit(lambda m, x: m(x))(model, x), plain(x), **TOL)
    chex.assert_trees_all_close(nnx.value_and_grad(lambda m, x: m(x))(model, x),
                                nnx.value_and_grad(lambda m, x: m(x))(plain, x), **TOL)


class DataConfigured(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(4, rngs=nnx.Rngs(0))
        self.cfg = nnx.data({"scale": 2.0, "table": jnp.ones(4)})  # an array outside a Variable, beside a number
        self.offset = nnx.data(jnp.zeros(4))

    def __call__(self, x):
        y = self.lin(x) * self.cfg["scale"] * self.cfg["table"] + self.offset
        return self.bn(y) + y


def test_arrays_held_outside_variables_with_python_values_beside_them_are_read_at_each_call():
    plain, inner = DataConfigured(), DataConfigured()
    aot = jaxaot.nn.aot_module(inner)
    loss = lambda m, x: jnp.sum(m(x) ** 2)  # noqa: E731
    for step in range(3):
        x = _x((16, 4))
        chex.assert_trees_all_close(aot(x), plain(x), **TOL)
        chex.assert_trees_all_close(nnx.state(inner), nnx.state(plain), **TOL)
        chex.assert_trees_all_close(jaxaot.value_and_grad(loss)(aot, x), nnx.value_and_grad(loss)(plain, x),
                                    **TOL)
        table, offset = 1.0 + 0.1 * _x((4,)), _x((4,))
        for m in (plain, inner):
            m.cfg["scale"], m.cfg["table"], m.offset = 3.0 + step, table, offset


class LinenConfigured(nn.Module):
    cfg: dict

    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(x) * self.cfg["scale"]


class LinenParent(nn.Module):
    inner: nn.Module

    @nn.compact
    def __call__(self, x):
        return self.inner(x)


@pytest.mark.parametrize("module, named", [(LinenConfigured({"scale": 2.0}), "LinenConfigured.cfg"),
                                           (LinenParent(LinenConfigured({"scale": 2.0})),
                                            "LinenParent.inner -> LinenConfigured.cfg")])
def test_a_linen_module_with_an_unhashable_field_is_refused_naming_it(module, named):
    with pytest.raises(StaticArgumentError, match=named) as caught:
        jaxaot.nn.aot_module(module)
    assert "FrozenDict" in str(caught.value)


def test_a_linen_module_with_a_frozen_dict_field_runs_as_linen():
    from flax.core import FrozenDict

    module = LinenConfigured(FrozenDict({"scale": 2.0}))
    x = _x()
    variables = module.init(jax.random.key(0), x)
    chex.assert_trees_all_close(jaxaot.nn.aot_module(module).apply(variables, x), module.apply(variables, x), **TOL)


def test_a_python_number_passed_to_the_loss_and_returned_in_aux_is_a_scalar_array_of_its_value():
    loss = lambda m, x, step, phase: (jnp.sum(m(x)), {"step": step, "phase": phase})  # noqa: E731
    aot = jaxaot.nn.aot_module(_linear())
    for step, phase in ((1, "warmup"), (2, "train")):
        aux = jaxaot.value_and_grad(loss, has_aux=True)(aot, _x(), step, phase)[0][1]
        assert isinstance(aux["step"], jax.Array) and int(aux["step"]) == step and aux["phase"] == phase


def _reasons(aot):
    return [e.reason for e in aot.cache_info().entries]


def test_a_compile_for_a_changed_attribute_names_it_by_path_with_its_values():
    m = Configured()
    aot = jaxaot.nn.aot_module(m)
    aot(_x())
    m.cfg["scale"] = 3.0
    aot(_x())
    m.acts.pop()
    m.lin.in_features = 4  # the same value set again: no change
    aot(_x())
    reasons = _reasons(aot)
    assert reasons[0] == "first call"
    assert reasons[1] == ("module attribute `cfg`: {'scale': 2.0, 'shift': {'by': [0.5, 1.0]}} → "
                          "{'scale': 3.0, 'shift': {'by': [0.5, 1.0]}}")
    assert reasons[2] == "module attribute `acts`: ['tanh', 'relu'] → ['tanh']"


class _Nested(nnx.Module):
    def __init__(self):
        self.blocks = nnx.List([Configured(), Configured()])

    def __call__(self, x, train=True):
        for b in self.blocks:
            x = b(x)
        return x if train else -x


def test_a_nested_attribute_and_a_static_argument_are_named():
    m = _Nested()
    aot = jaxaot.nn.aot_module(m, static_argnames=("train",))
    x = _x()
    chex.assert_trees_all_close(aot(x), m(x), **TOL)
    m.blocks[1].cfg["scale"] = 0.5
    chex.assert_trees_all_close(aot(x), m(x), **TOL)
    chex.assert_trees_all_close(aot(x, train=False), m(x, train=False), **TOL)
    reasons = _reasons(aot)
    assert reasons[1].startswith("module attribute `blocks[1].cfg`: {'scale': 2.0,")
    assert reasons[2] == "train: not passed → False"


def test_a_linen_mutable_change_is_named():
    bn = nn.BatchNorm(use_running_average=False)
    x = _x()
    variables = bn.init(jax.random.key(0), x)
    aot = jaxaot.nn.aot_module(bn)
    want = bn.apply(variables, x, mutable=["batch_stats"])
    chex.assert_trees_all_close(aot.apply(variables, x, mutable=["batch_stats"]), want, **TOL)
    with pytest.raises(Exception):  # linen refuses a batch_stats update without mutable, as Flax does
        bn.apply(variables, x)
    reasons = _reasons(aot)
    assert reasons == ["first call"]
    aot.apply(variables, x, mutable=["batch_stats", "intermediates"])
    assert _reasons(aot)[1] == "mutable: ('batch_stats',) → ('batch_stats', 'intermediates')"
