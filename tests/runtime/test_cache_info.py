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
                           "x: shape (3,) → (), an array → a Python scalar (weakly typed)"]
    assert [e.signature for e in f.cache_info().entries] == ["x: f32[3], n=3", "x: f32[3], n=4", "x: f32[], n=4"]


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
    with pytest.raises(PartitionError, match="partition_fn .*no_plan returned a NoneType, not a jaxaot.Partition"):
        jax.grad(f)(jnp.ones(3))
    with pytest.raises(PartitionError, match="no_plan"):  # nothing half-built was kept
        jax.grad(f)(jnp.ones(3))
    assert float(f(jnp.ones(3))) == pytest.approx(3 * 0.84147096)  # inference needs no partition
