"""How compiled autograd keys a step's custom rules: by the rules (their code, closure, defaults and static
arguments) and what they read (globals, a bound object's attributes, a partial's arguments), wherever they are
called (the forward, a loop body, a branch, a ``jit`` region), and constants by their bits. Each case is one
compile per distinct rule or value, never a stale step: every gradient is compared with ``jax.value_and_grad``
on fresh random inputs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot import compiled_autograd


def _no_fallback():
    assert compiled_autograd.stats().fallbacks == ()


def _straight_through(scale):
    """A rule whose primal is the same for every ``scale``: only its backward tells two of them apart."""
    @jax.custom_vjp
    def clipped(x):
        return jnp.clip(x, -1.0, 1.0)

    clipped.defvjp(lambda x: (jnp.clip(x, -1.0, 1.0), None), lambda _, ct: (scale * ct,))
    return clipped


_HALF, _DOUBLE = _straight_through(0.5), _straight_through(2.0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _scaled_identity(x, scale):  # a primal blind to its static argument, which only the rule reads
    return x


_scaled_identity.defjvp(lambda scale, primals, tangents: (primals[0], scale * tangents[0]))


@pytest.mark.parametrize("body", ("scan", "fori_loop", "cond"))
def test_custom_rules_in_a_body_traced_each_call_compile_once_per_rule(body):
    """A body defined inside the loss is traced anew at each call, with new wrappers of its rules; the step is
    keyed by the rules themselves, so each rule compiles once, and two rules of one primal never share a step."""
    def make_loss(rule, scale):
        def loss(w, x):
            def layer(h, wi):
                return _scaled_identity(rule(jax.nn.relu(h @ wi)), scale)

            if body == "scan":
                h = jax.lax.scan(lambda h, wi: (layer(h, wi), None), x, w)[0]
            elif body == "fori_loop":
                h = jax.lax.fori_loop(0, w.shape[0], lambda i, h: layer(h, w[i]), x)
            else:
                h = jax.lax.cond(x.sum() > 0, lambda h: layer(h, w[0]), lambda h: layer(h, w[1]), x)
            return jnp.mean(h ** 2)
        return loss

    rng = np.random.default_rng()
    w, vg = _rand(rng, 3, 6, 6), jaxaot.compiled_value_and_grad(lambda w, x, loss: loss(w, x), argnums=0)
    losses = [make_loss(rule, scale) for rule in (_HALF, _DOUBLE) for scale in (1.0, 3.0)]
    for _ in range(3):
        for loss in losses:
            x = _rand(rng, 4, 6)
            _close(vg(w, x, loss), jax.value_and_grad(loss)(w, x))
    assert compiled_autograd.stats().compiles == len(losses)
    _no_fallback()


STRENGTH = 1.0  # what a gradient-reversal rule's backward reads, as a schedule changes it


@jax.custom_vjp
def _reverse(x):
    return x


_reverse.defvjp(lambda x: (x, None), lambda _, ct: (-STRENGTH * ct,))


@pytest.mark.parametrize("where", ("scan", "jit"))
def test_a_global_a_rule_in_a_body_reads_keys_the_step_as_at_the_top(where, monkeypatch):
    jitted = jax.jit(lambda h: jnp.sin(_reverse(h)))

    def loss(w, x):
        if where == "jit":
            return jnp.sum(jitted(x @ w))
        return jnp.sum(jax.lax.scan(lambda c, r: (c + jnp.sin(_reverse(r @ w)), None), jnp.zeros(w.shape[1]), x)[0])

    rng = np.random.default_rng()
    g, w = jaxaot.compiled_grad(loss), _rand(rng, 3, 2)
    for strength in (1.0, 0.5, 2.0, 2.0):
        monkeypatch.setitem(globals(), "STRENGTH", strength)
        x = _rand(rng, 4, 3)
        _close(g(w, x), jax.grad(loss)(w, x))
    assert compiled_autograd.stats().compiles <= 4  # a new value may compile anew; never a stale gradient


@pytest.mark.parametrize("where", ("top", "scan"))
def test_a_rule_defined_in_the_forward_compiles_once_per_value_it_closes_over(where):
    """A ``def`` run at every call makes a new function, the same rule: keyed by code and closure, it compiles
    once while the closed-over bound stays, and again (never a stale step) when the bound changes."""
    def loss(w, x, bound):
        @jax.custom_vjp
        def clip_grad(a):
            return a

        clip_grad.defvjp(lambda a: (a, None), lambda _, g: (jnp.clip(g, -bound, bound),))
        if where == "top":
            return jnp.sum(jnp.tanh(clip_grad(x @ w)) ** 2)
        return jnp.sum(jax.lax.scan(lambda c, r: (c + jnp.tanh(clip_grad(r @ w)), None), jnp.zeros(w.shape[1]), x)[0])

    rng = np.random.default_rng()
    vg, w = jaxaot.compiled_value_and_grad(loss), _rand(rng, 3, 2)
    for bound in (0.1, 0.1, 0.1, 0.05, 0.05):
        x = _rand(rng, 4, 3)
        _close(vg(w, x, bound), jax.value_and_grad(loss)(w, x, bound))
    assert vg.cache_info().misses == 2


def test_a_nan_or_a_negative_zero_in_a_body_is_keyed_by_its_bits():
    """A NaN equals itself (one compile for the mask idiom), and -0.0 is not 0.0 (``arctan2`` tells them apart)."""
    def masked(w, x):
        h = jnp.tanh(x @ w)
        mean_of_positive = lambda h: jnp.nanmean(jnp.where(h > 0, h, jnp.nan))  # noqa: E731
        return jax.lax.cond(h.sum() > 0, mean_of_positive, jnp.mean, h) ** 2

    def signed(c):
        return lambda w, x: jnp.sum(jax.lax.scan(lambda a, r: (a + jnp.arctan2(c, r @ w), None),
                                                 jnp.zeros(w.shape[1]), x)[0])

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(masked)
    for _ in range(4):
        w, x = _rand(rng, 8, 4), jnp.abs(_rand(rng, 16, 8))
        _close(vg(w, x), jax.value_and_grad(masked)(w, x))
    assert vg.cache_info().misses == 1
    vg = jaxaot.compiled_value_and_grad(lambda w, x, f: f(w, x))
    w, x = _rand(rng, 3, 2), -jnp.abs(_rand(rng, 4, 3))
    for c in (0.0, -0.0):
        _close(vg(w, x, signed(c)), jax.value_and_grad(signed(c))(w, x))


class _Reversal:
    """A gradient reversal whose rules are bound methods reading the object's strength."""

    def __init__(self):
        self.strength = 1.0

    def fwd(self, x):
        return x, None

    def bwd(self, _, g):
        return (-self.strength * g,)


_REVERSAL = _Reversal()
_by_method = jax.custom_vjp(lambda x: x)
_by_method.defvjp(_REVERSAL.fwd, _REVERSAL.bwd)
_CONFIG = {"scale": 1.0}


def _scaled_by_default(_, g, config=_CONFIG):  # a mutable default, changed in place
    return (g * config["scale"],)


_by_default = jax.custom_vjp(lambda x: x)
_by_default.defvjp(lambda x: (x, None), _scaled_by_default)


def _body_of(rule):
    """A scan body made once, as a module-level one is: JAX keeps its traced jaxpr from call to call."""
    return lambda c, r: (c + jnp.sum(rule(r) ** 2), None)


_BODIES = {"method": _body_of(_by_method), "default": _body_of(_by_default)}
_CHANGES = {"method": lambda v: setattr(_REVERSAL, "strength", v), "default": lambda v: _CONFIG.__setitem__("scale", v)}


@pytest.mark.parametrize("name", sorted(_BODIES))
def test_what_a_bound_method_or_a_default_holds_keys_the_rule_in_a_scan_body(name):
    body, change = _BODIES[name], _CHANGES[name]

    def loss(x):
        return jax.lax.scan(body, 0.0, jnp.stack([x, 2 * x]))[0]

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss)
    try:
        for value in (1.0, -1.0, -0.0, 2.0):
            change(value)
            x = _rand(rng, 3)
            _close(vg(x), jax.value_and_grad(loss)(x))
    finally:
        change(1.0)


def test_a_helper_defined_again_and_defjvps_in_the_forward():
    """A rule's helper defined anew (a notebook cell run again) is another rule; ``defjvps`` in the forward is one."""
    namespace: dict = {"jnp": jnp}
    exec("def helper(g):\n    return jnp.clip(g, -1.0, 1.0)", namespace)  # noqa: S102 - a cell run again
    clipped = jax.custom_vjp(lambda x: x)
    clipped.defvjp(lambda x: (x, None), lambda _, g: (namespace["helper"](g),))

    def product(x):
        @jax.custom_jvp
        def times(a, b):
            return a * b

        times.defjvps(lambda t, ans, a, b: t * b, lambda t, ans, a, b: t * a)
        return jnp.sum(times(x, x + 1.0)) + jnp.sum(clipped(3.0 * x) ** 2)

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(product)
    for _ in range(3):
        x = _rand(rng, 3)
        _close(vg(x), jax.value_and_grad(product)(x))
    assert vg.cache_info().misses == 1
    exec("def helper(g):\n    return -2.0 * g", namespace)  # noqa: S102
    x = _rand(rng, 3)
    _close(vg(x), jax.value_and_grad(product)(x))
