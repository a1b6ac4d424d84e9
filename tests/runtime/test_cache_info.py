"""``cache_info()``: what compiled, how long each stage took, and why, in words naming the argument.

The reasons name the argument by parameter name and pytree path and say what
changed (shape, dtype, weak type, sharding, a new or missing argument, a static
value, keyword against position), against the nearest signature compiled; the
same text reaches the ``jaxaot`` logger at INFO level.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot.errors import PartitionError


def _reasons(f):
    return [e.reason for e in f.cache_info().entries]


def test_reasons_name_the_argument_and_say_what_changed():
    f = jaxaot.aot_function(lambda params, x, scale=1.0: jnp.sum(x @ params["w2"]) * scale)
    w = {"w2": jnp.ones((4, 8))}
    f(w, jnp.ones((2, 4)))
    f({"w2": jnp.ones((5, 8))}, jnp.ones((2, 5)))
    f({"w2": jnp.ones((4, 8), jnp.bfloat16)}, jnp.ones((2, 4)))
    f(w, jnp.ones((2, 4)), scale=jnp.float32(2))
    f({"w2": jnp.ones((4, 8)), "b": jnp.ones(8)}, jnp.ones((2, 4)))
    f(w, x=jnp.ones((2, 4)))
    assert _reasons(f) == [
        "first call",
        "params['w2']: shape (4, 8) → (5, 8); x: shape (2, 4) → (2, 5)",
        "params['w2']: dtype float32 → bfloat16",  # nearest: the first signature, not the last
        "new argument scale",
        "params['b'] is new (f32[8])",
        "x is now passed by keyword",
    ]


def test_static_and_weak_type_reasons():
    f = jaxaot.aot_function(lambda x, n: x * n, static_argnums=1)
    f(jnp.ones(3), 3)
    f(jnp.ones(3), 4)
    f(2.0, 4)
    assert _reasons(f) == ["first call", "static argument `n`: 3 → 4",
                           "x: shape (3,) → (), strongly typed → weakly typed (a Python number's type)"]
    assert [e.signature for e in f.cache_info().entries] == ["x: f32[3], n=3", "x: f32[3], n=4", "x: f32[], n=4"]


def test_a_large_static_value_s_reason_shows_where_it_changed():
    """A static value whose repr is long (a model's static half, a config) is shown around its first difference,
    whitespace folded, not cut to a prefix both sides share."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Config:
        names: tuple
        activation: str

    f = jaxaot.aot_function(lambda x, c: jnp.tanh(x) if c.activation == "tanh" else jax.nn.relu(x), static_argnums=1)
    names = tuple(f"layer_{i}" for i in range(20))
    f(jnp.ones(3), Config(names, "tanh"))
    f(jnp.ones(3), Config(names, "relu"))
    reason = _reasons(f)[-1]
    assert reason.startswith("static argument `c`: ...") and "activation='tanh'" in reason, reason
    assert "activation='relu'" in reason.split(" → ")[1] and len(reason) < 240, reason


def test_alternating_signatures_are_described_against_the_nearest():
    f = jaxaot.aot_function(lambda a, b: jnp.sum(a) + jnp.sum(b))
    f(jnp.ones(2), jnp.ones(3))
    f(jnp.ones(2), jnp.ones(4))
    f(jnp.ones(5), jnp.ones(3))
    assert _reasons(f)[2] == "a: shape (2,) → (5,)"  # one leaf from the first signature, two from the last


def test_reasons_go_to_the_jaxaot_logger(caplog):
    f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
    with caplog.at_level(logging.INFO, logger="jaxaot"):
        f(jnp.ones(3))
        f(jnp.ones(4))
    assert "x: shape (3,) → (4,)" in caplog.text and "first call" in caplog.text


def test_entries_report_compiles_and_stage_times():
    f = jaxaot.aot_function(lambda w, x: jnp.sum(jnp.tanh(x @ w)))
    w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    for _ in range(3):
        jax.grad(f, argnums=(0, 1))(w, x)
    f(w, x)
    info = f.cache_info()
    assert (info.hits, info.misses, info.recompiles, info.compiles, info.duplicates) == (3, 1, 0, 3, ())
    (e,) = info.entries
    assert e.executables == ("forward", "backward", "inference") and e.compiles == e.executables
    assert e.variants == () and e.duplicates == ()
    assert e.trace_seconds > 0 and e.partition_seconds > 0 and e.xla_seconds > 0
    assert {"trace", "joint", "partition", "compile_forward", "compile_backward", "compile_inference"} <= set(e.times)
    assert "first call" in str(info) and "XLA" in str(info)


def test_combine_labels_each_program():
    f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
    f(jnp.ones(3))
    f(jnp.ones(3))
    both = jaxaot.CacheInfo.combine({"call": f.cache_info(), "loss": f.cache_info()})
    assert (both.hits, both.misses, both.recompiles) == (2, 2, 0)
    assert [e.program for e in both.entries] == ["call", "loss"]


def test_a_partitioner_returning_no_partition_is_a_partition_error_naming_it():
    def no_plan(joint):
        return None

    f = jaxaot.aot_function(lambda x: jnp.sin(x).sum(), partition_fn=no_plan)
    with pytest.raises(PartitionError, match="partition_fn .*no_plan returned a NoneType, not a jaxaot.partition.Partition"):
        jax.grad(f)(jnp.ones(3))
    with pytest.raises(PartitionError, match="no_plan"):  # nothing half-built was kept
        jax.grad(f)(jnp.ones(3))
    assert float(f(jnp.ones(3))) == pytest.approx(3 * 0.84147096)  # inference needs no partition


# --------------------------------------------------------------------------- every callable jaxaot returns
def _loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


W, X = jnp.ones((3, 2)), jnp.ones((4, 3))


def _function():
    f = jaxaot.aot_function(_loss)
    return f, lambda: jax.grad(f)(W, X)


def _value_and_grad():
    vg = jaxaot.value_and_grad(jaxaot.aot_function(_loss), argnums=(0, 1))
    return vg, lambda: vg(W, X)


def _grad():
    g = jaxaot.grad(jaxaot.aot_function(_loss))
    return g, lambda: g(W, X)


def _module_loss():
    from flax import nnx

    model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    vg = jaxaot.value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))
    return vg, lambda: vg(model, X)


def _linen():
    from flax import linen as nn

    dense = nn.Dense(2)
    variables = dense.init(jax.random.key(0), X)
    m = jaxaot.nn.aot_module(dense)
    return m, lambda: m.apply(variables, X)


def _compiled_grad():
    g = jaxaot.compiled_grad(_loss)
    return g, lambda: g(W, X)


def _compiled_value_and_grad():
    vg = jaxaot.compiled_value_and_grad(lambda w, x: _loss(w, x) * 3.0)
    return vg, lambda: vg(W, X)


def _pipeline():
    from jaxaot._src.parallel.training_pipeline import pipeline

    # the compiled executor: two stages interleaved on one device (any device count has one)
    step = pipeline([lambda w, x: jnp.tanh(x @ w)] * 2, lambda y, t: jnp.mean((y - t) ** 2),
                    schedule="interleaved", num_microbatches=2, devices=[jax.devices()[0]])
    return step, lambda: step([jnp.eye(3), jnp.eye(3)], X, jnp.zeros((4, 3)))


def _python_pipeline():
    from jaxaot._src.parallel.training_pipeline import pipeline

    step = pipeline([lambda w, x: jnp.tanh(x @ w)] * 2, lambda y, t: jnp.mean((y - t) ** 2), schedule="1f1b",
                    num_microbatches=2, devices=[jax.devices()[0]] * 2, executor="python")
    return step, lambda: step([jnp.eye(3), jnp.eye(3)], X, jnp.zeros((4, 3)))


def _loaded():
    f = jaxaot.export.load(jaxaot.export.export(_loss, W, X))
    return f, lambda: jax.value_and_grad(f)(W, X)


@pytest.mark.parametrize("build", [_function, _value_and_grad, _grad, _module_loss, _linen, _compiled_grad,
                                   _compiled_value_and_grad, _pipeline, _python_pipeline, _loaded],
                         ids=lambda b: b.__name__[1:])
def test_every_callable_reports_what_it_compiled(build):
    """Every entry names what it compiled; a compiled pipeline's stages are traced and partitioned, then
    inlined into its one ``pipeline_step`` executable (the ``step`` entry), so they compile nothing of their own."""
    from jaxaot._src.parallel.training_pipeline import Pipeline

    jaxaot.compiled_autograd.reset()
    obj, call = build()
    for _ in range(3):
        call()
    info = obj.cache_info()
    assert info.misses >= 1 and info.hits >= 2, info
    assert info.entries and info.duplicates == ()
    first = {}
    for e in info.entries:
        first.setdefault(e.program, e)
        inlined = isinstance(obj, Pipeline) and obj.executor == "compiled" and e.program.startswith("stage")
        assert e.signature and (e.executables or inlined) and set(e.executables) <= set(e.compiles), e
    assert all(e.reason.endswith("first call") or "first call (" in e.reason for e in first.values()), info


def test_a_plain_function_s_gradient_compiles_nothing_of_its_own():
    vg = jaxaot.value_and_grad(_loss)
    vg(W, X)
    assert vg.cache_info() == jaxaot.CacheInfo(0, 0, ())


def test_fifty_steps_of_an_aot_module_show_the_loss_program():
    from flax import nnx
    import optax

    model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    optimizer = jaxaot.nn.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    loss_fn = lambda m, x: jnp.sum(m(x) ** 2)  # noqa: E731
    for _ in range(50):
        _, grads = jaxaot.value_and_grad(loss_fn)(model, X)
        optimizer.update(model, grads)
    info = model.cache_info()
    assert (info.hits, info.misses) == (49, 1)
    (entry,) = info.entries
    # the step that runs: the fused one, or (where the first call timed the two on an accelerator) the split
    runs = "fused[0,1]" if any("fused[0,1]" in e for e in entry.executables) else "forward[0,1]"
    assert entry.program == "loss" and entry.reason == "first call" and runs in entry.executables[0]


def test_under_jit_an_aot_function_compiles_nothing_of_its_own():
    """Traced into ``jit``'s program, the forward and backward are evaluated there: no executable of their own."""
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    f = jaxaot.aot_function(loss)
    w, x = jax.random.normal(jax.random.key(0), (4, 3)), jax.random.normal(jax.random.key(1), (5, 4))
    got = jax.jit(jax.value_and_grad(f))(w, x), jax.jit(jax.grad(f, argnums=1))(w, x), jax.jit(f)(w, x)
    want = jax.value_and_grad(loss)(w, x), jax.grad(loss, argnums=1)(w, x), loss(w, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [(e.executables, e.compiles) for e in f.cache_info().entries] == [((), ())]
