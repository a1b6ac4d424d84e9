"""Order-free reductions the fused step's backward derives again (jaxaot._src.partition.step.rederive)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import zoo
from jaxaot._src import compat as C
from jaxaot._src.fusion import fused_program
from jaxaot._src.partition.step import rederive_backward
from jaxaot._src.partition.step.rederive import ORDER_FREE
from platforms import layouts_chosen
from zoo import assert_trees_close, backward_inputs, kept_step
from zoo_models import MODELS

_KEY = jax.random.key(20261126 + 7)


def _key(*parts):
    return jax.random.fold_in(_KEY, hash(parts) % 100_003)


def _partition(fn, args, budget=1.0):
    return jaxaot.partition.min_cut_rematerialization_partition(jaxaot.partition.trace_joint(fn, *args), memory_budget=budget)


def _same_backward(part, lean, args, key):
    """The lean backward on the kept residuals gives the partition's backward's values, bit for bit."""
    cts, residuals = backward_inputs(part, args, key)
    want = C.eval_closed(part.backward, *cts, *residuals)
    got = C.eval_closed(lean.backward, *cts, *[residuals[k] for k in lean.kept])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _attention(wq, wk, wv, x):
    """The loss also reads the scores (an entropy-like term), so saving the scores with the row
    statistics is cheaper than saving the scores and the probabilities."""
    q, k, v = (x @ w for w in (wq, wk, wv))
    s = q @ k.T / np.sqrt(q.shape[-1])
    p = jax.nn.softmax(s, axis=-1)
    return jnp.sum(jnp.tanh(p @ v) ** 2) + jnp.sum(p * s)


def _attention_args(key, n=16, d=8):
    ks = jax.random.split(key, 4)
    return (*(jax.random.normal(k, (d, d)) / 3 for k in ks[:3]), jax.random.normal(ks[3], (n, d)))


def test_a_softmax_row_max_is_derived_again_and_the_backward_is_unchanged():
    args = _attention_args(_key("softmax"))
    part = _partition(_attention, args)
    maxes = [i for i, r in enumerate(part.residuals) if r.producer == "reduce_max"]
    assert maxes, [str(r) for r in part.residuals]  # the plan saves the row max (and the row sum)
    lean = rederive_backward(part, len(part.cotangent_outputs))
    assert lean.rederived == tuple(maxes)
    assert lean.kept == tuple(i for i in range(len(part.residuals)) if i not in maxes)
    C.check_jaxpr(lean.backward)
    bwd = C.jaxpr_of(lean.backward)
    assert len(bwd.invars) == len(part.cotangent_outputs) + len(lean.kept)
    assert sum(e.primitive.name == "reduce_max" for e in bwd.eqns) == len(maxes)
    _same_backward(part, lean, args, _key("softmax", 1))


def test_sums_and_unreachable_operands_are_left_alone():
    def normalized(w, x):  # a sum is not order-free: it stays a residual
        s = jnp.exp(x @ w)
        return jnp.sum(jnp.tanh(s / jnp.sum(s, axis=1, keepdims=True)))

    args = (jax.random.normal(_key("sum"), (4, 8)), jax.random.normal(_key("sum", 1), (6, 4)))
    part = _partition(normalized, args)
    assert any(r.producer == "reduce_sum" for r in part.residuals)
    lean = rederive_backward(part, 1)
    assert lean.rederived == () and lean.backward is part.backward

    def shifted(w, x):  # the max's operand is a matmul the backward neither has nor recomputes
        m = jax.lax.stop_gradient(jnp.max(x @ w, axis=0))
        return jnp.sum(jnp.sin(2.0 * x[:, :, None] - m))

    part = _partition(shifted, args)
    assert any(r.producer == "reduce_max" for r in part.residuals)
    assert rederive_backward(part, 1).rederived == ()


def test_a_chain_through_cheap_eqns_is_derived_and_a_shared_operand_stays():
    def two_maxes(w, x):  # both maxes read the same saved matmul output, through cheap eqns
        s = x @ w
        m1 = jnp.max(jnp.sin(s) * 2.0, axis=1, keepdims=True)
        m2 = jnp.min(s, axis=0, keepdims=True)
        return jnp.sum(jnp.exp(jnp.sin(s) - jax.lax.stop_gradient(m1)) * jnp.cos(s - m2))

    args = (jax.random.normal(_key("chain"), (4, 32)), jax.random.normal(_key("chain", 1), (8, 4)))
    part = _partition(two_maxes, args)
    lean = rederive_backward(part, 1)
    producers = [part.residuals[k].producer for k in lean.rederived]
    assert producers and set(producers) <= ORDER_FREE
    assert all(part.residuals[k].producer not in ORDER_FREE for k in lean.kept)
    assert any(part.residuals[k].producer == "dot_general" for k in lean.kept)  # the shared operand
    _same_backward(part, lean, args, _key("chain", 2))


@pytest.mark.parametrize("budget", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_backwards_are_unchanged(name, budget):
    fn, make_args = zoo.ZOO[name]
    key = _key(name, budget)
    args = make_args(key)
    loss = lambda *a: sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    part = _partition(loss, args, budget)
    lean = rederive_backward(part, len(part.cotangent_outputs))
    assert set(lean.kept) | set(lean.rederived) == set(range(len(part.residuals)))
    _same_backward(part, lean, args, key)


@pytest.mark.parametrize("budget", [0.5, 1.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_fused_steps_that_derive_again_equal_jax(name, budget):
    model = MODELS[name]
    args = model.make_args(_key(name, budget, "model"))
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(model.loss, partition_fn=pf)
    tr = f.lookup(args, {}).programs.training()
    got = C.eval_closed(fused_program(tr, rederive=True), *jax.tree.leaves(args))
    value, grads = jax.value_and_grad(model.loss, argnums=model.argnums)(*args)
    tol = dict(rtol=5e-2, atol=5e-2) if "gpt2" in name else dict(rtol=2e-4, atol=2e-5)  # bf16 blocks
    assert_trees_close(got, [value, *jax.tree.leaves(grads)][: len(got)], **tol)


def test_the_gpt2_blocks_of_the_zoo_derive_their_row_max():
    # bfloat16 scores under a float32 softmax: the plan saves the scores with the row statistics.
    found = {}
    for name, model in MODELS.items():
        part = _partition(model.loss, model.make_args(_key(name)))
        found[name] = [part.residuals[k].producer for k in rederive_backward(part, 1).rederived]
    assert all(found[name] for name in ("gpt2_block_2h", "gpt2_block_8h", "issue_block")), found
    assert all(set(p) <= ORDER_FREE for p in found.values())


@pytest.mark.parametrize("choice", [True, False, "measured"])
def test_the_choice_on_an_accelerator_keeps_one_correct_executable(monkeypatch, choice):
    # CPU stands in for an accelerator: the step deriving the max again compiles too, one is kept.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    seen, real = [], variants.choose_rederive

    def rule(peak, lean_peak):
        seen.append((peak, lean_peak))
        return real(peak, lean_peak) if choice == "measured" else choice

    monkeypatch.setattr(variants, "choose_rederive", rule)
    args = _attention_args(_key("choice", str(choice)))
    f = jaxaot.aot_function(_attention, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    argnums = tuple(range(len(args)))
    want = jax.value_and_grad(_attention, argnums=argnums)(*args)
    assert_trees_close(jaxaot.value_and_grad(f, argnums=argnums)(*args), want, rtol=1e-4, atol=1e-5)
    only = kept_step(f, args)  # the choices the calls after the first make (jaxaot.config.tune_in_background)
    assert len(seen) == 1
    assert_trees_close(jaxaot.value_and_grad(f, argnums=argnums)(*args), want, rtol=1e-4, atol=1e-5)  # the kept one
    kept = real(*seen[0]) if choice == "measured" else choice
    assert bool(only.rederived) == kept and (only.order == "xla" or not kept)
    assert all("reduce_max" in r for r in only.rederived)
    (info,) = f.cache_info().entries[0].fused
    assert info == only


def test_choose_rederive_rule():
    from jaxaot._src.fusion.variants import REDERIVE_PEAK_GAIN, choose_rederive

    assert not choose_rederive(10_000, 10_000)
    assert not choose_rederive(10_000, int(10_000 * (1 - REDERIVE_PEAK_GAIN / 2)))
    assert choose_rederive(10_000, int(10_000 * (1 - 2 * REDERIVE_PEAK_GAIN)))
    assert not choose_rederive(None, 5) and not choose_rederive(5, None)
