"""compiled_grad on Flax nnx modules (dropout and batch norm), against nnx.grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import compiled_autograd

nnx = pytest.importorskip("flax.nnx")
from flax_models import AUX_PICKS, StatsAndParam, same_objects  # noqa: E402 - after flax is known present


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))


def loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_nnx_model_with_dropout_and_batch_norm_matches_nnx_grad():
    compiled_autograd.reset()
    rng = np.random.default_rng()
    ours, ref = Net(nnx.Rngs(0, dropout=1)), Net(nnx.Rngs(0, dropout=1))
    g = jaxaot.nnx_compiled_grad(loss)
    for _ in range(2):  # the same dropout masks on both sides: both advance the same RNG counters
        x = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
        y = jnp.asarray(rng.standard_normal((8, 2)), jnp.float32)
        got, want = g(ours, x, y), nnx.grad(loss)(ref, x, y)
        assert isinstance(got, nnx.State)
        _assert_trees_close(got, want)
        _assert_trees_close(nnx.state(ours), nnx.state(ref))  # batch statistics and RNG counters written back
    assert compiled_autograd.stats().compiles == 1


def test_param_hooks_name_nnx_paths():
    model = Net(nnx.Rngs(0, dropout=1))
    model.eval()
    x, y = jnp.ones((4, 6)), jnp.zeros((4, 2))
    got = jaxaot.compiled_grad(loss, param_hooks={"l2/kernel": lambda p, g: g * 0})(model, x, y)
    want = nnx.grad(loss)(model, x, y)
    assert float(jnp.abs(got["l2"]["kernel"][...]).max()) == 0.0
    np.testing.assert_allclose(np.asarray(got["l1"]["kernel"][...]), np.asarray(want["l1"]["kernel"][...]),
                               rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- Params the forward writes
class Normalised(nnx.Module):
    """Normalises its own weight in the forward."""

    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (3,)) + 2.0)

    def __call__(self, x):
        self.w[...] = self.w[...] / jnp.linalg.norm(self.w[...])
        return jnp.sum(jnp.tanh(x @ self.w[...]))


class WrittenTwice(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (3,)))
        self.b = nnx.Param(jnp.zeros(()))  # read, never written

    def __call__(self, x):
        self.w[...] = self.w[...] * 0.9
        y = jnp.sum(jnp.sin(x @ self.w[...] + self.b[...]))
        self.w[...] = self.w[...] + 0.1 * jnp.mean(x)
        return y + jnp.sum(self.w[...] ** 2)


class WrittenOnBranch(nnx.Module):
    """Writes its weight only when Python sees positive data (a look at a value)."""

    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (3,)))

    def __call__(self, x):
        if jnp.sum(x) > 0:
            self.w[...] = self.w[...] * 0.5 + 0.1
        return jnp.sum(jnp.tanh(x @ self.w[...]))


def _leaves(tree):
    return [np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
            for a in jax.tree_util.tree_leaves(tree)]


def _assert_trees_close(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(_leaves(got), _leaves(want)):
        # XLA fuses the step, so float32 rounding differs; an entry's error scales with its array's largest entry.
        # BatchNorm over 5 rows is ill-conditioned: fused and unfused float32 steps differ by up to 4e-5 of that scale.
        scale = float(np.max(np.abs(b))) if b.size and np.issubdtype(b.dtype, np.inexact) else 0.0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, scale))


@pytest.mark.parametrize("replay", (False, True))
@pytest.mark.parametrize("cls", (Normalised, WrittenTwice, WrittenOnBranch, StatsAndParam))
def test_params_written_in_the_forward_match_nnx_value_and_grad(cls, replay):
    rng = np.random.default_rng()
    ours, ref = cls(nnx.Rngs(0)), cls(nnx.Rngs(0))
    vg = jaxaot.compiled_value_and_grad(lambda m, x: jnp.square(m(x)), replay=replay)
    want_vg = nnx.value_and_grad(lambda m, x: jnp.square(m(x)))
    signs = (1.0, -1.0, 1.0, 1.0, -1.0)  # both ways of WrittenOnBranch's branch, each more than once
    for sign in signs:
        x = jnp.asarray(sign * np.abs(rng.standard_normal((5, 3))), jnp.float32)
        (value, grads), (want_value, want_grads) = vg(ours, x), want_vg(ref, x)
        np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-5, atol=1e-6)
        _assert_trees_close(grads, want_grads)
        _assert_trees_close(nnx.state(ours), nnx.state(ref))  # every Variable, Params included


def test_nnx_compiled_grad_writes_params_back():
    ours, ref = Normalised(nnx.Rngs(0)), Normalised(nnx.Rngs(0))
    g = jaxaot.nnx_compiled_grad(lambda m, x: m(x))
    for i in range(3):
        x = jnp.full((2, 3), float(i + 1))
        _assert_trees_close(g(ours, x), nnx.grad(lambda m, x: m(x))(ref, x))
        _assert_trees_close(nnx.state(ours), nnx.state(ref))


@pytest.mark.parametrize("pick", AUX_PICKS.values(), ids=AUX_PICKS.keys())
def test_an_argument_s_variable_or_module_in_aux_is_the_caller_s_own_object(pick):
    """As under nnx.value_and_grad, the aux gives back the caller's own objects (holding the values written)."""
    rng = np.random.default_rng()

    def f(m, x):
        return jnp.sum(m(x)), pick(m)

    ours, ref = StatsAndParam(nnx.Rngs(0)), StatsAndParam(nnx.Rngs(0))
    vg, want_vg = jaxaot.compiled_value_and_grad(f, has_aux=True), nnx.value_and_grad(f, has_aux=True)
    for _ in range(3):
        x = jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)
        ((_, aux), _), ((_, want), _) = vg(ours, x), want_vg(ref, x)
        same, want_same = same_objects(aux, pick(ours)), same_objects(want, pick(ref))
        assert same == want_same == [True] * len(same)
        _assert_trees_close(nnx.state(ours), nnx.state(ref))


def test_a_variable_made_in_the_forward_is_returned_new_with_its_value():
    rng = np.random.default_rng()

    def f(m, x):
        h = m(x)
        return jnp.sum(h), nnx.Variable(h * 2.0)

    m = StatsAndParam(nnx.Rngs(0))
    x = jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)
    (_, aux), _ = jaxaot.compiled_value_and_grad(f, has_aux=True)(m, x)
    (_, want), _ = nnx.value_and_grad(f, has_aux=True)(StatsAndParam(nnx.Rngs(0)), x)
    assert type(aux) is type(want) and not any(aux is node for _, node in nnx.iter_graph(m))
    np.testing.assert_allclose(np.asarray(aux[...]), np.asarray(want[...]), rtol=1e-5, atol=1e-5)


def _fresh_net():
    return nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)),
                          nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1)))


@pytest.mark.parametrize("replay", (False, True))
@pytest.mark.parametrize("wrap", (lambda m: [m], lambda m: {"net": m}, lambda m: (m, 2.0)),
                         ids=("list", "dict", "tuple"))
def test_modules_inside_a_container_are_split_and_written_back_as_nnx_does(wrap, replay):
    """A module reaching the loss inside a list, dict or tuple is state the forward changes (batch statistics, the
    dropout RNG's count), written back each call as under nnx.value_and_grad: never a replay of the first mask."""
    def loss(w, x, box):
        net = box["net"] if isinstance(box, dict) else box[0]
        return jnp.sum(net(x @ w) ** 2)

    ours, ref = _fresh_net(), _fresh_net()
    vg, want_vg = jaxaot.compiled_value_and_grad(loss, replay=replay), nnx.value_and_grad(loss)
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)
    for _ in range(3):
        x = jnp.asarray(rng.standard_normal((5, 4)), jnp.float32)
        (value, grad), (want_value, want_grad) = vg(w, x, wrap(ours)), want_vg(w, x, wrap(ref))
        np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-5, atol=1e-6)
        _assert_trees_close(grad, want_grad)  # an error scaled to the gradient's largest entry (BatchNorm of 5 rows)
        _assert_trees_close(nnx.state(ours), nnx.state(ref))


def test_rngs_given_as_an_argument_advance_as_under_nnx():
    lin_ours, lin_ref, drop = nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Dropout(0.5)

    def loss(m, x, rngs):
        return jnp.sum(drop(m(x), rngs=rngs) ** 2)

    ours, ref = nnx.Rngs(dropout=7), nnx.Rngs(dropout=7)
    g = jaxaot.nnx_compiled_grad(loss)
    for _ in range(3):
        x = jnp.asarray(np.random.default_rng().standard_normal((3, 4)), jnp.float32)
        _assert_trees_close(g(lin_ours, x, ours), nnx.grad(loss)(lin_ref, x, ref))
        _assert_trees_close(nnx.state(ours), nnx.state(ref))


def test_nnx_state_given_by_keyword_is_refused_by_name():
    vg = jaxaot.compiled_value_and_grad(lambda w, x, net=None: jnp.sum(net(x @ w)))
    with pytest.raises(jaxaot.errors.InvalidInputError, match="keyword argument 'net' holds Flax nnx state.*"
                                                              "Pass it by position"):
        vg(jnp.ones((4, 4)), jnp.ones((2, 4)), net=_fresh_net())


class Counted(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 3, rngs=rngs)
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("replay", (False, True))
def test_a_plain_attribute_the_forward_changes_is_refused_not_dropped(replay):
    """nnx.value_and_grad keeps ``self.calls += 1``; the write-back carries Variables only, so it is refused, and
    the module is left as it was."""
    m = Counted(nnx.Rngs(0))
    before = jax.tree_util.tree_map(np.asarray, nnx.state(m))
    vg = jaxaot.compiled_value_and_grad(lambda m, x: jnp.sum(m(x) ** 2), replay=replay)
    with pytest.raises(jaxaot.errors.InvalidInputError, match=r"changed the module's attributes \(`calls`: 0 → 1\)"):
        vg(m, jnp.ones((2, 3)))
    assert m.calls == 0
    _assert_trees_close(nnx.state(m), before)


def _linear(seed):
    return nnx.Linear(4, 4, rngs=nnx.Rngs(seed))


def _containers(seed):
    shared = _linear(seed + 2)
    return [
        (lambda ms, x: jnp.mean(ms[0](x) ** 2) + jnp.mean(jnp.tanh(ms[1](x))), [_linear(seed), _linear(seed + 1)]),
        (lambda ms, x: jnp.mean(ms["enc"](x) ** 2) + jnp.mean(ms["dec"](x)),
         {"enc": _linear(seed), "dec": _linear(seed + 1)}),
        (lambda ms, x: jnp.mean(ms["one"](ms["list"][1](ms["list"][0](x))) ** 2),
         {"list": [shared, _linear(seed)], "one": shared}),  # one module held twice: its gradient once, the first
    ]


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("replay", [False, True])
def test_a_list_or_dict_of_modules_gets_its_gradients_in_nnx_grads_form(case, replay):
    seed = int(np.random.default_rng().integers(1 << 20))
    x = jax.random.normal(jax.random.key(seed), (3, 4))
    loss, ms = _containers(seed)[case]
    want = nnx.value_and_grad(loss)(_containers(seed)[case][1], x)
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for _ in range(2):
        got = vg(ms, x)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        _assert_trees_close(got, want)
    grads = jaxaot.compiled_grad(loss)(ms, x)
    assert jax.tree.structure(grads) == jax.tree.structure(want[1])


@pytest.mark.parametrize("make", [lambda: {"model": _linear(0), "scale": jnp.full((4,), 0.5)},
                                  lambda: [_linear(0), 0.5]])
def test_an_array_beside_modules_in_a_differentiated_argument_is_refused(make):
    """nnx.grad differentiates such an array too: compiled autograd refuses it, never leaving its gradient out."""
    def loss(p, x):
        model, scale = (p["model"], p["scale"]) if isinstance(p, dict) else p
        return jnp.mean(jnp.tanh(model(x) * scale) ** 2)

    x = jax.random.normal(jax.random.key(int(np.random.default_rng().integers(1 << 20))), (3, 4))
    vg = jaxaot.compiled_value_and_grad(loss)
    with pytest.raises(jaxaot.errors.InvalidInputError, match=r"\['scale'\]|\[1\]"):
        vg(make(), x)
    ok = lambda m, x: loss({"model": m, "scale": 0.5}, x)  # noqa: E731
    _assert_trees_close(jaxaot.compiled_value_and_grad(ok)(_linear(1), x), nnx.value_and_grad(ok)(_linear(1), x))
