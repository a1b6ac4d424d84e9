"""Arrays a recorded forward reaches inside functions JAX traces for it, and values Python reads from arrays.

A ``jax.jit`` function closing over a concrete array keeps that array in its
jaxpr; the step takes it as an input, so a new value gives a new result without
a new compile. Custom rules closing over forward values fall back to ``jax.vjp``;
``np.from_dlpack`` and ``addressable_data`` read the value, as ``np.asarray``
does. Every result is compared with eager ``jax.value_and_grad`` on fresh
random inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot import compiled_autograd
from zoo import assert_trees_close, key_stream, normal_at

GLOBAL = {"a": jnp.ones(3)}
CALLS = 5


def _scaled(v, a):
    return jnp.sin(v) * a


def jit_lambda(w, a, a_np):
    return jnp.sum(jax.jit(lambda v: v * a)(w) ** 2)


def jit_partial(w, a, a_np):
    return jnp.sum(jax.jit(functools.partial(_scaled, a=a))(w) ** 2)


def jit_checkpoint(w, a, a_np):
    return jnp.sum(jax.jit(jax.checkpoint(lambda v: jnp.sin(v) * a))(w) ** 2)


def numpy_closure(w, a, a_np):
    return jnp.sum(jax.jit(lambda v: jnp.cos(v) * a_np)(w) ** 2)


def global_array(w, a, a_np):
    return jnp.sum(jax.jit(lambda v: v * GLOBAL["a"])(w) ** 2)


def jit_in_jit(w, a, a_np):
    inner = jax.jit(lambda u: u * GLOBAL["a"])
    return jnp.sum(jax.jit(lambda v: inner(v) + a)(w) ** 2)


def _inputs(rng):
    w, a = _rand(rng, 3), _rand(rng, 3)
    GLOBAL["a"] = _rand(rng, 3)
    return w, a, rng.standard_normal(3).astype(np.float32)


#: (loss, whether a recording replays with replay=True: no array reached from outside the arguments)
CASES = [(jit_lambda, True), (jit_partial, True), (jit_checkpoint, True), (numpy_closure, True),
         (global_array, False), (jit_in_jit, False)]


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("loss,replays", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_jit_closing_over_an_array_sees_each_calls_value_without_recompiling(loss, replays, replay):
    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for _ in range(CALLS):
        args = _inputs(rng)
        _close(vg(*args), jax.value_and_grad(loss)(*args))
    s = compiled_autograd.stats()
    assert s.compiles == 1 and s.fallbacks == ()
    assert len(vg.cache_info().entries) == 1
    assert s.replays == (CALLS - 1 if replay and replays else 0)
    args = _inputs(rng)  # another function of the same structure shares the executable, not the values
    _close(jaxaot.compiled_value_and_grad(lambda *a: loss(*a), replay=replay)(*args), jax.value_and_grad(loss)(*args))
    assert compiled_autograd.stats().compiles == 1


def test_a_jit_inside_a_cond_branch_is_keyed_by_the_value_it_closes_over():
    def loss(w):
        branch = lambda v: jax.jit(lambda u: u * GLOBAL["a"])(v)  # noqa: E731
        return jnp.sum(jax.lax.cond(True, branch, lambda v: v, w) ** 2)

    rng = np.random.default_rng()
    for replay in (False, True):
        compiled_autograd.reset()
        vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
        for _ in range(4):
            w, _, _ = _inputs(rng)
            _close(vg(w), jax.value_and_grad(loss)(w))
        s = compiled_autograd.stats()
        assert s.compiles == 4 and s.replays == 0
        assert "closes over holds another value" in s.reasons[-1]
    GLOBAL["a"] = jnp.ones(3)  # the same value again: the same structure
    vg(w)
    vg(w)
    assert compiled_autograd.stats().hits >= 1


def _through_a_jit(v):
    return jnp.sin(v) * jax.jit(lambda u: u * GLOBAL["a"])(v)


@jax.custom_jvp
def _custom_over_a_jit(v):
    return _through_a_jit(v)


_custom_over_a_jit.defjvp(lambda p, t: jax.jvp(_through_a_jit, p, t))


@pytest.mark.parametrize("replay", [False, True])
def test_a_jit_inside_a_custom_rule_is_keyed_by_the_value_it_closes_over(replay):
    def loss(w):
        return jnp.sum(_custom_over_a_jit(w) ** 2)

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for _ in range(4):
        w, _, _ = _inputs(rng)
        _close(vg(w), jax.value_and_grad(loss)(w))
    s = compiled_autograd.stats()
    assert s.compiles == 4 and s.replays == 0 and "closes over holds another value" in s.reasons[-1]


def _custom_vjp_closing_over_forward(w, x):
    scale = x * 2.0  # not differentiated: a recorded value the backward closes over

    @jax.custom_vjp
    def f(y):
        return jnp.sin(y)

    f.defvjp(lambda y: (jnp.sin(y), jnp.cos(y)), lambda c, g: (g * c * scale,))
    return jnp.sum(f(w) * x)


def _custom_jvp_closing_over_forward(w, x):
    scale = jnp.tanh(x)

    @jax.custom_jvp
    def f(y):
        return jnp.sin(y)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), t[0] * scale))
    return jnp.sum(f(w) ** 2)


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("loss", [_custom_vjp_closing_over_forward, _custom_jvp_closing_over_forward])
def test_a_custom_rule_closing_over_a_forward_value_runs_under_vjp(loss, replay):
    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for _ in range(4):
        w, x = _rand(rng, 3), _rand(rng, 3)
        _close(vg(w, x), jax.value_and_grad(loss)(w, x))
    (fallback,) = compiled_autograd.stats().fallbacks
    assert "custom rule closes over a value the forward computed" in fallback and "jax.vjp" in fallback


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _scaled_tanh(x, s):
    return s * jnp.tanh(x)


_scaled_tanh.defvjp(lambda x, s: (s * jnp.tanh(x), jnp.tanh(x)), lambda s, t, g: (g * s * (1 - t ** 2),))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _halved_grad(f, x):
    return f(x)


_halved_grad.defvjp(lambda f, x: (f(x), x), lambda f, x, g: (jax.vjp(f, x)[1](g)[0] * 0.5,))


@pytest.mark.parametrize("replay", [False, True])
def test_a_custom_rule_s_nondiff_arguments_key_its_program_by_value(replay):
    """JAX boxes ``nondiff_argnums`` values anew each call: the step is keyed by what the box holds (type and value,
    as ``jit`` keys a static argument), so equal values reuse one program and another value compiles its own."""
    def loss(w, x, s):
        return jnp.sum(_scaled_tanh(x @ w, s) ** 2) + jnp.sum(_halved_grad(jnp.sin, x @ w))

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for s in (2.0, 2.0, 3.0, 2.0, 3.0, 2):  # 2 is an int: another program, as for jit
        w, x = _rand(rng, 4, 3), _rand(rng, 5, 4)
        _close(vg(w, x, s), jax.value_and_grad(loss)(w, x, s))
    assert compiled_autograd.stats().compiles == 3


def test_a_backward_captured_under_vjp_compiles_again_when_jax_s_configuration_changes():
    """Under ``jax.vjp`` capture the backward program is keyed by JAX's configuration too: its random bits
    (``jax_threefry_partitionable`` decides them) follow the setting, as ``jit``'s do."""
    def loss(w, key):
        noise = jax.random.uniform(key, w.shape) + 0.5  # not differentiated: the backward closes over it

        @jax.custom_vjp
        def f(y):
            return jnp.sin(y)

        f.defvjp(lambda y: (jnp.sin(y), jnp.cos(y)),
                 lambda c, g: (g * c * jax.random.uniform(jax.random.fold_in(key, 1), c.shape) * noise,))
        return jnp.sum(f(w))

    rng = np.random.default_rng()
    w, key = _rand(rng, 64), jax.random.key(int(rng.integers(1 << 30)))
    vg = jaxaot.compiled_value_and_grad(loss)
    before = jax.config.jax_threefry_partitionable
    try:
        for setting in (before, not before, before):
            jax.config.update("jax_threefry_partitionable", setting)
            _close(vg(w, key), jax.value_and_grad(loss)(w, key))
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    (fallback,) = compiled_autograd.stats().fallbacks
    assert "jax.vjp" in fallback and vg.cache_info().misses == 2


def test_a_custom_vjp_closing_over_a_differentiated_value_raises_jax_s_error_every_call():
    """A backward closing over a value computed from ``w`` itself: ``jax.value_and_grad`` raises
    ``UnexpectedTracerError``; the fallback under ``jax.vjp`` raises that error too, saying what to do, on every
    call, and a function without it keeps working."""

    def loss(w, x):
        c = jnp.sum(jnp.tanh(x * w))

        @jax.custom_vjp
        def f(v):
            return v * 2.0

        f.defvjp(lambda v: (v * 2.0, None), lambda _, g: (g * c,))
        return jnp.sum(f(w) ** 2)

    rng = np.random.default_rng()
    w, x = _rand(rng, 3), _rand(rng, 3)
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.value_and_grad(loss)(w, x)
    vg = jaxaot.compiled_value_and_grad(loss)
    for _ in range(2):  # JAX's own message where its trace of the backward finds the leak, else jaxaot's
        with pytest.raises(jax.errors.UnexpectedTracerError, match="residual|unexpected tracer"):
            vg(w, x)
    _close(jaxaot.compiled_value_and_grad(_custom_vjp_closing_over_forward)(w, x),
           jax.value_and_grad(_custom_vjp_closing_over_forward)(w, x))


def _from_dlpack(w, x):
    return jnp.sum(w * np.from_dlpack(jax.lax.stop_gradient(x * 2.0)))


def _addressable_data(w, x):
    return jnp.sum(w * np.asarray(jax.lax.stop_gradient(x).addressable_data(0)) + jnp.sin(w))


def _addressable_shards(w, x):
    return jnp.sum(w * np.asarray(jax.lax.stop_gradient(x).addressable_shards[0].data) + jnp.sin(w))


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("loss", [_from_dlpack, _addressable_data, _addressable_shards])
def test_reading_a_value_through_dlpack_or_its_buffer_is_a_look(loss, replay):
    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for _ in range(4):
        w, x = _rand(rng, 3), _rand(rng, 3)
        try:
            want = jax.value_and_grad(loss)(w, x)
        except BufferError:  # NumPy's from_dlpack reads host memory only: on a GPU eager JAX raises, and so must this
            with pytest.raises(BufferError):
                vg(w, x)
            continue
        _close(vg(w, x), want)
    assert compiled_autograd.stats().fallbacks == ()


SCHEDULE = {"wd": jnp.asarray(0.0)}


def _loss(params, x):
    return jnp.sum(jnp.sin(params["w"]) * x)


def test_a_param_hook_reads_python_state_when_the_step_compiles():
    """As under ``jax.jit``: an array the hook closes over, even replaced between steps, is the compile's."""
    vg = jaxaot.compiled_value_and_grad(_loss, param_hooks={"w": lambda p, g: g + SCHEDULE["wd"] * p})
    rng = np.random.default_rng()
    p, x = {"w": _rand(rng, 3)}, _rand(rng, 3)
    for wd in (0.5, 1.0, 2.0):
        SCHEDULE["wd"] = jnp.asarray(wd)
        _close(vg(p, x)[1]["w"], jax.grad(_loss)(p, x)["w"] + 0.5 * p["w"])


@pytest.mark.parametrize("replay", [False, True])
def test_a_per_step_hook_value_is_an_argument_applied_with_grad_hook(replay):
    """What the docs recommend for a value that changes per step (``docs/concepts/compiled_autograd.md``)."""
    def decayed(params, x, wd):
        w = jaxaot.grad_hook(params["w"], lambda g: g + wd * params["w"])
        return jnp.sum(jnp.sin(w) * x)

    vg = jaxaot.compiled_value_and_grad(decayed, replay=replay)
    rng = np.random.default_rng()
    for _ in range(4):
        p, x, wd = {"w": _rand(rng, 3)}, _rand(rng, 3), jnp.asarray(rng.uniform(), jnp.float32)
        value, grads = vg(p, x, wd)
        _close(value, _loss(p, x))
        _close(grads, {"w": jax.grad(_loss)(p, x)["w"] + wd * p["w"]})
    s = compiled_autograd.stats()
    assert s.compiles == 1 and s.replays == (3 if replay else 0)



def _scheduled(w, x, scale):
    h = jnp.tanh(x @ w) * scale
    return jnp.sum(h ** 2) if h.mean() > -10 else jnp.sum(h)  # a Python branch on data: a look


def _scheduled_jnp(w, x, scale):
    h = jnp.multiply(jnp.tanh(x @ w), scale)  # JAX copies a float64 array to float32, out of the operator's sight
    return jnp.sum(h ** 2) if h.mean() > -10 else jnp.sum(h)


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (2,)])
@pytest.mark.parametrize("forward", [_scheduled, _scheduled_jnp])
def test_a_numpy_array_written_in_place_between_steps_is_read_at_each_step(forward, shape, dtype, replay):
    """A host-side schedule refilled in place: whatever its shape, an array the forward reads, never replayed."""
    fresh_key = key_stream(100)
    scale = np.ones(shape, dtype)

    def loss(w, x):
        return forward(w, x, scale)

    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for step in range(CALLS):
        k = fresh_key()
        w, x = jax.random.normal(k, (3, 2)), normal_at(100 + step, (4, 3))
        scale[...] = np.asarray(jax.random.uniform(jax.random.fold_in(k, 1), shape, minval=0.5, maxval=3.0))
        assert_trees_close(vg(w, x), jax.value_and_grad(loss)(w, x))
    s = compiled_autograd.stats()
    assert s.replays == 0 and s.fallbacks == ()
    assert s.compiles == 1 or np.size(scale) == 1  # a one-element array is keyed by its value: one compile each


@pytest.mark.parametrize("replay", [False, True])
def test_a_one_element_numpy_array_argument_is_an_input_and_a_numpy_scalar_a_constant(replay):
    fresh_key = key_stream(200)
    for make in (lambda v: np.asarray(v, np.float32), lambda v: np.asarray([v]), np.float32, float, jnp.float32):
        compiled_autograd.reset()
        vg = jaxaot.compiled_value_and_grad(_scheduled, replay=replay)
        for _ in range(CALLS):
            k = fresh_key()
            w, x = jax.random.normal(k, (3, 2)), jax.random.normal(jax.random.fold_in(k, 1), (4, 3))
            scale = make(float(jax.random.uniform(jax.random.fold_in(k, 2), minval=0.5, maxval=3.0)))
            assert_trees_close(vg(w, x, scale), jax.value_and_grad(_scheduled)(w, x, scale))
        s = compiled_autograd.stats()
        assert s.fallbacks == ()
        if isinstance(scale, np.ndarray) and replay:  # an input of the guarded step, as an array of two elements
            assert s.compiles == 1 and s.replays == CALLS - 1


def test_numpy_scalars_jax_makes_constants_of_still_replay():
    """``jax.nn.gelu`` and ``np.float32(0.5) * h`` hand JAX one-element arrays it makes and drops: literals."""
    def loss(w, x):
        h = jax.nn.gelu(x @ w) * np.float32(0.5)
        return jax.nn.logsumexp(h) if h.mean() > -10 else jnp.sum(h)

    fresh_key = key_stream(300)
    vg = jaxaot.compiled_value_and_grad(loss, replay=True)
    for step in range(CALLS):
        w, x = jax.random.normal(fresh_key(), (3, 2)), normal_at(300 + step, (4, 3))
        assert_trees_close(vg(w, x), jax.value_and_grad(loss)(w, x))
    s = compiled_autograd.stats()
    assert s.compiles == 1 and s.replays == CALLS - 1 and s.fallbacks == ()


REVERSAL = {"strength": 0.1}


@jax.custom_vjp
def _reverse(x):
    return x


_reverse.defvjp(lambda x: (x, None), lambda _, g: (-REVERSAL["strength"] * g,))


def _adversarial(w, x):
    return jnp.sum(_reverse(jnp.tanh(x @ w)) ** 2)


def test_what_a_custom_rule_reads_is_read_at_each_call_as_eager_jax_runs_it():
    """A gradient-reversal strength a schedule changes in a global: each value is another program, as eager JAX
    reads it at every call, and the reason names the rule."""
    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(_adversarial)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    try:
        for strength in (0.1, 0.5, 1.0, 0.5):
            REVERSAL["strength"] = strength
            _close(vg(w, x), jax.value_and_grad(_adversarial)(w, x))
    finally:
        REVERSAL["strength"] = 0.1
    info = vg.cache_info()
    assert info.misses == 3 and "what its rule bwd reads besides its arguments changed" in info.entries[1].reason


@jax.custom_jvp
def _reverse_jvps(x):
    return x


_reverse_jvps.defjvps(lambda g, ans, x: -REVERSAL["strength"] * g)  # the rule jax builds closes over this lambda


def test_what_per_argument_jvp_rules_read_is_read_at_each_call():
    """``defjvps`` wraps the user's rules in a function of JAX's own: what they read is keyed all the same."""
    rng = np.random.default_rng()

    def loss(w, x):
        return jnp.sum(_reverse_jvps(jnp.tanh(x @ w)) * x[:, :2])

    vg = jaxaot.compiled_value_and_grad(loss)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    try:
        for strength in (0.1, 2.0, 0.1):
            REVERSAL["strength"] = strength
            _close(vg(w, x), jax.value_and_grad(loss)(w, x))
    finally:
        REVERSAL["strength"] = 0.1
    assert vg.cache_info().misses == 2
