"""An ``aot_module`` inside plain Flax state: the same state paths, split/merge, Flax's
transformations and optimizers, Orbax checkpoints, pickling and copies, as the same model
holding the plain module."""

from __future__ import annotations

import copy
import pickle

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxaot
from flax_models import TOL, assert_states_equal, xent

IN, WIDTH, CLASSES = 6, 16, 5


class Body(nnx.Module):
    """Linear -> BatchNorm -> GELU -> Linear: parameters and batch statistics. (No bias before the
    BatchNorm: its gradient is exactly zero, and Adam would turn rounding noise into updates.)"""

    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(WIDTH, 2 * WIDTH, use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(2 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.bn(self.up(x))))


class Net(nnx.Module):
    """A plain model whose middle block is an ``aot_module`` (``aot=True``) or the plain block."""

    def __init__(self, aot: bool, seed: int = 0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Linear(IN, WIDTH, rngs=rngs)
        body = Body(rngs)
        self.body = jaxaot.nn.aot_module(body) if aot else body
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.head(self.norm(self.body(jax.nn.relu(self.embed(x)))))


def loss_fn(model, x, y):
    return xent(model(x), y)


def data(step: int, batch: int = 8):
    """Fresh random data per step."""
    kx, ky = jax.random.split(jax.random.fold_in(jax.random.key(42), step))
    return jax.random.normal(kx, (batch, IN), jnp.float32), jax.random.randint(ky, (batch,), 0, CLASSES)


def flat(state) -> list:
    return [(path, type(v).__name__, v.get_value().shape, v.get_value().dtype) for path, v in nnx.to_flat_state(state)]


def test_state_paths_and_structure_equal_the_plain_models():
    plain, mixed = Net(aot=False), Net(aot=True)
    assert flat(nnx.state(mixed)) == flat(nnx.state(plain))
    assert jax.tree.structure(nnx.state(mixed)) == jax.tree.structure(nnx.state(plain))
    for f in (nnx.Param, nnx.BatchStat):
        assert flat(nnx.state(mixed, f)) == flat(nnx.state(plain, f))
    assert_states_equal(nnx.state(mixed), nnx.state(plain))
    # As a JAX pytree (Flax modules are pytrees) too: the same keys.
    keys = lambda m: [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(m)[0]]  # noqa: E731
    assert keys(mixed) == keys(plain)
    # And at the top level: the wrapper's state is the wrapped module's.
    body = Body(nnx.Rngs(0))
    assert flat(nnx.state(jaxaot.nn.aot_module(body))) == flat(nnx.state(body))


def test_split_merge_round_trip_keeps_the_compiled_programs():
    model = Net(aot=True)
    x, _ = data(0)
    ref = model(x)
    graphdef, state = nnx.split(model)
    merged = nnx.merge(graphdef, state)
    assert isinstance(merged.body, jaxaot.nn.AOTModule)
    assert merged.body.program is model.body.program  # the same compiled programs, no recompilation
    misses = model.body.cache_info().misses
    chex.assert_trees_all_close(merged(x), model(x), **TOL)
    assert model.body.cache_info().misses == misses
    assert nnx.graphdef(nnx.clone(model)) == graphdef
    assert merged.body.up.kernel is model.body.up.kernel  # as in Flax: a merge reuses the Variables
    copied = nnx.merge(graphdef, state, copy=True)
    nnx.update(copied, jax.tree.map(jnp.zeros_like, nnx.state(copied, nnx.Param)))
    assert jnp.allclose(copied(x), 0.0) and not jnp.allclose(model(x), 0.0)
    chex.assert_trees_all_close(model(x), ref, **TOL)  # training-mode BatchNorm: batch statistics


def _train(kind: str, aot: bool, steps: int = 4):
    model = Net(aot)
    opt_cls = jaxaot.nn.Optimizer if kind == "jaxaot" else nnx.Optimizer
    opt = opt_cls(model, optax.adam(1e-2), wrt=nnx.Param)

    def step(m, o, x, y):
        vg = jaxaot.value_and_grad if kind == "jaxaot" else nnx.value_and_grad
        loss, grads = vg(loss_fn)(m, x, y)
        o.update(m, grads)
        return loss

    run = nnx.jit(step) if kind == "jit" else step
    losses = [run(model, opt, *data(i)) for i in range(steps)]
    return jnp.stack(losses), nnx.state(model), nnx.state(opt)


@pytest.mark.parametrize("kind", ["jit", "eager", "jaxaot"])
def test_training_matches_the_plain_model(kind):
    """Under nnx.jit, eager nnx.value_and_grad + nnx.Optimizer, and jaxaot.value_and_grad +
    jaxaot.nn.Optimizer: the same losses, state and optimizer state as the plain model."""
    ref_losses, ref_state, ref_opt = _train(kind, aot=False)
    losses, state, opt_state = _train(kind, aot=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    assert_states_equal(state, ref_state)
    assert flat(opt_state) == flat(ref_opt)
    assert_states_equal(opt_state, ref_opt)


def test_orbax_checkpoint_restores_and_training_resumes(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")

    def make(aot):
        model = Net(aot)
        return model, jaxaot.nn.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    def train(model, opt, steps):
        return [float(_step(model, opt, *data(i))) for i in steps]

    def _step(model, opt, x, y):
        loss, grads = jaxaot.value_and_grad(loss_fn)(model, x, y)
        opt.update(model, grads)
        return loss

    ref_model, ref_opt = make(aot=False)
    ref = train(ref_model, ref_opt, range(6))

    model, opt = make(aot=True)
    train(model, opt, range(3))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"model": nnx.state(model), "opt": nnx.state(opt)})
    checkpointer.wait_until_finished()

    # Restore into a fresh model with an aot_module, and into the plain model: the same paths.
    for aot in (True, False):
        fresh_model, fresh_opt = make(aot)
        target = {"model": nnx.state(fresh_model), "opt": nnx.state(fresh_opt)}
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
        restored = checkpointer.restore(tmp_path / "ckpt", abstract)
        nnx.update(fresh_model, restored["model"])
        nnx.update(fresh_opt, restored["opt"])
        resumed = train(fresh_model, fresh_opt, range(3, 6))
        chex.assert_trees_all_close(jnp.array(resumed), jnp.array(ref[3:]), **TOL)
    assert_states_equal(nnx.state(fresh_model), nnx.state(ref_model))


def test_pickle_and_deepcopy():
    model = Net(aot=True)
    x, _ = data(1)
    ref = model(x)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert isinstance(other.body, jaxaot.nn.AOTModule)
        assert flat(nnx.state(other)) == flat(nnx.state(model))
        chex.assert_trees_all_close(other(x), ref, **TOL)  # batch statistics of the same history
        assert other.body.wrapped is not model.body.wrapped
    assert copy.deepcopy(model).body.program is model.body.program  # a copy shares the compiled programs
    assert pickle.loads(pickle.dumps(model)).body.program is not model.body.program  # rebuilt on load


def test_attributes_train_eval_and_write_back_reach_the_wrapped_module():
    body = Body(nnx.Rngs(0))
    model = Net(aot=True)
    model.body = jaxaot.nn.aot_module(body)
    drop = jaxaot.nn.aot_module(nnx.Dropout(0.5, rngs=nnx.Rngs(1)))
    assert model.body.bn is body.bn and model.body.up.kernel is body.up.kernel
    model.eval()
    drop.eval()
    assert body.bn.use_running_average and drop.deterministic and drop.wrapped.deterministic
    x, _ = data(2)
    chex.assert_trees_all_close(drop(x), x)
    model.train()
    mean = body.bn.mean[...]
    model(x)  # the batch statistics are written into the wrapped module
    assert not jnp.allclose(body.bn.mean[...], mean)
    # A structural change (a new submodule) is seen: the next call uses it.
    body.down = nnx.Linear(2 * WIDTH, WIDTH, rngs=nnx.Rngs(5))
    chex.assert_trees_all_close(model.body(jnp.ones((2, WIDTH))), body(jnp.ones((2, WIDTH))), **TOL)


class Dropped(nnx.Module):
    """A block with dropout: each call advances its RNG count, an integer Variable the call writes back."""

    def __init__(self, seed: int):
        self.lin = nnx.Linear(WIDTH, WIDTH, rngs=nnx.Rngs(seed))
        self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(seed + 1))

    def __call__(self, x):
        return self.drop(jnp.tanh(self.lin(x)))


@pytest.mark.parametrize("grad", ["nnx", "jaxaot", "nnx_jit"])
def test_a_block_with_dropout_called_twice_under_one_gradient(grad):
    """The second call reads the RNG count the first wrote back under the same jax.grad: an integer, never a
    Variable being differentiated."""
    def loss(m, x):
        return jnp.mean(m(m(x)) ** 2)

    vg = {"nnx": nnx.value_and_grad(loss), "jaxaot": jaxaot.value_and_grad(loss),
          "nnx_jit": nnx.jit(nnx.value_and_grad(loss))}[grad]
    ours, ref = jaxaot.nn.aot_module(Dropped(3)), Dropped(3)
    for step in range(2):
        x = jax.random.normal(jax.random.fold_in(jax.random.key(7), step), (4, WIDTH))
        (value, grads), (want, want_grads) = vg(ours, x), nnx.value_and_grad(loss)(ref, x)
        chex.assert_trees_all_close((value, nnx.to_pure_dict(grads)), (want, nnx.to_pure_dict(want_grads)), **TOL)
        assert_states_equal(nnx.state(ours), nnx.state(ref))
