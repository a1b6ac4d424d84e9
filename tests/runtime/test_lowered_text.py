"""``str()`` of a lowered or compiled split is a short summary; ``details()`` is the whole of it.

A deep model has hundreds of residuals: printing ``f.lower(...)`` must still fit
a screen (the totals, the programs' sizes, the largest residuals, the
partitioner's notes, the stage times), while ``details()`` keeps every row and
both programs, which ``jaxaot inspect`` prints.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxaot
from zoo import deep_mlp, deep_mlp_args

MAX_SUMMARY_LINES = 15


def _lowered(layers, partition_fn):
    seed = int(np.random.default_rng().integers(1 << 16))
    args = deep_mlp_args(layers, width=16, batch=8, seed=seed)
    return jaxaot.aot_function(deep_mlp, partition_fn=partition_fn).lower(*args)


def test_str_of_a_deep_split_is_a_short_summary_and_details_has_every_residual():
    low = _lowered(12, jaxaot.partition.default_partition)  # saves every gelu's intermediates
    table, summary, details = low.residuals, str(low), low.details()
    assert len(table) > 2 * MAX_SUMMARY_LINES  # enough rows that the whole table would not fit
    lines = summary.splitlines()
    assert len(lines) <= MAX_SUMMARY_LINES, summary
    assert f"{low.saved_bytes} bytes saved" in lines[0] and f"{len(low.recomputed)} forward eqns recomputed" in summary
    largest = max((r for r in table if r.kind != "input"), key=lambda r: r.nbytes)
    assert largest.label in summary and f"{len(table) - 5} more" in summary and "times: trace" in lines[-1]
    assert len(details.splitlines()) > len(table)
    residual_lines = details.split("== residuals ==\n", 1)[1].splitlines()
    for i, row in enumerate(table):  # every row, in order, with its label and source line
        assert residual_lines[i + 1].startswith(f"{i} ") and row.label in residual_lines[i + 1], residual_lines[i + 1]
        assert row.source_line in residual_lines[i + 1]
    assert str(low.forward) in details and str(low.backward) in details
    assert all(eqn in details for eqn in low.recomputed)


def test_str_of_the_compiled_split_is_a_short_summary_with_its_peaks():
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5)
    compiled = _lowered(6, pf).compile()
    summary = str(compiled)
    assert len(summary.splitlines()) <= MAX_SUMMARY_LINES, summary
    assert "compiled peak: forward" in summary and "training step" not in summary  # not compiled for str()
    peak = compiled.peak_bytes
    assert f"training step {peak} bytes" in str(compiled)
    details = compiled.details()
    assert all(row.label in details for row in compiled.residuals) and str(compiled.residuals) in details


def test_a_small_split_prints_every_residual_and_the_notes():
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, offload="auto")
    low = jaxaot.aot_function(deep_mlp, partition_fn=pf).lower(*deep_mlp_args(1, width=4, batch=2))
    summary = str(low)
    assert "more:" not in summary and all(row.label in summary for row in low.residuals)
    assert all(note in summary for note in low.residuals.notes())
    assert repr(low).startswith("<AOTLowered:")


def _newton_sqrt(a):
    import jax.numpy as jnp

    return jaxaot.loops.while_loop(lambda s: jnp.abs(s * s - a) > 1e-6, lambda s: 0.5 * (s + a / s), a,
                                   max_steps=50)


def test_a_loop_s_residuals_point_at_the_user_s_call_not_at_jaxaot():
    """As a lax.scan's do: jaxaot's own frames are no user frames in JAX's source info."""
    table = jaxaot.aot_function(_newton_sqrt).lower(np.float32(4.0)).residuals
    lines = [r.source_line for r in table if r.source_line]
    assert lines and all(__file__ in line and "_newton_sqrt" in line for line in lines), lines


def test_a_backward_with_nothing_to_differentiate_says_why():
    """An empty backward reads as a bug unless the summary says why it is empty; gradients match JAX's."""
    rng = np.random.default_rng()
    ints = jnp.asarray(rng.integers(-9, 9, size=5), jnp.int32)
    low = jaxaot.aot_function(lambda i: (i * 3).sum()).lower(ints)
    assert "backward 0 eqns (no input takes a gradient: integer and boolean inputs have none)" in str(low)
    x = jnp.asarray(rng.normal(size=5), jnp.float32)
    argmax = jaxaot.aot_function(lambda v: jnp.argmax(v))
    assert "(no output takes a cotangent: every gradient is zero)" in str(argmax.lower(x))
    mean = jaxaot.aot_function(lambda v: jnp.sin(v).mean())
    assert "(no" not in str(mean.lower(x)).splitlines()[1]
    np.testing.assert_allclose(jax.grad(mean)(x), jax.grad(lambda v: jnp.sin(v).mean())(x), rtol=1e-6)



def _other_loop(a):
    return jaxaot.loops.while_loop(lambda s: s < 3.0 * a, lambda s: s + jnp.sin(a) + 1.0, a, max_steps=20)


def test_a_library_call_s_residuals_point_at_its_own_caller():
    """JAX keeps one jaxpr of a jitted ``jnp`` function, with the source line of whichever code traced it first
    (here another loop's, which runs ``jnp.where`` in jaxaot's loop code); inlined, its equations point at the
    call that ran them."""
    jaxaot.aot_function(_other_loop).lower(np.float32(np.random.default_rng().uniform(1, 2)))
    table = jaxaot.aot_function(_newton_sqrt).lower(np.float32(4.0)).residuals
    lines = [r.source_line for r in table if r.source_line]
    assert lines and all(__file__ in line and "_newton_sqrt" in line for line in lines), lines
