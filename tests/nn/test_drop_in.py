"""``aot_module``, its losses and ``jaxaot.nn.Optimizer`` behave as eager ``flax.nnx`` where Flax's rules decide.

A Variable whose pytree value takes another structure (a dict's keys, a sown tuple) is read with the structure it
has at the call; a loss reads the globals and Python arguments it is given at each call, as ``nnx.value_and_grad``
runs its Python; an optimizer state written in place is the one the update uses; a Variable that aot_module cannot
differentiate is refused, not given zeros. Each against plain ``flax.nnx`` on fresh random inputs.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxaot
from jaxaot.errors import InvalidInputError


def _x(shape=(3, 4)):
    return jax.random.normal(jax.random.key(int(np.random.default_rng().integers(1 << 30))), shape)


class Configured(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.cfg = nnx.Variable({"w": jnp.ones(4), "z": jnp.zeros(4)})

    def __call__(self, x):
        d = self.cfg.get_value()
        return jnp.sum(self.lin(x)) * 0.1 + jnp.sum(d["w"]) + (jnp.sum(d["z"]) if "z" in d else 0.0)


def test_a_variable_whose_dict_takes_other_keys_is_read_with_its_keys_at_the_call():
    plain, aot = Configured(), jaxaot.nn.aot_module(Configured())
    x = _x()
    loss = lambda m, x: m(x)  # noqa: E731
    for cfg in ({"v": 5 * jnp.ones(4), "w": jnp.zeros(4)}, {"w": 2 * jnp.ones(4), "z": jnp.ones(4)}):
        for m in (plain, aot):
            m.cfg.set_value(cfg)
        chex.assert_trees_all_close(aot(x), plain(x), rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(jaxaot.value_and_grad(loss)(aot, x)[0], nnx.value_and_grad(loss)(plain, x)[0],
                                    rtol=1e-6, atol=1e-6)


class Sowing(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 2, rngs=nnx.Rngs(1))

    def __call__(self, x):
        y = self.lin(x)
        self.sow(nnx.Intermediate, "y", y)
        return jnp.sum(y ** 2)


@pytest.mark.filterwarnings(r"ignore:Using .Module.sow\(\). outside:DeprecationWarning")
def test_sown_values_grow_call_after_call_as_in_flax():
    plain, aot = Sowing(), jaxaot.nn.aot_module(Sowing())
    for _ in range(4):
        x = _x()
        chex.assert_trees_all_close(aot(x), plain(x), rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(jaxaot.value_and_grad(lambda m, x: m(x))(aot, x)[0],
                                    nnx.value_and_grad(lambda m, x: m(x))(plain, x)[0], rtol=1e-6, atol=1e-6)
    assert len(aot.y.get_value()) == len(plain.y.get_value()) == 8


def test_a_loss_reads_the_globals_and_python_values_it_is_given_at_each_call():
    settings = {"beta": 1.0}
    target = [jnp.zeros((3, 2))]

    def loss(m, x, train, reduce, n):
        y = m(x[:n]) * (2.0 if train else 1.0) - target[0][:n]
        return settings["beta"] * getattr(jnp, reduce)(y ** 2)

    plain, aot = nnx.Linear(4, 2, rngs=nnx.Rngs(0)), jaxaot.nn.aot_module(nnx.Linear(4, 2, rngs=nnx.Rngs(0)))
    x = _x()
    for beta, value, train, reduce, n in ((1.0, 0.0, True, "mean", 3), (10.0, 0.0, False, "sum", 2),
                                          (1.0, 5.0, True, "mean", 3)):
        settings["beta"], target[0] = beta, jnp.full((3, 2), value)
        want = nnx.value_and_grad(loss)(plain, x, train, reduce, n=n)
        chex.assert_trees_all_close(jaxaot.value_and_grad(loss)(aot, x, train, reduce, n=n), want, rtol=1e-5, atol=1e-6)
        with jaxaot.patch_value_and_grad():
            chex.assert_trees_all_close(nnx.value_and_grad(loss)(aot, x, train, reduce, n=n), want, rtol=1e-5, atol=1e-6)


def test_an_optimizer_state_written_in_place_is_the_one_the_update_uses():
    x = _x()
    loss = lambda m, x: jnp.mean(m(x) ** 2)  # noqa: E731
    kernels = []
    for optimizer in (nnx.Optimizer, jaxaot.nn.Optimizer):
        m = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
        opt = optimizer(m, optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), wrt=nnx.Param)
        opt.update(m, nnx.grad(loss)(m, x))
        opt.opt_state.hyperparams["learning_rate"] = jnp.asarray(0.01)  # a new array in the state's dict
        opt.update(m, nnx.grad(loss)(m, x))
        kernels.append(m.kernel[...])
    chex.assert_trees_all_close(kernels[1], kernels[0], rtol=1e-6, atol=1e-6)


class Scaled(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.scale = Scale(jnp.ones((4,)))

    def __call__(self, x):
        return self.lin(x) * self.scale[...]


class Scale(nnx.Variable):
    pass


def test_differentiating_a_variable_aot_module_cannot_differentiate_is_refused_and_the_module_keeps_working():
    aot, plain = jaxaot.nn.aot_module(Scaled()), Scaled()
    x = _x()
    loss = lambda m, x: jnp.mean(m(x) ** 2)  # noqa: E731
    with pytest.raises(InvalidInputError, match=r"not a parameter is being differentiated \(.*scale.*nnx.Param"):
        nnx.grad(loss, argnums=nnx.DiffState(0, Scale))(aot, x)
    chex.assert_trees_all_close(nnx.grad(loss)(aot, x), nnx.grad(loss)(plain, x), rtol=1e-5, atol=1e-6)


def test_a_python_number_the_loss_computes_with_compiles_once_and_one_it_reads_is_static():
    plain, aot = nnx.Linear(4, 2, rngs=nnx.Rngs(0)), jaxaot.nn.aot_module(nnx.Linear(4, 2, rngs=nnx.Rngs(0)))
    x = _x((6, 4))

    def weighted(m, x, beta):
        return beta * jnp.mean(m(x) ** 2)

    def sliced(m, x, n):
        return jnp.mean(m(x[:n]) ** 2)

    vg = jaxaot.value_and_grad(weighted)
    for beta in (0.5, 1.5, 2.5):  # an input of the program: one compile
        chex.assert_trees_all_close(vg(aot, x, beta), nnx.value_and_grad(weighted)(plain, x, beta), rtol=1e-5, atol=1e-6)
    assert len(vg.cache_info().entries) == 1
    for n in (2, 4, 2):  # read by Python (a slice bound): the loss's static, one program per value
        chex.assert_trees_all_close(jaxaot.value_and_grad(sliced)(aot, x, n),
                                    nnx.value_and_grad(sliced)(plain, x, n), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("read", ["range", "shape"])
def test_a_number_read_as_a_count_or_a_shape_is_static(read):
    plain, aot = nnx.Linear(4, 4, rngs=nnx.Rngs(0)), jaxaot.nn.aot_module(nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    x = _x((3, 4))

    def loss(m, x, n):
        if read == "range":  # TracerIntegerConversionError where n is traced
            for _ in range(n):
                x = jnp.tanh(m(x))
            return jnp.sum(x)
        return jnp.sum(m(x)) * jnp.ones(n).sum()  # a shape's TypeError where n is traced

    for n in (2, 3, 2):
        chex.assert_trees_all_close(jaxaot.value_and_grad(loss)(aot, x, n),
                                    nnx.value_and_grad(loss)(plain, x, n), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aot", [False, True])
def test_a_diff_state_argnums_is_nnx_value_and_grad_s(aot):
    make = lambda: nnx.Linear(4, 3, rngs=nnx.Rngs(0))  # noqa: E731
    x = _x((5, 4))
    loss = lambda m, x: jnp.sum(jnp.tanh(m(x)) ** 2)  # noqa: E731
    which = nnx.DiffState(0, nnx.PathContains("kernel"))
    got = jaxaot.value_and_grad(loss, argnums=which)(jaxaot.nn.aot_module(make()) if aot else make(), x)
    want = nnx.value_and_grad(loss, argnums=which)(make(), x)
    assert jax.tree.structure(got[1]) == jax.tree.structure(want[1])
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
