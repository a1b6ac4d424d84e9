"""``jaxaot.nn.Optimizer``: the compiled eager update against ``nnx.Optimizer``."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxaot
from flax_models import TOL, assert_states_equal, batch, nnx_model, xent

TXS = {
    "adam": lambda: optax.adam(1e-2),
    "sgd_momentum_clip": lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(1e-2, momentum=0.9)),
    "adamw_schedule": lambda: optax.adamw(optax.linear_schedule(1e-2, 1e-3, 5), weight_decay=1e-3),
    # masked-out entries of the state hold optax.MaskedNode, which has no arrays
    "masked_adam": lambda: optax.masked(optax.adam(1e-2), lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
    "multi_transform": lambda: optax.multi_transform({True: optax.adam(1e-2), False: optax.sgd(1e-2)},
                                                     lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
}


def _train(name: str, opt_cls, tx_name: str, aot: bool, steps: int = 3):
    model = nnx_model(name)
    m = jaxaot.nn.aot_module(model) if aot else model
    opt = opt_cls(m, TXS[tx_name](), wrt=nnx.Param)
    losses, updates = [], []
    for step in range(steps):
        x, y = batch(name, step)
        loss, grads = nnx.value_and_grad(lambda mm, xx, yy: xent(mm(xx), yy))(m, x, y)
        updates.append(opt.update(m, grads))
        losses.append(loss)
    return jnp.stack(losses), updates, nnx.state(model), opt


@pytest.mark.parametrize("tx_name", sorted(TXS))
def test_matches_nnx_optimizer(tx_name):
    """Losses, returned updates, parameters, optimizer state and step count after 3 eager steps."""
    ref_losses, ref_updates, ref_state, ref_opt = _train("cnn", nnx.Optimizer, tx_name, aot=False)
    losses, updates, state, opt = _train("cnn", jaxaot.nn.Optimizer, tx_name, aot=False)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    chex.assert_trees_all_close(updates, ref_updates, **TOL)
    assert_states_equal(state, ref_state, **TOL)
    chex.assert_trees_all_close(nnx.as_pure(nnx.state(opt.opt_state)), nnx.as_pure(nnx.state(ref_opt.opt_state)),
                                **TOL)
    assert int(opt.step[...]) == int(ref_opt.step[...]) == 3
    assert opt.step[...].dtype == ref_opt.step[...].dtype
    info = opt.cache_info()
    assert (info.misses, info.hits) == (1, 2), info  # every update compiled: none ran nnx.Optimizer's own


def test_with_aot_module_and_jaxaot_value_and_grad():
    """The eager step the optimizer is for: an ``aot_module`` (BN + dropout), ``jaxaot.value_and_grad``."""
    ref_losses, _, ref_state, _ = _train("cnn", nnx.Optimizer, "adam", aot=False)
    model = nnx_model("cnn")
    m = jaxaot.nn.aot_module(model)
    opt = jaxaot.nn.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
    losses = []
    for step in range(3):
        x, y = batch("cnn", step)
        loss, grads = jaxaot.value_and_grad(lambda mm, xx, yy: xent(mm(xx), yy))(m, x, y)
        opt.update(m, grads)
        losses.append(loss)
    chex.assert_trees_all_close(jnp.stack(losses), ref_losses, **TOL)
    assert_states_equal(nnx.state(model), ref_state, **TOL)


def test_under_nnx_jit_is_nnx_optimizer():
    """Traced, ``update`` is ``nnx.Optimizer.update``: same results as the plain optimizer under ``nnx.jit``."""
    results = []
    for cls in (nnx.Optimizer, jaxaot.nn.Optimizer):
        model = nnx_model("cnn")
        opt = cls(model, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def step(mm, oo, xx, yy):
            loss, grads = nnx.value_and_grad(lambda a: xent(a(xx), yy))(mm)
            oo.update(mm, grads)
            return loss

        x, y = batch("cnn", 0)
        results.append((step(model, opt, x, y), step(model, opt, x, y), nnx.state(model)))
    chex.assert_trees_all_close(results[0][:2], results[1][:2], **TOL)
    assert_states_equal(results[0][2], results[1][2], **TOL)


def test_non_array_kwargs_fall_back():
    """``update(..., value_fn=...)`` (a line search) holds a function: it runs as ``nnx.Optimizer.update``."""
    outs = []
    for cls in (nnx.Optimizer, jaxaot.nn.Optimizer):
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        tx = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(max_backtracking_steps=5))
        opt = cls(model, tx, wrt=nnx.Param)
        x = jax.random.normal(jax.random.key(1), (4, 3))

        def loss_fn(mm):
            return jnp.mean(mm(x) ** 2)

        def value_fn(params):
            return loss_fn(nnx.merge(nnx.graphdef(model), params, nnx.state(model, nnx.Not(nnx.Param))))

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads, value=loss, grad=grads, value_fn=value_fn)
        outs.append(nnx.state(model))
    assert_states_equal(outs[0], outs[1], **TOL)


def _python_reads_value() -> optax.GradientTransformationExtraArgs:
    """A transformation whose Python reads the number passed (``float(value)``): traced, it cannot run."""
    def update(updates, state, params=None, *, value, **extra):
        return jax.tree.map(lambda u: u * (2.0 if float(value) > 0.5 else 1.0), updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


@pytest.mark.parametrize("tx_name", ["reduce_on_plateau", "python_reads_value"])
def test_python_number_kwargs_compile_once_or_fall_back_with_flax_s_results(tx_name):
    """``update(..., value=loss.item())``: a Python float is traced as ``nnx.jit`` traces it, one compile for
    every value; where the transformation's Python reads it, the update is ``nnx.Optimizer.update``'s."""
    make = {"reduce_on_plateau": lambda: optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau(patience=1)),
            "python_reads_value": lambda: optax.chain(optax.sgd(0.1), _python_reads_value())}[tx_name]
    x = jnp.asarray(np.random.default_rng().normal(size=(4, 3)), jnp.float32)
    states, infos = [], []
    for cls in (nnx.Optimizer, jaxaot.nn.Optimizer):
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        opt = cls(model, make(), wrt=nnx.Param)
        for value in (1.0, 0.25, 3.0, 0.75):
            grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
            opt.update(model, grads, value=value)
        states.append(nnx.state(model))
        infos.append(getattr(opt, "cache_info", lambda: None)())
    assert_states_equal(states[0], states[1], **TOL)
    if tx_name == "reduce_on_plateau":
        assert infos[1].misses == 1 and infos[1].hits == 3
    else:
        assert infos[1].misses == 0  # every update ran Flax's own


def test_bad_grads_leave_state_untouched():
    """Gradients of the wrong structure raise, and the model and optimizer are unchanged and keep working."""
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    opt = jaxaot.nn.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    before = jax.tree.map(lambda a: a.copy(), nnx.as_pure(nnx.state(model)))
    bad = nnx.state(nnx.Linear(3, 5, rngs=nnx.Rngs(1)), nnx.Param)
    with pytest.raises((TypeError, ValueError)):
        opt.update(model, bad)
    chex.assert_trees_all_equal(nnx.as_pure(nnx.state(model)), before)
    assert int(opt.step[...]) == 0
    grads = nnx.grad(lambda mm: jnp.sum(mm(jnp.ones((2, 3)))))(model)
    opt.update(model, grads)
    assert int(opt.step[...]) == 1


def test_update_reuses_the_gradients_traversal_only_for_those_gradients():
    """``opt.update(m, grads)`` right after ``jaxaot.value_and_grad`` reuses its split; a copy of the
    gradients, another module, a module changed in between or a filter other than ``nnx.Param`` walks
    the module again. All agree with ``nnx.Optimizer``."""
    from jaxaot._src.nn.traversal import recall

    def run(opt_cls, copy_grads: bool):
        model = nnx_model("cnn")
        m = jaxaot.nn.aot_module(model)
        opt = opt_cls(m, optax.adam(1e-2), wrt=nnx.Param)
        for step in range(2):
            x, y = batch("cnn", step)
            _, grads = jaxaot.value_and_grad(lambda mm, xx, yy: xent(mm(xx), yy))(m, x, y)
            split = recall(grads, m)
            assert split is not None and recall(grads, nnx_model("cnn")) is None
            live = jax.tree_util.tree_leaves(nnx.state(m, nnx.Param), is_leaf=_is_var)
            assert len(split.param_vars) == len(live) and all(a is b for a, b in zip(split.param_vars, live))
            if copy_grads:
                grads = jax.tree_util.tree_map(lambda g: g, grads)
                assert recall(grads, m) is None
            opt.update(m, grads)
        return nnx.state(model), nnx.as_pure(nnx.state(opt.opt_state))

    ref_state, ref_opt = run(nnx.Optimizer, False)
    for copy_grads in (False, True):
        state, opt_state = run(jaxaot.nn.Optimizer, copy_grads)
        assert_states_equal(state, ref_state, **TOL)
        chex.assert_trees_all_close(opt_state, ref_opt, **TOL)


def _is_var(x):
    return isinstance(x, nnx.Variable)


def test_update_after_the_module_changed_updates_the_new_parameters():
    """A submodule re-assigned between the gradient and the update: the update walks the module and
    writes into the new Variables, as ``nnx.Optimizer`` does."""
    from jaxaot._src.nn.traversal import recall

    m = jaxaot.nn.aot_module(nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 2, rngs=nnx.Rngs(1))))
    opt = jaxaot.nn.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param)
    _, grads = jaxaot.value_and_grad(lambda mm: jnp.sum(mm(jnp.ones((2, 3))) ** 2))(m)
    fresh = nnx.Linear(4, 2, rngs=nnx.Rngs(2))
    before = fresh.kernel[...]
    m.layers[1] = fresh
    assert recall(grads, m) is None
    opt.update(m, grads)
    chex.assert_trees_all_close(fresh.kernel[...], before - 0.1 * grads["layers"][1]["kernel"][...], **TOL)


def test_value_hooks_are_bypassed_as_in_nnx():
    """``nnx.Optimizer`` reads and writes raw values (``nnx.as_pure`` / ``nnx.update``): a parameter's
    ``on_set_value`` hook does not run, and ``jaxaot.nn.Optimizer`` does the same."""
    calls = []

    def hook(var, value):
        calls.append(1)
        return value

    def run(opt_cls):
        lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        lin.kernel = nnx.Param(lin.kernel[...], on_set_value=hook)
        opt = opt_cls(lin, optax.sgd(0.1), wrt=nnx.Param)
        grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((2, 3))) ** 2))(lin)
        opt.update(lin, grads)
        return lin.kernel[...]

    ref = run(nnx.Optimizer)
    n_ref, calls[:] = len(calls), []
    got = run(jaxaot.nn.Optimizer)
    chex.assert_trees_all_close(got, ref, **TOL)
    assert len(calls) == n_ref


def _grads(model, dtype=jnp.float32):
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((2, m.in_features))) ** 2))(model)
    return jax.tree.map(lambda g: g.astype(dtype), grads)


def test_cache_info_counts_the_updates_compiles_and_says_why():
    """``cache_info()`` as every compiled callable has it: a miss per compile of the update program, with
    the inputs by name, the seconds and the reason; a hit per update that compiled nothing."""
    tx = optax.adam(1e-2)
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    opt = jaxaot.nn.Optimizer(model, tx, wrt=nnx.Param)
    for _ in range(2):
        opt.update(model, _grads(model))
    info = opt.cache_info()
    assert (info.hits, info.misses, info.recompiles) == (1, 1, 0)
    (entry,) = info.entries
    assert entry.reason == "first call" and entry.executables == entry.compiles == ("update",)
    for name in ("params['kernel']: f32[3,2]", "grads['bias']: f32[2]", "opt_state[0].mu['kernel']: f32[3,2]",
                 "opt_state[0].count: i32[]", "step: u32[]"):
        assert name in entry.signature.split(", "), entry.signature
    assert set(entry.times) == {"trace", "compile_update"} and entry.trace_seconds > 0 and entry.xla_seconds > 0

    # Gradients in another dtype: the update compiles again, and says which inputs changed.
    opt.update(model, _grads(model, jnp.bfloat16))
    opt.update(model, _grads(model))  # the first program still serves float32 gradients
    info = opt.cache_info()
    assert (info.hits, info.misses, info.recompiles) == (2, 2, 1)
    assert info.entries[1].reason == ("grads['bias']: dtype float32 → bfloat16; "
                                      "grads['kernel']: dtype float32 → bfloat16"), info.entries[1].reason

    # New parameter shapes in the same optimizer (its state made again for them): against the nearest
    # signature compiled, the float32 one.
    wide = nnx.Linear(5, 2, rngs=nnx.Rngs(1))
    opt.opt_state = jaxaot.nn.Optimizer(wide, tx, wrt=nnx.Param).opt_state
    opt.update(wide, _grads(wide))
    reason = opt.cache_info().entries[2].reason
    assert reason == ("params['kernel']: shape (3, 2) → (5, 2); grads['kernel']: shape (3, 2) → (5, 2); "
                      "opt_state[0].mu['kernel']: shape (3, 2) → (5, 2); "
                      "opt_state[0].nu['kernel']: shape (3, 2) → (5, 2)"), reason
    assert "params['kernel']: f32[5,2]" in opt.cache_info().entries[2].signature
    assert str(opt.cache_info()).startswith("3 compiled, 2 hits")


def test_cache_info_is_per_optimizer_and_the_programs_are_shared():
    """A new model's optimizer reports its own first compile; one more with the same ``tx`` and shapes finds
    that executable (a hit, nothing compiled); traced updates (``nnx.Optimizer.update`` itself) count nothing."""
    tx = optax.sgd(0.1, momentum=0.9)
    small, big = nnx.Linear(3, 2, rngs=nnx.Rngs(0)), nnx.Linear(6, 4, rngs=nnx.Rngs(1))
    first = jaxaot.nn.Optimizer(small, tx, wrt=nnx.Param)
    first.update(small, _grads(small))
    second = jaxaot.nn.Optimizer(big, tx, wrt=nnx.Param)
    second.update(big, _grads(big))
    info = second.cache_info()
    assert (info.hits, info.misses) == (0, 1) and info.entries[0].reason == "first call"
    assert "params['kernel']: f32[6,4]" in info.entries[0].signature
    assert (first.cache_info().hits, first.cache_info().misses) == (0, 1)
    third = jaxaot.nn.Optimizer(nnx.Linear(6, 4, rngs=nnx.Rngs(2)), tx, wrt=nnx.Param)
    third.update(big, _grads(big))
    assert (third.cache_info().hits, third.cache_info().misses, third.cache_info().entries) == (1, 0, ())

    @nnx.jit
    def traced(opt, model, grads):
        opt.update(model, grads)

    traced(first, small, _grads(small))
    assert (first.cache_info().hits, first.cache_info().misses) == (0, 1)


def test_an_optimizer_s_program_goes_with_the_last_optimizer_of_its_transformation():
    """A run that makes a new ``optax`` transformation per optimizer (a sweep of learning rates) keeps no
    compiled update of the optimizers it deleted."""
    import gc
    import weakref

    def train_once(lr):
        model, ref_model = nnx.Linear(3, 2, rngs=nnx.Rngs(0)), nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        tx = optax.adam(lr)
        optimizer = jaxaot.nn.Optimizer(model, tx, wrt=nnx.Param)
        ref = nnx.Optimizer(ref_model, optax.adam(lr), wrt=nnx.Param)
        for _ in range(2):
            optimizer.update(model, _grads(model))
            ref.update(ref_model, _grads(ref_model))
        assert_states_equal(nnx.state(model), nnx.state(ref_model))
        return weakref.ref(tx.update)

    kept = [train_once(lr) for lr in np.random.default_rng().uniform(1e-3, 1e-1, 3)]
    gc.collect()
    assert [k() for k in kept] == [None, None, None]


def test_an_array_assigned_into_the_state_is_compiled_and_written_back_as_flax_does():
    """``opt_state.hyperparams['learning_rate'] = array`` leaves a plain array among the state's Variables;
    the update still runs compiled, and writes the new value into that slot, as ``nnx.Optimizer`` does."""
    rng = np.random.default_rng()
    lr = float(rng.uniform(0.05, 0.5))
    make = lambda: optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(lr, 0.0, 10))  # noqa
    models = [nnx.Linear(3, 2, rngs=nnx.Rngs(1)) for _ in range(2)]
    opts = [jaxaot.nn.Optimizer(models[0], make(), wrt=nnx.Param), nnx.Optimizer(models[1], make(), wrt=nnx.Param)]
    new_lr = jnp.asarray(rng.uniform(1.0, 2.0), jnp.float32)
    for step in range(4):
        for model, opt in zip(models, opts):
            if step == 1:
                opt.opt_state.hyperparams["learning_rate"] = new_lr
            opt.update(model, _grads(model))
        assert_states_equal(nnx.state(models[0]), nnx.state(models[1]))
        assert_states_equal(nnx.state(opts[0].opt_state), nnx.state(opts[1].opt_state))
    assert type(opts[0].opt_state.hyperparams["learning_rate"]) is type(opts[1].opt_state.hyperparams["learning_rate"])
    assert opts[0].cache_info().hits >= 2  # compiled, not Flax's eager update
