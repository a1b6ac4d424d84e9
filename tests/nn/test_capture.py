"""Flax's intermediates through an aot_module: ``nnx.capture``, and a Linen parent's ``capture_intermediates``,
give what they give with the plain module (values, state after, gradients, tree types)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

import jaxaot
from zoo import normal_at, trees_close

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _x(seed: int, shape=(4, 2)):
    return normal_at(seed, shape)


def _pure(state):
    return nnx.to_pure_dict(state)


class Foo(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(3, rngs=nnx.Rngs(1))
        self.head = nnx.Linear(3, 1, rngs=nnx.Rngs(2))

    def features(self, x):
        h = self.lin(x)
        self.sow(nnx.Intermediate, "feat", h)
        return h

    def __call__(self, x):
        return jnp.tanh(self.head(self.bn(self.features(x)))).sum()


class Parent(nnx.Module):
    def __init__(self, wrap: bool):
        self.foo = jaxaot.nn.aot_module(Foo()) if wrap else Foo()
        self.pre = nnx.Linear(2, 2, rngs=nnx.Rngs(3))

    def __call__(self, x):
        return self.foo(self.pre(x))


def _foo(wrap: bool):
    return jaxaot.nn.aot_module(Foo()) if wrap else Foo()


@pytest.mark.parametrize("make", [_foo, Parent], ids=["aot_module", "plain_parent"])
@pytest.mark.parametrize("options", [{}, {"method_outputs": nnx.Intermediate}], ids=["sow", "method_outputs"])
def test_capture_collects_what_it_collects_from_the_module(make, options):
    plain, wrapped = make(False), make(True)
    for seed in (11, 12):  # twice: the sown tuples are fresh each capture, the batch statistics move
        x = _x(seed)
        y_e, inter_e = nnx.capture(plain, nnx.Intermediate, **options)(x)
        y_a, inter_a = nnx.capture(wrapped, nnx.Intermediate, **options)(x)
        assert type(inter_a) is type(inter_e)
        assert trees_close(y_e, y_a)
        assert trees_close(_pure(inter_e), _pure(inter_a))
        assert trees_close(_pure(nnx.state(plain)), _pure(nnx.state(wrapped)))
    assert "feat" in (inter_a["foo"] if make is Parent else inter_a)
    x = _x(13)
    assert trees_close(plain(x), wrapped(x))  # after the capture: the compiled call, the same state


def test_the_aot_modules_own_methods_are_not_sown():
    model = jaxaot.nn.aot_module(Foo())
    _, inter = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(_x(14))
    assert set(inter.keys()) == {"__call__", "features", "feat", "lin", "bn", "head"}
    assert model.lower(_x(14)).meta.inputs and model.cache_info().misses == 1  # unswapped, after the capture


def _aux_loss(model, x):
    y, inter = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(x)
    return y + sum(jnp.sum(v) for v in jax.tree.leaves(inter))


@pytest.mark.parametrize("make", [_foo, Parent], ids=["aot_module", "plain_parent"])
@pytest.mark.parametrize("grad", ["jaxaot", "nnx"])
def test_a_loss_on_captured_intermediates_has_flaxs_value_and_gradients(make, grad):
    plain, wrapped = make(False), make(True)
    vg = jaxaot.value_and_grad if grad == "jaxaot" else nnx.value_and_grad
    for seed in (21, 22):
        x = _x(seed)
        loss_e, grads_e = nnx.value_and_grad(_aux_loss)(plain, x)
        loss_a, grads_a = vg(_aux_loss)(wrapped, x)
        assert trees_close(loss_e, loss_a)
        assert type(grads_a) is type(grads_e)
        assert trees_close(_pure(grads_e), _pure(grads_a))
        assert trees_close(_pure(nnx.state(plain)), _pure(nnx.state(wrapped)))


class Perturbed(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return jnp.sum(self.perturb("h", self.lin(x)) ** 2)


def test_perturbation_gradients_match_flax():
    def grads_of(model, x):
        _, perturbations = nnx.capture(model, nnx.Perturbation)(x)

        def loss(model, perturbations, x):
            return nnx.capture(model, nnx.Intermediate, init=perturbations)(x)

        return nnx.grad(loss, argnums=(0, 1), has_aux=True)(model, perturbations, x)

    x = _x(31)
    (g_e, p_e), sown_e = grads_of(Perturbed(), x)
    (g_a, p_a), sown_a = grads_of(jaxaot.nn.aot_module(Perturbed()), x)
    assert trees_close(_pure(g_e), _pure(g_a)) and trees_close(_pure(p_e), _pure(p_a)) and trees_close(_pure(sown_e),
                                                                                         _pure(sown_a))


# --------------------------------------------------------------------------- Linen
class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4)(x)
        self.sow("intermediates", "h", h)
        return nn.Dense(2)(nn.BatchNorm(use_running_average=False)(h))


class SetupInner(nn.Module):
    def setup(self):
        self.dense = nn.Dense(3)

    def __call__(self, x):
        return self.dense(x)


class LinenParent(nn.Module):
    wrap: bool
    inner: type = Inner

    @nn.compact
    def __call__(self, x):
        inner = jaxaot.nn.aot_module(self.inner()) if self.wrap else self.inner()
        return inner(x) + inner(2 * x)  # called twice: the sown tuples grow


_FILTERS = {
    "true": True,
    "inner_only": lambda m, n: isinstance(m, (Inner, SetupInner)),
    "dense_only": lambda m, n: isinstance(m, nn.Dense),
    "every_method": lambda m, n: True,
    "false": False,
}


@pytest.mark.parametrize("inner", [Inner, SetupInner])
@pytest.mark.parametrize("capture", list(_FILTERS))
def test_linen_submodule_follows_the_parents_capture_intermediates(inner, capture):
    x = _x(41, (3, 5))
    results = []
    for wrap in (False, True):
        variables = LinenParent(wrap, inner).init(jax.random.key(0), x)
        results.append(LinenParent(wrap, inner).apply(variables, x, capture_intermediates=_FILTERS[capture],
                                                       mutable=["intermediates", "batch_stats"]))
    (out_e, state_e), (out_a, state_a) = results
    # eager and compiled float32 round apart: a GPU's matrix products by 2e-5 at this batch norm's outputs
    assert trees_close(out_e, out_a, atol=1e-4)
    assert jax.tree.structure(state_e) == jax.tree.structure(state_a)
    assert trees_close(state_e, state_a, atol=1e-4)
