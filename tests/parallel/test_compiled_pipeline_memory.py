"""The compiled pipeline's memory: a device holds the largest stage's records, ticks copy no buffer, and a step
that cannot fit raises before it runs.

The model is an MLP whose stage ``i`` is ``64 (i + 1)`` wide, so parameters and residuals differ in shape on
every stage: a layout that kept the union (or the sum) of the stages' leaves would pay for all four widths.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import jaxaot
from jaxaot._src.parallel.training_pipeline import pipeline
from jaxaot._src.parallel.spmd import memory
from pipeline_models import unpipelined, widening_model
from zoo import assert_trees_close, key_stream

TOL = dict(rtol=1e-5, atol=1e-6)
fresh_key = key_stream(9800)


def stage_mesh(n: int = 4) -> jax.sharding.Mesh:
    if jax.device_count() < n:
        pytest.skip(f"{n} pipeline stages need {n} devices; {jax.device_count()} here")
    return jax.sharding.Mesh(np.array(jax.devices()[:n]), ("stage",))


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def test_per_device_peak_is_the_largest_stages_not_the_sum():
    mesh = stage_mesh()
    stages, loss_fn, params, x, t = widening_model(4, fresh_key())
    step = pipeline(stages, loss_fn, schedule="gpipe", num_microbatches=8, mesh=mesh)
    report = step.lower(params, x, t)
    # the ideal, from the stages' own sizes: the largest stage's parameters and gradients, 8 live
    # microbatches of the largest stage's residuals, one 16-wide message each way
    message = (x.shape[0] // 8) * x.shape[1] * 4
    ideal = 2 * max(nbytes(p) for p in params) + 8 * max(report.residual_bytes) + 2 * message
    assert report.ideal_peak_bytes == ideal
    peak = step.peak_bytes(params, x, t)
    assert peak <= 1.25 * ideal, (peak, ideal)
    # every stage's leaves together would not fit in that
    assert peak < 2 * sum(nbytes(p) for p in params) + 8 * sum(report.residual_bytes)
    loss, grads = step(params, x, t)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 8)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


def _buffer_copies(text: str, shapes: set[str]) -> list[str]:
    """The compiled program's ``copy`` ops of one of ``shapes`` (``f32[8,1024]``), outside the entry computation
    (which zeroes the buffers once per step)."""
    out, computation = [], ""
    for line in text.splitlines():
        if line and not line.startswith(" "):
            computation = line
        m = re.match(r"\s*(?:ROOT )?%\S+ = (\w+\[[\d,]*\])\S* (copy|copy-start|concatenate)\(", line)
        if m and m.group(1) in shapes and not computation.startswith("ENTRY"):
            out.append(line.strip()[:160])
    return out


def test_ticks_neither_copy_nor_pack_whole_buffers():
    """Each tick's conds read their leaves in place and write only what they produced: the compiled loop holds
    no copy or concatenate of a residual, W-argument, inbox or parameter buffer."""
    mesh = stage_mesh()
    stages, loss_fn, params, x, t = widening_model(4, fresh_key(), batch=128)
    step = pipeline(stages, loss_fn, schedule="zero_bubble", num_microbatches=8, mesh=mesh)
    text = step.compile(params, x, t).as_text()
    c = step._compiled.signatures()[0]
    slots = step._compiled.tick_plan.slots
    lay = c.layouts
    buffers = (lay.residuals.record_avals(slots["residuals"]) + lay.weights.record_avals(slots["weights"])
               + lay.activations.record_avals(slots["activations"] + 1)
               + lay.cotangents.record_avals(slots["cotangents"] + 1) + lay.params.record_avals())
    names = {"float32": "f32", "int32": "s32"}
    shapes = {f"{names[str(a.dtype)]}[{','.join(map(str, a.shape))}]" for a in buffers}
    assert any(f"{s}{{" in text for s in shapes)  # the buffers are there, under these names
    assert not _buffer_copies(text, shapes), _buffer_copies(text, shapes)


def test_a_step_that_does_not_fit_raises_before_it_runs(monkeypatch):
    mesh = stage_mesh()
    stages, loss_fn, params, x, t = widening_model(4, fresh_key())
    gpipe = pipeline(stages, loss_fn, schedule="gpipe", num_microbatches=8, mesh=mesh)
    one_f_one_b = pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=8, mesh=mesh)
    big, small = gpipe.peak_bytes(params, x, t), one_f_one_b.peak_bytes(params, x, t)
    assert small < big
    limit = (small + big) // 2
    seen = []

    def fake_memory(device):
        seen.append(device)
        return limit, 0

    monkeypatch.setattr(memory, "device_memory", fake_memory)
    with pytest.raises(jaxaot.errors.PipelineMemoryError, match=r"needs .* on each device.*'1f1b'.*memory_budget") as e:
        gpipe(params, x, t)
    assert (e.value.peak, e.value.limit) == (big, limit) and e.value.device in mesh.devices.flat
    assert isinstance(e.value, RuntimeError)
    loss, grads = one_f_one_b(params, x, t)  # the smaller configuration fits and runs
    assert set(seen) >= set(mesh.devices.flat)
    ref_loss, ref_grads = unpipelined(stages, loss_fn, 8)(params, x, t)
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
    monkeypatch.undo()  # memory enough: the step that raised runs
    np.testing.assert_allclose(gpipe(params, x, t)[0], ref_loss, **TOL)
