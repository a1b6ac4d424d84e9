"""aot_module / aot_export_module on Flax (nnx and linen), and side effects.

Training runs compare jaxaot step by step against eager Flax; the effect tests
record callbacks into a list and check counts and order per call.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.experimental import io_callback

import jaxaot
from jaxaot import _compat as C
from flax_models import batch, linen_model, nnx_model, xent

TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 20


def keyless(tree):
    """``tree`` with typed PRNG keys replaced by their raw data, for comparisons."""

    def f(x):
        if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree.map(f, tree)


def assert_states_equal(a, b, **tol):
    chex.assert_trees_all_close(keyless(a), keyless(b), **(tol or TOL))


# --------------------------------------------------------------------------- small modules
class Block(nnx.Module):
    """Linear -> BatchNorm -> Dropout, plus a user Variable counting calls."""

    def __init__(self, seed: int = 0):
        rngs = nnx.Rngs(params=seed, dropout=seed + 1)
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        return self.drop(self.bn(self.lin(x)))


X = jnp.arange(12.0).reshape(4, 3) / 10


def block_loss(m, x):
    return (m(x) ** 2).mean()


# --------------------------------------------------------------------------- nnx training
def nnx_train(name: str, aot: bool):
    model = nnx_model(name)
    m = jaxaot.aot_module(model) if aot else model
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

    def loss_fn(mm, x, y):
        return xent(mm(x), y)

    losses = []
    for step in range(STEPS):
        x, y = batch(name, step)
        loss, grads = nnx.value_and_grad(loss_fn)(m, x, y)
        opt.update(m, grads)
        losses.append(loss)
    return jnp.stack(losses), nnx.state(model), m


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_nnx_training_matches_eager(name):
    ref_losses, ref_state, _ = nnx_train(name, aot=False)
    losses, state, aot_model = nnx_train(name, aot=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    assert_states_equal(state, ref_state)  # parameters, batch statistics, RNG counts
    # Training built only the forward and backward executables, once.
    (entry,) = aot_model.cache_info().entries
    assert all(e.startswith(("forward", "backward")) for e in entry.executables), entry.executables


# --------------------------------------------------------------------------- linen training
def linen_train(name: str, aot: bool):
    module = linen_model(name)
    x0, _ = batch(name, 0)
    variables = module.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x0, train=False)
    apply = jaxaot.aot_module(module, static_argnames="train").apply if aot else module.apply
    params, others = variables["params"], {k: v for k, v in variables.items() if k != "params"}
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    def loss_fn(params, others, x, y, key):
        logits, updates = apply({"params": params, **others}, x, train=True, mutable=list(others),
                                rngs={"dropout": key})
        return xent(logits, y), updates

    losses = []
    for step in range(STEPS):
        x, y = batch(name, step)
        (loss, others), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, others, x, y, jax.random.fold_in(jax.random.key(7), step))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        losses.append(loss)
    return jnp.stack(losses), {"params": params, **others}


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_linen_training_matches_eager(name):
    ref_losses, ref_vars = linen_train(name, aot=False)
    losses, variables = linen_train(name, aot=True)
    chex.assert_trees_all_close(losses, ref_losses, **TOL)
    chex.assert_trees_all_close(variables, ref_vars, **TOL)


# --------------------------------------------------------------------------- state write-back
def test_state_after_one_call_equals_eager():
    ref, model = Block(), Block()
    aot = jaxaot.aot_module(model)
    chex.assert_trees_all_close(aot(X), ref(X), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))
    assert int(model.calls[...]) == 1 and int(model.drop.rngs.count[...]) == 1
    # And again: the second call starts from the written-back state.
    chex.assert_trees_all_close(aot(X), ref(X), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))


def test_eval_mode_leaves_batch_stats_unchanged():
    model = Block()
    aot = jaxaot.aot_module(model)
    aot(X)  # one training call so the statistics are not the initial ones
    aot.eval()
    before = nnx.state(model, nnx.BatchStat)
    mean = model.bn.mean.get_value()
    y = aot(X)
    assert model.bn.mean.get_value() is mean  # not even a round trip
    assert_states_equal(nnx.state(model, nnx.BatchStat), before)
    ref = Block()
    ref(X)
    ref.eval()
    chex.assert_trees_all_close(y, ref(X), **TOL)
    # Eval mode is another graphdef: its own entry, inference only.
    assert aot.cache_info().entries[-1].executables == ("inference",)


def test_eval_mode_linen_returns_inputs():
    module = linen_model("cnn")
    x, _ = batch("cnn", 0)
    variables = module.init(jax.random.key(0), x, train=False)
    aot = jaxaot.aot_module(module, static_argnames="train")
    out, updates = aot.apply(variables, x, train=False, mutable=["batch_stats"])
    ref_out, ref_updates = module.apply(variables, x, train=False, mutable=["batch_stats"])
    chex.assert_trees_all_close(out, ref_out, **TOL)
    assert jax.tree.structure(updates) == jax.tree.structure(ref_updates)
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(variables["batch_stats"])):
        assert a is b  # unchanged statistics come back without a round trip


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside")
def test_sow_creates_state_like_eager():
    class Sower(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

        def __call__(self, x):
            y = self.lin(x)
            self.sow(nnx.Intermediate, "hidden", y)
            return y.sum()

    ref, model = Sower(), Sower()
    ref(X)
    jaxaot.aot_module(model)(X)
    assert_states_equal(nnx.state(model), nnx.state(ref))


def test_inference_only_builds_inference_executable():
    model = Block()
    model.eval()
    aot = jaxaot.aot_module(model)
    for _ in range(3):
        aot(X)
    info = aot.cache_info()
    assert info.misses == 1 and info.hits == 2
    assert info.entries[0].executables == ("inference",)


def test_nnx_grad_and_jax_grad_over_split_state():
    ref, model = Block(), Block()
    aot = jaxaot.aot_module(model)
    g_ref = nnx.grad(block_loss)(ref, X)
    g = nnx.grad(block_loss)(aot, X)
    chex.assert_trees_all_close(g["module"], g_ref, **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))

    def split_loss(graphdef, params, rest):
        m = nnx.merge(graphdef, params, rest, copy=True)  # fresh Variables: this trace may mutate them
        return block_loss(m, X), nnx.state(m, nnx.Not(nnx.Param))

    gd_ref, p_ref, r_ref = nnx.split(ref, nnx.Param, ...)
    gd, p, r = nnx.split(aot, nnx.Param, ...)
    (l_ref, s_ref), g_ref = jax.value_and_grad(split_loss, argnums=1, has_aux=True)(gd_ref, p_ref, r_ref)
    (l, s), g = jax.value_and_grad(split_loss, argnums=1, has_aux=True)(gd, p, r)
    chex.assert_trees_all_close(l, l_ref, **TOL)
    chex.assert_trees_all_close(g["module"], g_ref, **TOL)
    assert_states_equal(s["module"], s_ref)


def test_train_step_under_nnx_jit():
    ref, model = Block(), Block()
    aot = jaxaot.aot_module(model)

    def make_step(m):
        opt = nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param)

        @nnx.jit
        def step(m, opt, x):
            loss, grads = nnx.value_and_grad(block_loss)(m, x)
            opt.update(m, grads)
            return loss

        return lambda: step(m, opt, X)

    step_ref, step = make_step(ref), make_step(aot)
    for _ in range(3):
        chex.assert_trees_all_close(step(), step_ref(), **TOL)
    assert_states_equal(nnx.state(model), nnx.state(ref))


def test_custom_method_and_static_argnames():
    class Scaled(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            self.count = nnx.BatchStat(jnp.zeros(()))

        def score(self, x, *, double: bool):
            self.count[...] += 1.0
            return self.lin(x) * (2.0 if double else 1.0)

    ref, model = Scaled(), Scaled()
    aot = jaxaot.aot_module(model, method="score", static_argnames="double")
    chex.assert_trees_all_close(aot(X, double=True), ref.score(X, double=True), **TOL)
    chex.assert_trees_all_close(aot(X, double=False), ref.score(X, double=False), **TOL)
    assert float(model.count[...]) == 2.0
    assert aot.cache_info().misses == 2


# --------------------------------------------------------------------------- call metadata
def test_call_metadata_of_a_training_call():
    lowered = jaxaot.aot_module(Block()).lower(X)
    meta = lowered.meta
    kinds = {i.name: (i.kind, i.differentiable, i.mutated) for i in meta.inputs}
    assert kinds["lin.kernel"] == ("parameter", True, False)
    assert kinds["bn.mean"] == ("state", False, True)
    assert kinds["drop.rngs.count"] == ("state", False, True)
    assert kinds["drop.rngs.key"] == ("state", False, False)
    assert kinds["calls"] == ("state", False, True)
    assert kinds["arg[0]"] == ("user_input", True, False)
    user, *state = meta.outputs
    assert (user.kind, user.takes_cotangent, user.is_input) == ("user_output", True, None)
    assert {o.name for o in state} == {"bn.mean", "bn.var", "drop.rngs.count", "calls"}
    for o in state:
        assert o.kind == "mutated_state" and not o.takes_cotangent
        assert meta.inputs[o.mutates].name == o.name
    assert "mutated_state" in str(meta)
    # The runtime agrees: the backward takes the user output's cotangent only,
    # and computes gradients for the parameters and the input only.
    assert lowered.lowered.partition.cotangent_outputs == (0,)
    differentiable = tuple(i for i, x in enumerate(meta.inputs) if x.differentiable)
    assert lowered.lowered.partition.grad_inputs == differentiable


def test_call_metadata_aliases_and_duplicates():
    class Aliases(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(3))
            self.a = nnx.BatchStat(jnp.zeros(3))
            self.b = nnx.BatchStat(jnp.ones(3))

        def __call__(self, x):
            self.a[...] = self.b[...]  # a state update that is another input
            y = x * self.w[...]
            return x, y, y, self.w[...]

    model = Aliases()
    aot = jaxaot.aot_module(model)
    meta = aot.lower(jnp.ones(3)).meta
    names = [i.name for i in meta.inputs]
    x_out, y, y_dup, w_out = meta.outputs
    assert names[x_out.is_input] == "arg[0]" and names[w_out.is_input] == "w"
    assert y.duplicate_of is None and y_dup.duplicate_of == 1
    assert meta.inputs[names.index("a")].mutated and not meta.inputs[names.index("b")].mutated
    assert meta.num_mutated_state_outputs == 0  # a's new value is b itself: no output
    x = jnp.full(3, 2.0)
    outs = aot(x)
    assert outs[0] is x
    assert model.a.get_value() is model.b.get_value()


# --------------------------------------------------------------------------- export
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
    jaxpr, sig = jaxaot.aot_export_module(LossNet(), (X, Y), trace_joint=False)
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
    jaxpr, sig = jaxaot.aot_export_module(model, (X, Y), trace_joint=True, output_loss_index=0)
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
    _, sig = jaxaot.aot_export_module(LossNet(), (X, Y), trace_joint=True, output_loss_index=0,
                                      grad_user_inputs=True)
    assert sig.backward_signature.gradients_to_user_inputs == {"out9": "in8", "out10": "in9"}


def test_export_linen_signature():
    module = linen_model("cnn")
    x, _ = batch("cnn", 0)
    variables = module.init(jax.random.key(0), x, train=False)
    _, sig = jaxaot.aot_export_module(module, (x,), kwargs={"train": True}, variables=variables,
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
    with pytest.raises(jaxaot.LossOutputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jaxaot.aot_export_module(LossNet(), (X, Y), trace_joint=True, **kwargs)


def test_export_non_scalar_loss_and_loss_without_parameters():
    class Bad(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.lin(x), (x**2).sum()

    with pytest.raises(jaxaot.LossOutputError, match=r"to be a scalar, but it has shape \(4, 2\)"):
        jaxaot.aot_export_module(Bad(), (X,), trace_joint=True, output_loss_index=0)
    with pytest.raises(jaxaot.LossOutputError, match="the output at index 0 requires gradients"):
        jaxaot.aot_export_module(Bad(), (X,), trace_joint=True, output_loss_index=1)

    class Detached(Bad):
        def __call__(self, x):
            return jax.lax.stop_gradient(self.lin(x)), (x**2).sum()

    with pytest.raises(jaxaot.LossOutputError, match="was marked as the loss, but it does not require gradients"):
        jaxaot.aot_export_module(Detached(), (X,), trace_joint=True, output_loss_index=1)


# --------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_documented_errors():
    with pytest.raises(jaxaot.InvalidInputError, match="expects a flax.nnx.Module or a flax.linen.Module"):
        jaxaot.aot_module(lambda x: x)
    with pytest.raises(jaxaot.InvalidInputError, match="has no method 'nope'"):
        jaxaot.aot_module(Block(), method="nope")
    with pytest.raises(jaxaot.InvalidInputError, match="static_argnums must be non-negative"):
        jaxaot.aot_module(Block(), static_argnums=-1)
    aot = jaxaot.aot_module(Block(), static_argnums=1)
    with pytest.raises(jaxaot.InvalidInputError, match="not hashable"):
        aot(X, [1, 2])
    with pytest.raises(jaxaot.InvalidInputError, match="called with 1 positional"):
        aot(X)
    with pytest.raises(jaxaot.InvalidInputError, match="arg\\[0\\] is a Linear"):
        jaxaot.aot_module(Block())(nnx.Linear(3, 3, rngs=nnx.Rngs(0)))
    with pytest.raises(jaxaot.InvalidInputError, match="variables mapping"):
        jaxaot.aot_module(linen_model("cnn")).apply([1, 2], X)
    with pytest.raises(jaxaot.InvalidInputError, match="needs its variables"):
        jaxaot.aot_export_module(linen_model("cnn"), (X,), trace_joint=False)


# --------------------------------------------------------------------------- side effects
class Recorder:
    """Callbacks that append to one list; ``take()`` returns and clears it."""

    def __init__(self):
        self.log: list[str] = []

    def __call__(self, tag: str):
        def cb(*_):
            self.log.append(tag)

        return cb

    def take(self) -> list[str]:
        jax.effects_barrier()
        out, self.log = self.log, []
        return out


def effectful(rec: Recorder):
    """``x -> scalar`` with ordered forward effects and a callback in a custom_vjp backward."""

    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    def sin_fwd(x):
        return jnp.sin(x), x

    def sin_bwd(x, ct):
        jax.debug.callback(rec("bwd"), ct, ordered=True)
        return (ct * jnp.cos(x),)

    sin.defvjp(sin_fwd, sin_bwd)

    def f(x):
        jax.debug.callback(rec("a"), x, ordered=True)
        y = sin(x) * 2
        io_callback(rec("io"), None, jax.lax.stop_gradient(y), ordered=True)
        jax.debug.print("{}", y.sum(), ordered=True)
        jax.debug.callback(rec("b"), y)  # unordered: counted, not ordered
        return y.sum()

    return f


FWD = ["a", "io", "b"]


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_effects_once_per_call_aot_function(mode, capsys):
    rec = Recorder()
    f = effectful(rec)
    aot = jaxaot.aot_function(f)
    x = jnp.arange(3.0)
    wrap = jax.jit if mode == "jit" else (lambda g: g)
    for _ in range(2):  # the second call hits the cache
        wrap(aot)(x)
        log = rec.take()
        assert sorted(log) == sorted(FWD) and [t for t in log if t != "b"] == ["a", "io"]
        jax.grad(aot)(x) if mode == "eager" else jax.jit(jax.grad(aot))(x)
        log = rec.take()
        assert sorted(log) == sorted(FWD + ["bwd"])
        # JAX orders each kind of ordered effect, not different kinds relative to each other
        # (the H100 ran "io" before "a"): forward effects come before the backward's.
        assert log.index("a") < log.index("bwd") and log.index("io") < log.index("bwd")
    assert capsys.readouterr().out.count("\n") == 4  # jax.debug.print: once per call


def test_effects_forward_and_backward_api():
    rec = Recorder()
    aot = jaxaot.aot_function(effectful(rec))
    y, res = aot.forward(jnp.arange(3.0))
    assert sorted(rec.take()) == sorted(FWD)
    aot.backward(res, jnp.float32(1.0))
    aot.backward(res, jnp.float32(1.0))
    assert rec.take() == ["bwd", "bwd"]  # once per backward, never the forward's


def test_effects_never_recomputed_by_a_remat_partitioner():
    rec = Recorder()
    aot = jaxaot.aot_function(effectful(rec), partition_fn=jaxaot.min_cut_rematerialization_partition)
    jax.grad(aot)(jnp.arange(3.0))
    assert sorted(rec.take()) == sorted(FWD + ["bwd"])


class Effectful(nnx.Module):
    def __init__(self, rec: Recorder):
        self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(3, rngs=nnx.Rngs(0))
        self.f = effectful(rec)

    def __call__(self, x):
        return self.f(self.bn(self.lin(x)))


def test_effects_once_per_call_aot_module():
    rec = Recorder()
    aot = jaxaot.aot_module(Effectful(rec))
    for _ in range(2):
        aot(X)
        assert sorted(rec.take()) == sorted(FWD)
        nnx.grad(lambda m: m(X))(aot)
        log = rec.take()
        assert sorted(log) == sorted(FWD + ["bwd"])
        # JAX orders each kind of ordered effect, not different kinds relative to each other
        # (the H100 ran "io" before "a"): forward effects come before the backward's.
        assert log.index("a") < log.index("bwd") and log.index("io") < log.index("bwd")
        nnx.jit(lambda m: nnx.grad(lambda m: m(X))(m))(aot)
        assert sorted(rec.take()) == sorted(FWD + ["bwd"])


def test_typed_key_inputs():
    # nnx keeps RngKey state as typed keys; the runtime takes them as is.
    aot = jaxaot.aot_function(lambda k, x: jax.random.normal(k, x.shape) + x)
    k = jax.random.key(0)
    chex.assert_trees_all_close(aot(k, jnp.ones(3)), jax.random.normal(k, (3,)) + 1)


def test_flax_loads_only_when_a_module_api_is_used():
    import subprocess
    import sys

    from zoo import child_env

    code = ("import sys, jaxaot; assert 'flax' not in sys.modules, 'import jaxaot imported flax'; "
            "jaxaot.aot_module; assert 'flax' in sys.modules; from jaxaot import GraphSignature")
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=300)
