"""compiled_grad / compiled_value_and_grad against jax.grad on eager forwards, and their cache."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, in_threads, rand as _rand
from jaxaot import compiled_autograd


def branchy(params, x):
    h = jnp.tanh(x @ params["w1"])
    if h.mean() > 0:  # a Python branch on data
        h = h * params["s"]
    else:
        h = jnp.sin(h) + params["s"]
    return jnp.mean((h @ params["w2"]) ** 2)


def _params(rng):
    return {"w1": _rand(rng, 5, 8), "w2": _rand(rng, 8, 3), "s": _rand(rng, 8)}


@pytest.mark.smoke
def test_python_branches_on_data_match_jax_grad():
    rng = np.random.default_rng(0)
    vg = jaxaot.compiled_value_and_grad(branchy)
    taken = set()
    for _ in range(12):
        p, x = _params(rng), _rand(rng, 4, 5) + rng.standard_normal()
        taken.add(bool(jnp.tanh(x @ p["w1"]).mean() > 0))
        value, g = vg(p, x)
        ref_value, ref_g = jax.value_and_grad(branchy)(p, x)
        _close(value, ref_value)
        _close(g, ref_g)
    assert taken == {True, False}
    assert compiled_autograd.stats().compiles == 2  # one per branch


def test_loops_of_varying_length_and_multiple_argnums():
    def f(w, b, x, n):
        for _ in range(n):  # the length varies between calls
            x = jnp.tanh(x @ w + b)
        return jnp.sum(x ** 2)

    rng = np.random.default_rng(1)
    g = jaxaot.compiled_grad(f, argnums=(0, 1))
    for n in [1, 3, 2, 3, 1]:
        w, b, x = _rand(rng, 4, 4), _rand(rng, 4), _rand(rng, 2, 4)
        _close(g(w, b, x, n), jax.grad(f, argnums=(0, 1))(w, b, x, n))
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (3, 2)


def test_aot_function_regions_and_while_loop_inside():
    region = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w))

    def f(w, v, x):
        h = region(w, x)
        h = jaxaot.loops.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1] * v)), (0, h), max_steps=4)[1]
        return jnp.sum(h ** 2) + jnp.sum(region(w, x * 2.0))

    rng = np.random.default_rng(2)
    g = jaxaot.compiled_grad(f, argnums=(0, 1))
    for _ in range(3):
        w, v, x = _rand(rng, 3, 4), _rand(rng, 4), _rand(rng, 2, 3)
        _close(g(w, v, x), jax.grad(f, argnums=(0, 1))(w, v, x))
    assert compiled_autograd.stats().compiles == 1


def test_has_aux_and_value():
    def f(w, x):
        y = x @ w
        return jnp.sum(y ** 2), {"mean": y.mean()}

    rng = np.random.default_rng(3)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    (value, aux), g = jaxaot.compiled_value_and_grad(f, has_aux=True)(w, x)
    (rv, raux), rg = jax.value_and_grad(f, has_aux=True)(w, x)
    _close((value, aux, g), (rv, raux, rg))
    g2, aux2 = jaxaot.compiled_grad(f, has_aux=True)(w, x)
    _close((g2, aux2), (rg, raux))


def test_one_compile_over_50_steps_of_one_structure():
    rng = np.random.default_rng(4)
    vg = jaxaot.compiled_value_and_grad(lambda p, x: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))
    p = _params(rng)
    for _ in range(50):
        x = _rand(rng, 4, 5)
        _, g = vg(p, x)
        p = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (1, 49)


def test_structure_change_compiles_once_and_names_what_changed(caplog):
    f = lambda w, x: jnp.sum(jnp.tanh(x @ w))
    g = jaxaot.compiled_grad(f)
    rng = np.random.default_rng(5)
    with caplog.at_level("INFO", logger="jaxaot"):
        for rows in [4, 4, 6, 6, 4]:
            w, x = _rand(rng, 3, 2), _rand(rng, rows, 3)
            _close(g(w, x), jax.grad(f)(w, x))
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (2, 3)
    assert "first call" in s.reasons[0]
    assert s.reasons[1].endswith("<lambda>): x: shape (4, 3) → (6, 3)")  # the argument by name, old vs new
    assert s.reasons[1] in caplog.text


def test_the_same_structure_is_shared_between_functions():
    f1 = lambda x: jnp.sum(jnp.sin(x))
    f2 = lambda x: jnp.sum(jnp.sin(x))
    x = jnp.arange(3.0)
    jaxaot.compiled_grad(f1)(x)
    jaxaot.compiled_grad(f2)(x)
    assert compiled_autograd.stats().compiles == 1


def test_under_jit_it_is_jax_grad():
    f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
    rng = np.random.default_rng(6)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    _close(jax.jit(jaxaot.compiled_grad(f))(w, x), jax.grad(f)(w, x))
    assert compiled_autograd.stats().compiles == 0


def test_bad_argnums_and_integer_inputs_raise_typed_errors_then_work():
    f = lambda w, n: jnp.sum(w * n)
    w = jnp.arange(3.0)
    g = jaxaot.compiled_grad(f, argnums=2)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="argnums=2 is out of range"):
        g(w, 2)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="argnums"):
        jaxaot.compiled_grad(f, argnums="0")
    gi = jaxaot.compiled_grad(f, argnums=1)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="argument 1 has dtype int32"):
        gi(w, jnp.int32(2))
    _close(gi(w, jnp.float32(2)), jax.grad(f, argnums=1)(w, jnp.float32(2)))
    with pytest.raises(jaxaot.errors.InvalidInputError, match=r"argument 0\['k'\] has dtype key<fry>"):
        jaxaot.compiled_grad(lambda p: jnp.sum(jax.random.normal(p["k"], (3,))))({"k": jax.random.key(0)})
    with pytest.raises(jaxaot.errors.InvalidOutputError, match="real scalar"):
        jaxaot.compiled_grad(lambda w: w * 2)(w)
    _close(jaxaot.compiled_grad(f)(w, 2.0), jax.grad(f)(w, 2.0))


def test_eight_threads_compile_each_structure_once():
    f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
    vg = jaxaot.compiled_value_and_grad(f)
    rng = np.random.default_rng(7)
    inputs = [(_rand(rng, 3, 2), _rand(rng, rows, 3)) for rows in (4, 5)]

    def step(i, k):
        w, x = inputs[(i + k) % 2]
        _close(vg(w, x)[1], jax.grad(f)(w, x))

    in_threads(step)
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (2, 8 * 6 - 2)


@pytest.mark.parametrize("replay", [True, False])
def test_a_numpy_buffer_written_in_place_is_read_afresh_at_each_use(replay):
    """A NumPy array the forward closes over is copied where it is used; written in place between two uses (in
    one forward, or between calls), the later use reads what it holds then, as JAX does."""
    rng = np.random.default_rng(3)
    noise = np.zeros(4, np.float32)
    scales = rng.normal(size=(3, 4)).astype(np.float32)

    def loss(w, k0):
        h = w
        for k in range(3):
            noise[:] = scales[k] + k0
            h = jnp.tanh(h * 2.0 + noise)
        return jnp.sum(h * noise)

    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for k0 in (0.0, 0.0, 1.5, -0.5, -0.5):
        w = jnp.asarray(rng.normal(size=4).astype(np.float32))
        got, want = vg(w, k0), jax.value_and_grad(loss)(w, k0)
        _close(got, want)
