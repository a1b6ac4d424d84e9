"""A gradient's compiled stage reports the program its call runs: the fused step, under ``"step"``.

Where ``jaxaot.value_and_grad`` runs forward and backward as one fused executable, that executable is
the one ``compiled.executables["step"]`` holds and ``memory_analysis()``, ``cost_analysis()`` and
``as_text()`` describe, as ``jax.jit(f).lower(x).compile()`` describes the program it runs. Stages
that run the split programs, or the function's outputs, have no ``"step"``. Inputs are fresh random
arrays; values and gradients are compared with ``jax.value_and_grad``'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxaot
from jaxaot._src.fusion import compiled_peak, fused_exe, fused_name
from zoo import mlp_args, mlp_gelu

PROGRAMS = {"inference", "forward", "backward"}


def _key():
    return jax.random.key(int(np.random.default_rng().integers(1 << 30)))


def _fresh(args):
    return jax.tree.map(lambda a: a + 0.1 * jax.random.normal(_key(), a.shape, a.dtype), args)


def _assert_same_value_and_grads(ours, theirs):
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-5), (a, b)


def test_the_fused_stage_reports_the_step_its_call_runs():
    f = jaxaot.aot_function(mlp_gelu)
    args = mlp_args(_key())
    compiled = jaxaot.value_and_grad(f, argnums=(0, 1)).lower(*args).compile()
    assert "compiled on first use" in repr(compiled)  # named, not compiled, before anything reads it
    fresh = _fresh(args)
    _assert_same_value_and_grads(compiled(*fresh), jax.value_and_grad(mlp_gelu, argnums=(0, 1))(*fresh))

    tr = compiled.lowered._training
    runs = fused_exe(tr)  # the executable the call ran
    assert fused_name(tr) in f.cache_info().entries[0].executables
    assert set(compiled.executables) == PROGRAMS | {"step"} and compiled.executables["step"] is runs
    mem = compiled.memory_analysis()
    assert set(mem) == PROGRAMS | {"step"}
    stats = runs.memory_analysis()
    assert mem["step"] == {k: int(getattr(stats, k)) for k in dir(stats) if k.endswith("_in_bytes")}
    assert compiled.peak_bytes == compiled_peak(runs)
    cost = compiled.cost_analysis()
    assert cost["step"]["flops"] > cost["forward"]["flops"] > 0
    hlo = compiled.as_text()
    assert hlo["step"] == runs.as_text() and hlo["step"].startswith("HloModule") and "func.func" not in hlo["step"]
    assert f.cache_info().entries[0].compiles.count(fused_name(tr)) == 1  # reading it compiled nothing more

    summary = str(compiled)
    assert "step (the fused training step the call runs)" in summary.splitlines()[0]
    assert f"step {compiled.peak_bytes} bytes" in summary.splitlines()[1]
    assert repr(compiled).endswith("step (the fused training step the call runs)>")
    fresh = _fresh(args)
    _assert_same_value_and_grads(compiled(*fresh), jax.value_and_grad(mlp_gelu, argnums=(0, 1))(*fresh))


def test_reading_the_analyses_compiles_the_step_the_call_then_runs():
    fn = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)  # noqa: E731
    f = jaxaot.aot_function(fn)
    w, x = jax.random.normal(_key(), (6, 3)), jax.random.normal(_key(), (4, 6))
    compiled = jaxaot.grad(f, argnums=(0, 1)).lower(w, x).compile()
    assert "step" in compiled.memory_analysis()  # compiled here, before any call
    step = compiled.executables["step"]
    compiles = f.cache_info().entries[0].compiles
    w2, x2 = _fresh((w, x))
    _assert_same_value_and_grads(compiled(w2, x2), jax.grad(fn, argnums=(0, 1))(w2, x2))
    assert f.cache_info().entries[0].compiles == compiles  # the call ran the step the stage reported
    # the step kept so far: on an accelerator the calls go on weighing its variants, and time it against the split
    # programs, which a function this small may find faster (then there is no step to run)
    if any(choice.runs == "split" for choice in f.cache_info().entries[0].fused):
        assert "step" not in compiled.executables and "step" not in compiled.lowered.executables
    else:
        assert compiled.executables["step"] is fused_exe(compiled.lowered._training)
        assert compiled.lowered.executables.keys() >= {"step"}


def test_stages_that_run_split_programs_or_outputs_have_no_step():
    f = jaxaot.aot_function(mlp_gelu)
    args = mlp_args(_key())
    split = jaxaot.value_and_grad(f, argnums=(0, 1), fused=False).lower(*args).compile()
    outputs = f.lower(*args).compile()
    for compiled in (split, outputs):
        assert set(compiled.executables) == PROGRAMS
        assert set(compiled.memory_analysis()) == set(compiled.cost_analysis()) == set(compiled.as_text()) == PROGRAMS
        assert "step" not in repr(compiled) and "the call runs" not in str(compiled)
    fresh = _fresh(args)
    _assert_same_value_and_grads(split(*fresh), jax.value_and_grad(mlp_gelu, argnums=(0, 1))(*fresh))
    _assert_same_value_and_grads(outputs(*fresh), mlp_gelu(*fresh))
