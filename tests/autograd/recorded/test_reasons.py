"""Compiled autograd says why a step compiled in words: the argument by path, the branch, the line.

Each reason is checked whole (or its clause), against what changed between two
steps: an argument's shape or dtype, a Python branch on data, a Python value
(a loop count), a Python scalar the forward uses, an array it closes over.
``cache_info()`` of the function counts its own hits and compiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import compiled_autograd

HERE = "test_reasons.py"


@pytest.fixture(autouse=True)
def _fresh_cache():
    compiled_autograd.reset()
    yield
    compiled_autograd.reset()


def _branchy(params, x):
    h = jnp.tanh(x @ params["w1"])
    if h.mean() > 0:  # the branch line
        h = h @ params["w2"]
    else:
        h = jnp.sin(h) @ params["w2"]
    return jnp.sum(h ** 2)


BRANCH_LINE = _branchy.__code__.co_firstlineno + 2


def _params(dtype=jnp.float32):
    return {"w1": jnp.ones((3, 4), dtype), "w2": jnp.ones((4, 2))}


def test_a_changed_argument_is_named_by_its_path():
    vg = jaxaot.compiled_value_and_grad(_branchy)
    vg(_params(), jnp.ones((5, 3)))
    vg(_params(), jnp.ones((6, 3)))
    vg(_params(jnp.bfloat16), jnp.ones((6, 3)))
    reasons = [e.reason for e in vg.cache_info().entries]
    assert reasons[1] == "compiled_grad(_branchy): x: shape (5, 3) → (6, 3)"
    assert reasons[2] == "compiled_grad(_branchy): params['w1']: dtype float32 → bfloat16"


def test_a_python_branch_that_took_the_other_side_is_named_by_its_line():
    vg = jaxaot.compiled_value_and_grad(_branchy)
    vg(_params(), jnp.ones((5, 3)))
    vg(_params(), -jnp.ones((5, 3)))
    reason = vg.cache_info().entries[1].reason
    assert f"Python branch at {__file__}:{BRANCH_LINE}" in reason, reason
    assert "took the other side (the condition was True, now False)" in reason
    assert "the forward took another path: operation 4 is now jit" in reason  # the operation, by its line too
    assert reason in compiled_autograd.stats().reasons


def test_python_values_scalars_and_closed_over_arrays():
    def looped(w, x, n):
        for _ in range(n):
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    g = jaxaot.compiled_grad(looped)
    g(jnp.ones((4, 4)), jnp.ones((3, 4)), 2)
    g(jnp.ones((4, 4)), jnp.ones((3, 4)), 3)
    assert "looped): n: 2 → 3 (a Python value); the forward took another path" in g.cache_info().entries[1].reason

    scaled = jaxaot.compiled_grad(lambda w, s: jnp.sum(w * s))
    scaled(jnp.ones(3), 2.0)
    scaled(jnp.ones(3), 3.0)
    assert "the Python scalar 2.0 the forward uses is now 3.0" in scaled.cache_info().entries[1].reason

    box = [jnp.ones(3)]
    closed = jaxaot.compiled_grad(lambda w: jnp.sum(w * box[0]))
    closed(jnp.ones(3))
    box[0] = jnp.ones((1, 3))
    closed(jnp.ones(3))
    assert "an array the forward uses (input 1 of the forward): shape (3,) → (1, 3)" in \
        closed.cache_info().entries[1].reason


@pytest.mark.parametrize("replay", (False, True))
def test_a_one_element_numpy_array_written_between_steps_is_named_with_the_fix_and_gives_jaxs_values(replay):
    rng = np.random.default_rng()
    scale = np.asarray(rng.uniform(0.5, 2.0, (1,)), np.float32)  # state the forward closes over, written in place

    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) * scale)

    vg = jaxaot.compiled_value_and_grad(f, replay=replay)
    w, x = jnp.asarray(rng.standard_normal((3, 2)), jnp.float32), jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
    old = None
    for new in rng.uniform(0.5, 2.0, 3):
        (value, grads), (want, want_grads) = vg(w, x), jax.value_and_grad(f)(w, x)
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)  # a sum may cancel to near 0
        np.testing.assert_allclose(grads, want_grads, rtol=1e-5, atol=1e-6)
        if old is not None:
            reason = vg.cache_info().entries[-1].reason
            assert f"the NumPy value {old!r} (dtype float32, shape (1,)) the forward uses is now" in reason
            assert "pass it as a JAX array, jnp.asarray(...), to keep one program" in reason
        old, scale[0] = float(scale[0]), new


def test_cache_info_counts_this_function_s_hits_and_compiles():
    vg = jaxaot.compiled_value_and_grad(_branchy)
    for _ in range(4):
        vg(_params(), jnp.ones((5, 3)))
    other = jaxaot.compiled_grad(_branchy)  # the same program: the shared cache serves it
    other(_params(), jnp.ones((5, 3)))
    info = vg.cache_info()
    assert (info.hits, info.misses, info.duplicates) == (3, 1, ())
    (e,) = info.entries
    assert e.signature == "params['w1']: f32[3,4], params['w2']: f32[4,2], x: f32[5,3]"
    assert e.program == "step" and e.executables == ("step",) and e.compiles == ("step",)
    assert e.trace_seconds > 0 and e.xla_seconds > 0 and {"record", "trace_step", "compile_step"} <= set(e.times)
    assert other.cache_info().hits == 1 and other.cache_info().misses == 0


def test_a_structure_dropped_from_a_full_cache_compiles_again_and_says_so():
    f = lambda x: jnp.sum(jnp.sin(x) ** 2)  # noqa: E731
    vg = jaxaot.compiled_value_and_grad(f)
    rng = np.random.default_rng()
    with jaxaot.config.override(compiled_autograd_cache_size=2):
        for n in (1, 2, 1, 3, 1, 2):  # 3 drops 2, the least recently used; 2 comes back and drops 1
            x = jnp.asarray(rng.standard_normal(n), jnp.float32)
            v, g = vg(x)
            v0, g0 = jax.value_and_grad(f)(x)
            np.testing.assert_allclose(v, v0, rtol=1e-6)
            np.testing.assert_allclose(g, g0, rtol=1e-6, atol=1e-6)
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits, s.evictions, s.entries) == (4, 2, 2, 2)
    assert [("dropped since" in r) for r in s.reasons] == [False, False, False, True]
    assert "cache keeps 2 executables, jaxaot.config.compiled_autograd_cache_size" in s.reasons[-1]
    assert vg.cache_info().entries[-1].reason == s.reasons[-1]


def test_has_aux_must_be_a_bool():
    with pytest.raises(jaxaot.errors.InvalidInputError, match="has_aux"):
        jaxaot.compiled_grad(lambda x: x.sum(), has_aux="yes")
    assert float(jaxaot.compiled_grad(lambda x: jnp.sum(x * x))(jnp.ones(2))[0]) == 2.0
