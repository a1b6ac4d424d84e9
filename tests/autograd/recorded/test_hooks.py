"""grad_hook and param_hooks: what they change, in which order, and that they are in the traced backward."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot import compiled_autograd
from jaxaot._src.autograd.recorded import capture


def _loss(w, x, hook):
    h = jnp.tanh(x @ w)
    return jnp.sum(jaxaot.grad_hook(h, hook) ** 2)


def _reference(w, x, transform):
    """jax.grad with the hooked cotangent computed by hand: d loss/d h, transformed, then pulled back."""
    h, pull = jax.vjp(lambda w: jnp.tanh(x @ w), w)
    return pull(transform(2 * h))[0]


def test_grad_hook_changes_the_gradient_in_jax_grad_compiled_grad_and_aot_function():
    rng = np.random.default_rng(0)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    scale = lambda g: g * 3.0 + 1.0
    expected = _reference(w, x, scale)
    _close(jax.grad(_loss)(w, x, scale), expected)
    _close(jaxaot.compiled_grad(_loss)(w, x, scale), expected)
    aot = jaxaot.aot_function(lambda w, x: _loss(w, x, scale))
    _close(jax.grad(aot)(w, x), expected)


def test_a_list_of_hooks_runs_in_order_and_nested_calls_from_the_outside_in():
    rng = np.random.default_rng()
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    seen = []
    add = lambda g: (seen.append("add"), g + 1.0)[1]
    mul = lambda g: (seen.append("mul"), g * 2.0)[1]

    def chained(w, x):
        h = jnp.tanh(x @ w)
        h = jaxaot.grad_hook(jaxaot.grad_hook(h, add), mul)
        return jnp.sum(h ** 2)

    _close(jaxaot.compiled_grad(chained)(w, x), _reference(w, x, lambda g: g * 2.0 + 1.0))  # mul, then add
    assert seen == ["add", "mul"]  # traced as called
    _close(jaxaot.compiled_grad(_loss)(w, x, [add, mul]), _reference(w, x, lambda g: (g + 1.0) * 2.0))


@pytest.mark.parametrize("how", ["jax.grad", "compiled_grad", "replay", "aot_function"])
def test_each_hook_sees_the_whole_cotangent_of_its_value_used_twice(how):
    """A clip on ``y`` bounds ``y``'s whole cotangent, ``z = grad_hook(y, ...)``'s included: the gradient reaching
    ``x`` through ``y`` is clipped once, as a ``custom_vjp`` identity clipping its cotangent does."""
    rng = np.random.default_rng()
    x, c = _rand(rng, 8), _rand(rng, 8)
    clip = lambda g: jnp.clip(g, -0.1, 0.1)  # noqa: E731

    @jax.custom_vjp
    def clipped(v):
        return v

    clipped.defvjp(lambda v: (v, None), lambda _, g: (clip(g),))

    def loss(x, c, hook):
        y = hook(x * 1.0, clip)
        z = hook(y, lambda g: g)
        return jnp.sum(jnp.sin(y * c)) + jnp.sum(z * c)

    ours = functools.partial(loss, hook=jaxaot.grad_hook)
    grad = {"jax.grad": jax.grad(ours), "compiled_grad": jaxaot.compiled_grad(ours),
            "replay": jaxaot.compiled_grad(ours, replay=True), "aot_function": jax.grad(jaxaot.aot_function(ours))}[how]
    want = jax.grad(functools.partial(loss, hook=lambda v, h: clipped(v) if h is clip else v))(x, c)
    for _ in range(2):
        _close(grad(x, c), want)
    assert float(jnp.max(jnp.abs(want))) <= 0.1 + 1e-6


def test_hooks_are_traced_into_the_backward_jaxpr():
    rng = np.random.default_rng(2)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    _, vjp_fn = jax.vjp(lambda w: _loss(w, x, lambda g: jnp.cos(g)), w)
    program = capture.capture(vjp_fn, jnp.float32).program
    prims = [str(e.primitive) for e in program.jaxpr.eqns]
    assert "cos" in prims and not any("callback" in p for p in prims)
    aot = jaxaot.aot_function(lambda w, x: _loss(w, x, lambda g: jnp.cos(g)))
    backward = jaxaot.value_and_grad(aot).lower(w, x).backward
    assert "cos" in str(backward) and "callback" not in str(backward)


def test_param_hooks_run_on_the_accumulated_gradient():
    def f(p, x):
        h = jnp.tanh(x @ p["layer"]["w"]) + jnp.tanh(x @ p["layer"]["w"] * 0.5)  # w used twice
        return jnp.sum((h @ p["head"]) ** 2)

    rng = np.random.default_rng(3)
    p, x = {"layer": {"w": _rand(rng, 3, 4)}, "head": _rand(rng, 4, 1)}, _rand(rng, 5, 3)
    calls = []
    clip = lambda param, g: (calls.append(g.shape), jnp.clip(g, -0.1, 0.1))[1]
    sgd = lambda param, g: param - 0.5 * g  # an optimizer step inside the backward
    g = jaxaot.compiled_grad(f, param_hooks={"layer/w": clip, lambda path: path == "head": sgd})
    ref = jax.grad(f)(p, x)
    out = g(p, x)
    _close(out["layer"]["w"], jnp.clip(ref["layer"]["w"], -0.1, 0.1))
    _close(out["head"], p["head"] - 0.5 * ref["head"])
    assert calls == [(3, 4)]  # once, on the total gradient, at trace time
    g(p, x)
    assert compiled_autograd.stats().compiles == 1


def test_param_hooks_with_tuple_argnums_and_globs():
    f = lambda a, b: jnp.sum(jnp.sin(a["k"]) * b["k"])
    a, b = {"k": jnp.arange(3.0)}, {"k": jnp.ones(3)}
    out = jaxaot.compiled_grad(f, argnums=(0, 1), param_hooks={"*/k": lambda p, g: 2 * g})(a, b)
    _close(out, jax.tree_util.tree_map(lambda g: 2 * g, jax.grad(f, argnums=(0, 1))(a, b)))


def test_bad_hooks_raise_typed_errors_and_the_next_call_works():
    rng = np.random.default_rng(4)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    g = jaxaot.compiled_grad(_loss)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="must be callable"):
        g(w, x, "not a hook")
    with pytest.raises(jaxaot.errors.HookOutputError, match=r"f32\[4\].*f32\[4,2\]"):
        g(w, x, lambda c: c.sum(axis=1))
    with pytest.raises(jaxaot.errors.HookOutputError, match=r"f16\[4,2\].*f32\[4,2\]"):
        g(w, x, lambda c: c.astype(jnp.float16))
    with pytest.raises(jaxaot.errors.HookOutputError, match="param hook"):
        jaxaot.compiled_grad(_loss, param_hooks={"*": lambda p, c: c[0]})(w, x, lambda c: c)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="matches no differentiated parameter"):
        jaxaot.compiled_grad(_loss, param_hooks={"nope": lambda p, c: c})(w, x, lambda c: c)
    with pytest.raises(jaxaot.errors.InvalidInputError, match="must be callable"):
        jaxaot.compiled_grad(_loss, param_hooks={"*": 3})
    _close(g(w, x, lambda c: c), jax.grad(_loss)(w, x, lambda c: c))


def test_forward_mode_passes_through_a_hook():
    """``jax.jvp`` and ``jax.jacfwd`` compute no cotangent: a hooked value passes through as if unhooked (and so
    for a reverse pass over them), and a Hessian (forward over reverse) still sees the hook on its gradient."""
    plain = lambda x: jnp.sum(jnp.sin(x) ** 3)  # noqa: E731
    hooked = lambda x: jnp.sum(jnp.sin(jaxaot.grad_hook(x, lambda g: 2 * g)) ** 3)  # noqa: E731
    x, t = jax.random.normal(jax.random.key(0), (3,)), jax.random.normal(jax.random.key(1), (3,))
    chex.assert_trees_all_close(jax.jvp(hooked, (x,), (t,)), jax.jvp(plain, (x,), (t,)), rtol=1e-6)
    chex.assert_trees_all_close(jax.jacfwd(hooked)(x), jax.jacfwd(plain)(x), rtol=1e-6)
    chex.assert_trees_all_close(jax.hessian(hooked)(x), 2 * jax.hessian(plain)(x), rtol=1e-5)
    chex.assert_trees_all_close(jax.jacrev(jax.jacfwd(hooked))(x), jax.jacrev(jax.jacfwd(plain))(x), rtol=1e-5)


def _decayed(params, x, wd):
    """The weight-decay hook of the docs: it reads a forward value, the parameter itself."""
    w = jaxaot.grad_hook(params["w"], lambda g: g + wd * params["w"])
    return jnp.sum(jnp.sin(w) * x)


def test_a_hook_reading_a_forward_value_runs_under_every_reverse_mode_and_leaves_the_function_working():
    rng = np.random.default_rng()
    p, x, wd = {"w": _rand(rng, 5)}, _rand(rng, 5), jnp.float32(rng.uniform(0.05, 0.5))
    expected = jnp.cos(p["w"]) * x + wd * p["w"]
    aot = jaxaot.aot_function(_decayed)
    for run in (lambda: jax.grad(_decayed)(p, x, wd), lambda: jax.jit(jax.grad(_decayed))(p, x, wd),
                lambda: jaxaot.value_and_grad(_decayed)(p, x, wd)[1], lambda: jax.grad(aot)(p, x, wd),
                lambda: jaxaot.value_and_grad(aot)(p, x, wd)[1], lambda: jax.jit(jax.grad(aot))(p, x, wd),
                lambda: jaxaot.compiled_grad(_decayed)(p, x, wd)):
        _close(run()["w"], expected)
    _close(aot(p, x, wd), _decayed(p, x, wd))


def test_forward_mode_of_an_aot_function_passes_a_hooked_value_through_and_a_users_custom_vjp_refuses_it():
    rng = np.random.default_rng()
    w, x, t = _rand(rng, 3, 2), _rand(rng, 4, 3), _rand(rng, 3, 2)
    scale = lambda g: 5.0 * g  # noqa: E731
    aot = jaxaot.aot_function(lambda w: _loss(w, x, scale))
    want = jax.jvp(lambda w: _loss(w, x, scale), (w,), (t,))
    got = jax.jvp(aot, (w,), (t,))
    _close(got[0], want[0])
    _close(got[1], want[1])
    _close(jax.jacfwd(aot)(w), jax.jacfwd(lambda w: _loss(w, x, scale))(w))

    @jax.custom_vjp
    def mine(v):
        return jnp.sin(v)

    mine.defvjp(lambda v: (jnp.sin(v), v), lambda v, g: (g * jnp.cos(v),))
    with pytest.raises(TypeError, match="custom_vjp") as theirs:
        jax.jvp(lambda w: jnp.sum(mine(w)), (w,), (t,))
    with pytest.raises(TypeError, match="custom_vjp") as ours:
        jax.jvp(jaxaot.aot_function(lambda w: jnp.sum(mine(w))), (w,), (t,))
    assert str(ours.value) == str(theirs.value)


def test_forward_mode_over_a_jit_with_a_hook_inside_passes_it_through_where_the_docs_say():
    """Inside the ``jit`` (``jit`` of ``jvp``) and under an ``aot_function``, nested ``jit`` included, forward mode
    passes the hook through; ``jax.jvp`` of a plain ``jit`` function meets JAX's ``custom_vjp`` error, as documented."""
    rng = np.random.default_rng()
    x, t = _rand(rng, 4), _rand(rng, 4)
    plain = lambda x: jnp.sum(jnp.sin(x) ** 3)  # noqa: E731
    hooked = lambda x: jnp.sum(jnp.sin(jaxaot.grad_hook(x, lambda g: 2 * g)) ** 3)  # noqa: E731
    nested = lambda x: jax.jit(hooked)(x) + 1.0  # noqa: E731
    want = jax.jvp(plain, (x,), (t,))
    for got, offset in ((jax.jit(lambda x, t: jax.jvp(hooked, (x,), (t,)))(x, t), 0.0),
                        (jax.jvp(jaxaot.aot_function(hooked), (x,), (t,)), 0.0),
                        (jax.jvp(jaxaot.aot_function(nested), (x,), (t,)), 1.0)):
        _close(got[0], want[0] + offset)
        _close(got[1], want[1])
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(jax.jit(hooked), (x,), (t,))


def test_a_hooked_value_is_not_kept_after_its_step():
    """Nothing holds a hooked value once its backward ran: device memory stays flat over steps."""
    rng = np.random.default_rng()
    w, x = _rand(rng, 64, 64), _rand(rng, 256, 64)
    loss = lambda w, x: jnp.sum(jnp.tanh(jaxaot.grad_hook(x @ w, lambda g: 2 * g)) ** 2)  # noqa: E731
    for grad in (jax.grad(loss), jaxaot.compiled_grad(loss)):
        jax.block_until_ready(grad(w, x))
        before = sum(a.nbytes for a in jax.live_arrays())
        for _ in range(5):
            jax.block_until_ready(grad(w, x))
        assert sum(a.nbytes for a in jax.live_arrays()) <= before


_NORMS: list = []


def _log_norm(n):
    _NORMS.append(float(n))


def test_a_hook_logging_through_a_host_callback_compiles_once_and_calls_the_callback_it_was_given():
    rng = np.random.default_rng()
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)

    def logged(g, to=_log_norm):
        jax.debug.callback(to, jnp.linalg.norm(g))
        return g

    grad = jaxaot.compiled_grad(lambda w, x, to: jnp.sum(jnp.tanh(jaxaot.grad_hook(
        x @ w, functools.partial(logged, to=to))) ** 2))
    _NORMS.clear()
    for _ in range(3):
        grad(w, x, _log_norm)
    jax.effects_barrier()
    assert grad.cache_info().misses == 1 and len(_NORMS) == 3
    mine = []  # another callable (of another code): its own step, which calls it, not the first one
    grad(w, x, mine.append)
    jax.effects_barrier()
    assert len(mine) == 1 and len(_NORMS) == 3 and grad.cache_info().misses == 2
