"""``jaxaot.value_and_grad(loss_fn)(aot_model, ...)``: the compiled eager step against ``nnx.value_and_grad``."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxaot
from flax_models import AUX_PICKS, TOL, StatsAndParam, assert_states_equal, batch, nnx_model, same_objects, xent
from jaxaot.errors import InvalidOutputError


def _train(name: str, vg, aot: bool, steps: int = 4, **kw):
    model = nnx_model(name)
    m = jaxaot.nn.aot_module(model) if aot else model
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
    losses = []

    def loss_fn(mm, xx, yy):
        return xent(mm(xx), yy)

    for step in range(steps):
        x, y = batch(name, step)
        loss, grads = vg(loss_fn, **kw)(m, x, y)
        opt.update(m, grads)
        losses.append(loss)
    return jnp.stack(losses), nnx.state(model), m


@pytest.mark.parametrize("name", ["cnn", "transformer"])
@pytest.mark.parametrize("fused", [True, False])
def test_training_matches_nnx_value_and_grad(name, fused):
    """Losses, parameters, batch statistics and RNG counts (dropout) after training steps."""
    ref_losses, ref_state, _ = _train(name, nnx.value_and_grad, aot=False)
    losses, state, m = _train(name, jaxaot.value_and_grad, aot=True, fused=fused)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    assert_states_equal(state, ref_state)
    info = m.loss_program.cache_info()
    assert info.misses == 1 and info.hits == 3  # one compile for every step of one signature
    assert m.program.cache_info().misses == 0  # the module's own call was never run on its own
    names = [n for e in info.entries for n in e.executables]
    assert any(n.startswith("fused") for n in names) == fused


def _mlp(seed: int = 0):
    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(5, 8, rngs=rngs)
            self.norm = nnx.LayerNorm(8, rngs=rngs)
            self.l2 = nnx.Linear(8, 3, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.gelu(self.norm(self.l1(x))))

    return MLP(nnx.Rngs(seed))


def _data(seed: int):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, (6, 5)), jax.random.normal(k2, (6, 3))


def test_grad_structure_aux_and_position():
    """The module anywhere in the arguments, with auxiliary outputs: the same tree as nnx's."""
    x, y = _data(1)

    def loss_fn(xx, model, yy):
        out = model(xx)
        return jnp.mean((out - yy) ** 2), {"out": out}

    ref = nnx.value_and_grad(loss_fn, argnums=1, has_aux=True)(x, jaxaot.nn.aot_module(_mlp()), y)
    got = jaxaot.value_and_grad(loss_fn, argnums=1, has_aux=True)(x, jaxaot.nn.aot_module(_mlp()), y)
    assert jax.tree.structure(got) == jax.tree.structure(ref)
    chex.assert_trees_all_close(got, ref, **TOL)
    # argnums=(1,): gradients in a 1-tuple, as nnx returns them
    grads = jaxaot.grad(loss_fn, argnums=(1,), has_aux=True)(x, jaxaot.nn.aot_module(_mlp()), y)[0]
    ref_tuple = nnx.grad(loss_fn, argnums=(1,), has_aux=True)(x, jaxaot.nn.aot_module(_mlp()), y)[0]
    assert isinstance(grads, tuple) and jax.tree.structure(grads) == jax.tree.structure(ref_tuple)
    chex.assert_trees_all_close(grads, ref_tuple, **TOL)
    chex.assert_trees_all_close(grads[0], ref[1], **TOL)


@pytest.mark.parametrize("aot", [False, True])
def test_several_argnums_with_a_module_are_nnx_value_and_grad(aot):
    """The module's gradient an ``nnx.State`` beside the input's, and its state (batch statistics, dropout's RNG
    counts) written back, as ``nnx.value_and_grad`` gives; ``jaxaot.grad`` too."""
    ref_model, model = nnx_model("cnn", seed=2), nnx_model("cnn", seed=2)
    m = jaxaot.nn.aot_module(model) if aot else model
    for step in range(2):
        x, y = batch("cnn", step)
        ref = nnx.value_and_grad(lambda mm, xx: xent(mm(xx), y), argnums=(0, 1))(ref_model, x)
        got = jaxaot.value_and_grad(lambda mm, xx: xent(mm(xx), y), argnums=(0, 1))(m, x)
        assert jax.tree.structure(got) == jax.tree.structure(ref) and isinstance(got[1][0], nnx.State)
        chex.assert_trees_all_close(got, ref, **TOL)
        assert_states_equal(nnx.state(model), nnx.state(ref_model))
    grads = jaxaot.grad(lambda mm, xx: xent(mm(xx), y), argnums=(1, 0))(m, x)
    chex.assert_trees_all_close(grads, nnx.grad(lambda mm, xx: xent(mm(xx), y), argnums=(1, 0))(ref_model, x),
                                **TOL)


def test_under_jit_and_with_other_flax_objects_it_is_nnx_value_and_grad():
    x, y = _data(2)
    m = jaxaot.nn.aot_module(_mlp())
    other = _mlp(seed=3)  # a second module as an argument: nnx's own path

    def loss_fn(model, xx, yy, extra=None):
        out = model(xx) + (0.0 if extra is None else extra(xx))
        return jnp.mean((out - yy) ** 2)

    ref = nnx.value_and_grad(loss_fn)(_mlp(), x, y, other)
    chex.assert_trees_all_close(jaxaot.value_and_grad(loss_fn)(m, x, y, other)[1], ref[1], **TOL)
    jitted = nnx.jit(lambda model, xx, yy: jaxaot.value_and_grad(loss_fn)(model, xx, yy))
    ref = nnx.value_and_grad(loss_fn)(_mlp(), x, y)
    chex.assert_trees_all_close(jitted(m, x, y)[1], ref[1], **TOL)
    assert m.loss_program.cache_info().misses == 0  # neither call ran the eager fast path


def test_bad_outputs_raise_and_the_module_keeps_working():
    x, y = _data(4)
    m = jaxaot.nn.aot_module(_mlp())
    with pytest.raises(InvalidOutputError, match="pair"):
        jaxaot.value_and_grad(lambda mm, xx: jnp.sum(mm(xx)), has_aux=True)(m, x)
    with pytest.raises(TypeError):  # as jax.grad: the loss must be a scalar
        jaxaot.value_and_grad(lambda mm, xx: mm(xx))(m, x)
    loss, grads = jaxaot.value_and_grad(lambda mm, xx: jnp.sum(mm(xx) ** 2))(m, x)
    ref_loss, ref = nnx.value_and_grad(lambda mm, xx: jnp.sum(mm(xx) ** 2))(_mlp(), x)
    chex.assert_trees_all_close((loss, grads), (ref_loss, ref), **TOL)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside:DeprecationWarning")
def test_state_created_by_the_call_is_written_back():
    """A Variable the loss creates (``sow``) reaches the module, as with nnx.value_and_grad."""
    class Sower(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

        def __call__(self, x):
            h = self.lin(x)
            self.sow(nnx.Intermediate, "h", h)
            return h

    x = jax.random.normal(jax.random.key(5), (4, 3))
    ref_model, model = Sower(), jaxaot.nn.aot_module(Sower())
    nnx.value_and_grad(lambda mm: jnp.sum(mm(x) ** 2))(ref_model)
    jaxaot.value_and_grad(lambda mm: jnp.sum(mm(x) ** 2))(model)
    chex.assert_trees_all_close(model.h.get_value(), ref_model.h.get_value(), **TOL)


def test_the_split_is_kept_across_steps_and_redone_when_the_module_changes(monkeypatch):
    """Steps reuse the module's split (no graph walk per step); a submodule replaced between steps is
    seen: the gradients and the update are those nnx computes for the changed model."""
    from jaxaot._src.nn import split_cache

    built = []

    class Counting(split_cache.ModuleSplit):
        def __init__(self, module):
            built.append(1)
            super().__init__(module)

    monkeypatch.setattr(split_cache, "ModuleSplit", Counting)
    x, y = _data(6)
    ref, m = _mlp(), jaxaot.nn.aot_module(_mlp())
    ref_opt = nnx.Optimizer(ref, optax.sgd(0.1), wrt=nnx.Param)
    opt = jaxaot.nn.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param)

    def loss_fn(model, xx, yy):
        return jnp.mean((model(xx) - yy) ** 2)

    def step(model, o, vg):
        loss, grads = vg(loss_fn)(model, x, y)
        o.update(model, grads)
        return loss, grads

    for _ in range(3):
        ref_out, out = step(ref, ref_opt, nnx.value_and_grad), step(m, opt, jaxaot.value_and_grad)
        chex.assert_trees_all_close(out, ref_out, **TOL)
    m(x)  # the module's own call shares the split
    assert len(built) == 1
    ref.l2, m.l2 = nnx.Linear(8, 3, rngs=nnx.Rngs(7)), nnx.Linear(8, 3, rngs=nnx.Rngs(7))
    for _ in range(2):
        ref_out, out = step(ref, ref_opt, nnx.value_and_grad), step(m, opt, jaxaot.value_and_grad)
        chex.assert_trees_all_close(out, ref_out, **TOL)
    assert len(built) == 2
    chex.assert_trees_all_close(nnx.state(m), nnx.state(ref), **TOL)


@pytest.mark.parametrize("pick", AUX_PICKS.values(), ids=AUX_PICKS.keys())
def test_an_aot_module_s_variable_or_submodule_in_aux_is_the_caller_s_own_object(pick):
    """As under ``nnx.value_and_grad``, the aux of an ``aot_module``'s loss gives back the caller's own objects,
    holding the values written back, on the first call and on the compiled ones after it."""
    def f(m, x):
        return jnp.sum(m(x)), pick(m)

    ours, ref = jaxaot.nn.aot_module(StatsAndParam(nnx.Rngs(0))), StatsAndParam(nnx.Rngs(0))
    for step in range(3):
        x = jax.random.normal(jax.random.key(100 + step), (5 + step % 2, 3))  # two shapes: two programs
        ((_, aux), grads), ((_, want), want_grads) = (jaxaot.value_and_grad(f, has_aux=True)(ours, x),
                                                      nnx.value_and_grad(f, has_aux=True)(ref, x))
        same = same_objects(aux, pick(ours))
        assert same and all(same), same
        chex.assert_trees_all_close(grads, want_grads, **TOL)
        assert_states_equal(nnx.state(ours.wrapped), nnx.state(ref))


def test_a_deleted_model_frees_its_programs():
    """The gradient programs of a model's loss live as long as the model and its loss function: once both are
    gone nothing of them is left (a run that builds models in a loop does not grow)."""
    import gc
    import weakref

    def train_once():
        x, y = _data(2)
        loss_fn = lambda model: jnp.mean((model(x) - y) ** 2)  # noqa: E731
        model = jaxaot.nn.aot_module(_mlp())
        value, _ = jaxaot.value_and_grad(loss_fn)(model)
        chex.assert_trees_all_close(value, loss_fn(model), **TOL)
        return weakref.ref(model.loss_program)

    programs = [train_once() for _ in range(2)]
    gc.collect()
    assert [p() for p in programs] == [None, None]
