"""A fused step's choice, kept in the persistent cache by the first process and recalled by the next.

CPU stands in for an accelerator (the layout and time choices' platform sets include it,
and a timer decides fused or split), so that the variants are weighed and the steps timed
as on a GPU. A second function of the same program, with the same cache, compiles only the
variant kept and times nothing, and runs what the first one chose.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
import zoo
from jaxaot._src.compile import store
from jaxaot._src.fusion import step_choice
from jaxaot.errors import CacheWarning
from platforms import layouts_chosen
from zoo import assert_trees_close, finish_tuning, kept_step


def _case(name, seed):
    fn, make_args = zoo.ZOO[name]
    args = make_args(jax.random.key(seed))
    loss = lambda *a: sum(jnp.sum(jnp.tanh(y)) for y in jax.tree.leaves(fn(*a)))  # noqa: E731
    return loss, args, tuple(range(len(args)))


def _step(loss, args, argnums, budget=0.0):
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(loss, partition_fn=pf)
    got = jaxaot.value_and_grad(f, argnums=argnums)(*args)
    finish_tuning(f, args)  # the choice the calls that follow make, made (and kept)
    return f, got


@pytest.mark.parametrize("runs", ["fused", "split"])
@pytest.mark.parametrize("name", ["attention", "mlp_gelu"])
def test_a_second_process_recalls_the_choice_and_weighs_nothing(accelerator, tmp_path, name, runs):
    seen, verdict = accelerator
    verdict[0] = runs
    loss, args, argnums = _case(name, np.random.default_rng().integers(1 << 20))
    want = jax.value_and_grad(loss, argnums=argnums)(*args)
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        first, got = _step(loss, args, argnums)
        assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
        cold = kept_step(first, args)
        assert seen["timed"] > 0 and len(seen["variants"]) >= 2 and cold.runs == runs
        assert len(list((tmp_path / f"jaxaot-v{store.FORMAT_VERSION}" / "choices").glob("*.bin"))) == 1
        seen["variants"].clear()
        seen["timed"] = 0
        verdict[0] = "split" if runs == "fused" else "fused"  # a new timing would choose the other step
        second, got = _step(loss, args, argnums)
        assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
        warm = kept_step(second, args)
    assert seen["timed"] == 0 and len(seen["variants"]) <= 1  # the kept variant alone (none: the base step)
    if runs == "split":  # the split pair alone: the fused step is not compiled
        assert not seen["variants"] and warm.executable not in second.lookup(args, {}).programs.executables
    assert (warm.layouts, warm.order, warm.barrier, warm.rederived, warm.runs) == (
        cold.layouts, cold.order, cold.barrier, cold.rederived, cold.runs)
    assert "recalled from the persistent cache" in warm.why


def test_a_platform_that_chooses_nothing_keeps_no_choice(tmp_path, monkeypatch):
    layouts_chosen(monkeypatch, False)  # as on a CPU, on every platform: no variant weighed, nothing timed
    monkeypatch.setattr(step_choice, "TIME_CHOICE_PLATFORMS", frozenset())
    loss, args, argnums = _case("mlp_gelu", np.random.default_rng().integers(1 << 20))
    want = jax.value_and_grad(loss, argnums=argnums)(*args)
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        f, got = _step(loss, args, argnums)
    assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
    assert "recalled" not in kept_step(f, args).why
    assert not (tmp_path / f"jaxaot-v{store.FORMAT_VERSION}" / "choices").exists()


def test_a_record_that_does_not_parse_is_reported_and_the_choice_made_again(accelerator, tmp_path):
    seen, verdict = accelerator
    loss, args, argnums = _case("attention", 11)
    want = jax.value_and_grad(loss, argnums=argnums)(*args)
    with jaxaot.config.override(cache_dir=str(tmp_path)):
        _step(loss, args, argnums)
        (record,) = (tmp_path / f"jaxaot-v{store.FORMAT_VERSION}" / "choices").glob("*.bin")
        payload = bytes(store.read(record))
        store.write(record, payload[: len(payload) // 2])  # signed, but no JSON object
        seen["timed"] = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f, got = _step(loss, args, argnums)
        assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
        assert any(issubclass(w.category, CacheWarning) and "does not parse" in str(w.message) for w in caught)
        assert seen["timed"] > 0 and kept_step(f, args).runs == "fused"  # timed again, and kept again
        assert "recalled" not in kept_step(f, args).why
