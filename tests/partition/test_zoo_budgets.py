"""The broader zoo under every partitioner and memory budget: jaxaot equals JAX.

For each model of ``tests/zoo_models.py`` (Llama block, GPT-2 blocks in bf16,
top-2 MoE, ViT block, ConvNet with batch norm, GRU by ``lax.scan``, the
12-layer scanned GPT, the demo transformer block), on fresh random inputs:

* ``jaxaot.value_and_grad(aot_function(loss, partition_fn=...))`` equals
  ``jax.value_and_grad(loss)`` and ``f.forward``/``f.backward`` equal
  ``jax.vjp``, under ``default_partition`` and the min-cut at budgets
  0, 0.25, 0.5, 0.95 and 1. float32 models compare at float32 tolerances;
  bf16 models against JAX's own bf16 answer, per leaf in relative L2 norm,
  at a few bf16 roundings (where jaxaot saves a bf16 value that JAX's fused
  program kept in float32, or the reverse, the answers differ by about as
  much as either differs from float32);
* the saved bytes never decrease as the budget grows, and budget 1 never
  saves more than the default partition.

The full model x partition cross product of the gradient checks is long (one
compile each): every model runs here with one partition (the partitions
rotate over the models, so all are covered) and ``FULL`` with all of them;
the rest is marked ``slow`` (``python -m pytest -m slow tests/partition/test_zoo_budgets.py``).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from platforms import layouts_chosen
from zoo import assert_trees_close, kept_step
from zoo_models import MODELS

#: The partitions under test: ``None`` is ``default_partition``, a number the min-cut's memory_budget.
PARTITIONS: tuple[float | None, ...] = (None, 0.0, 0.25, 0.5, 0.95, 1.0)
#: Budgets of the monotonicity sweep (finer than the gradient checks: no compile needed).
SWEEP = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
#: Models checked under every partition outside the slow set (each compile costs seconds on 2 cores;
#: the bf16 models meet budgets 0, 0.25 and 0.5 on the diagonal, all of them under ``-m slow``).
FULL = ("llama_block",)

F32_TOL = dict(rtol=5e-5, atol=1e-5)
#: bf16: relative L2 error per gradient leaf, and of the loss, against JAX's bf16 answer.
BF16_LEAF_RTOL = 4e-2
BF16_VALUE_RTOL = 1e-2

_seed = itertools.count(16_000)


def fresh_key() -> jax.Array:
    """A new key per call and per process (random inputs differ from run to run)."""
    return jax.random.key(next(_seed) + np.random.randint(1 << 20))


def partition_fn(budget: float | None) -> Callable:
    """``default_partition`` for ``None``, else the min-cut at ``memory_budget=budget``."""
    if budget is None:
        return jaxaot.partition.default_partition
    return functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)


def _label(budget: float | None) -> str:
    return "default" if budget is None else f"min-cut-{budget}"


def _cases() -> list:
    """(model, partition) pairs: the diagonal and ``FULL`` fast, the rest ``slow``."""
    cases = []
    for i, name in enumerate(MODELS):
        fast = PARTITIONS[i % len(PARTITIONS)]
        for budget in PARTITIONS:
            marks = () if name in FULL or budget == fast else (pytest.mark.slow,)
            cases.append(pytest.param(name, budget, marks=marks, id=f"{name}-{_label(budget)}"))
    return cases


# --------------------------------------------------------------------------- references
def _split(model: Any, args: tuple) -> tuple[Callable, tuple]:
    """The loss as a function of the differentiated arguments only, and those arguments."""

    def of_floats(*floats):
        full = list(args)
        for i, a in zip(model.argnums, floats):
            full[i] = a
        return model.loss(*full)

    return of_floats, tuple(args[i] for i in model.argnums)


@functools.lru_cache(maxsize=None)
def reference(name: str) -> tuple[tuple, Any, Any, Any, Any]:
    """``(args, value, grads, cotangent, vjp_grads)`` of model ``name`` on fresh inputs, from JAX.

    One compiled program computes ``jax.vjp`` and pulls it back with a
    cotangent of one (``jax.value_and_grad``) and with a random one; cached per
    process, so each model compiles it once.
    """
    model = MODELS[name]
    key_args, key_ct = jax.random.split(fresh_key())
    args = model.make_args(key_args)
    ct = jax.random.normal(key_ct, (), jnp.float32)

    @jax.jit
    def ref(args, ct):
        # jax.value_and_grad is jax.vjp pulled back with a cotangent of one: one forward serves both.
        of_floats, floats = _split(model, args)
        value, vjp = jax.vjp(of_floats, *floats)
        return value, vjp(jnp.ones_like(value)), vjp(ct)

    value, grads, vjp_grads = ref(args, ct)
    return args, value, grads, ct, vjp_grads


def _rel_l2(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_close(model: Any, actual: Any, expected: Any, what: str) -> None:
    """float32: elementwise tolerances; bf16: relative L2 error per leaf."""
    if model.dtype == jnp.float32:
        assert_trees_close(actual, expected, **F32_TOL)
        return
    la, ta = jax.tree_util.tree_flatten(actual)
    le, te = jax.tree_util.tree_flatten(expected)
    assert ta == te, f"{what}: tree structures differ: {ta} vs {te}"
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(expected)[0]]
    for path, a, e in zip(paths, la, le):
        assert a.shape == e.shape and a.dtype == e.dtype, (what, path, a.shape, a.dtype, e.shape, e.dtype)
        err = _rel_l2(a, e)
        assert err <= BF16_LEAF_RTOL, f"{what}{path}: relative L2 error {err:.3e} > {BF16_LEAF_RTOL}"


def assert_value_close(model: Any, actual: jax.Array, expected: jax.Array) -> None:
    """The loss: float32 tolerances, or (bf16 models) a relative error of ``BF16_VALUE_RTOL``."""
    if model.dtype == jnp.float32:
        np.testing.assert_allclose(actual, expected, **F32_TOL)
    else:
        assert _rel_l2(actual, expected) <= BF16_VALUE_RTOL, (float(actual), float(expected))


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize(("name", "budget"), _cases())
def test_matches_jax(name: str, budget: float | None) -> None:
    model = MODELS[name]
    args, value, grads, ct, vjp_grads = reference(name)
    aot = jaxaot.aot_function(model.loss, partition_fn=partition_fn(budget))

    # The eager fast path: jaxaot.value_and_grad against jax.value_and_grad.
    got_value, got_grads = jaxaot.value_and_grad(aot, argnums=model.argnums)(*args)
    assert got_value.dtype == value.dtype == jnp.float32
    assert_value_close(model, got_value, value)
    assert_close(model, got_grads, grads, "value_and_grad")

    # The explicit split: forward, then backward with a random cotangent, against jax.vjp.
    out, res = aot.forward(*args)
    assert_value_close(model, out, value)
    back = aot.backward(res, ct)
    assert len(back) == len(args)
    assert_close(model, tuple(back[i] for i in model.argnums), vjp_grads, "backward")
    for i, a in enumerate(args):
        if i not in model.argnums:  # integer labels: float0 zeros, as jax.vjp gives
            assert all(g.dtype == jax.dtypes.float0 for g in jax.tree_util.tree_leaves(back[i])), i


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_step_with_row_major_residuals_matches_jax(name: str, monkeypatch) -> None:
    # What an accelerator may choose (jaxaot._src.fusion.choose_layouts), forced here on CPU.
    from jaxaot._src.fusion import variants

    layouts_chosen(monkeypatch)
    monkeypatch.setattr(variants, "choose_layouts", lambda auto, pinned: "pinned")
    monkeypatch.setattr(variants, "choose_barrier", lambda barrier, kept, free: barrier)  # the barriered step
    model = MODELS[name]
    args, value, grads, _, _ = reference(name)
    aot = jaxaot.aot_function(model.loss, partition_fn=partition_fn(1.0))
    got_value, got_grads = jaxaot.value_and_grad(aot, argnums=model.argnums)(*args)
    assert_value_close(model, got_value, value)
    assert_close(model, got_grads, grads, "value_and_grad, row-major residuals")
    assert kept_step(aot, args).layouts == "pinned"


# --------------------------------------------------------------------------- saved bytes
@pytest.mark.parametrize("name", sorted(MODELS))
def test_budget_sweep_is_monotone(name: str) -> None:
    model = MODELS[name]
    joint = jaxaot.partition.trace_joint(model.loss, *model.make_args(fresh_key()))
    sweep = [jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=b).saved_bytes for b in SWEEP]
    assert all(a <= b for a, b in zip(sweep, sweep[1:])), dict(zip(SWEEP, sweep))
    default = jaxaot.partition.default_partition(joint).saved_bytes
    assert sweep[-1] <= default, (sweep[-1], default)
    # Every model here has matmuls that budget 1 saves and budget 0 recomputes.
    assert sweep[0] < sweep[-1], dict(zip(SWEEP, sweep))


def test_lowered_saved_bytes_is_the_partitions() -> None:
    # What the benchmarks read (AOTLowered.saved_bytes) is what the sweep above compares.
    model = MODELS["llama_block"]
    args = model.make_args(fresh_key())
    joint = jaxaot.partition.trace_joint(model.loss, *args)
    for budget in (0.0, 0.5, 1.0):
        low = jaxaot.aot_function(model.loss, partition_fn=partition_fn(budget)).lower(*args)
        want = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=budget).saved_bytes
        assert low.saved_bytes == want == sum(r.nbytes for r in low.saved)
