"""A step started before its recording ends gives exactly what running it after the recording gives.

Each call is compared with ``jax.value_and_grad`` on fresh random inputs, and bit
for bit with the step's executable run after the recording; the calls whose started
step was used, and those whose started step was dropped, are counted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot._src.autograd.recorded import ahead, force, step


@pytest.fixture
def taken(monkeypatch):
    """``[started steps used, started steps dropped]``, counted as calls finish."""
    counts = [0, 0]
    finish = ahead.Ahead.finish

    def counted(self, started, exe, args, objects, arrays, looks=None):
        out = finish(self, started, exe, args, objects, arrays, looks)
        if started is not None:
            counts[out is None] += 1
        return out

    monkeypatch.setattr(ahead.Ahead, "finish", counted)
    return counts


def _after(f, params, *args):
    """``(value, grads)`` of ``f``'s step executable run after a recording (what a call without a step
    started ahead returns)."""
    leaves, tree = jax.tree_util.tree_flatten((params,))
    recorded = step.record(lambda p: (f(p, *args), None), leaves, tree, eager=False)
    value, _, grads, _ = step.run(recorded, (), leaves, lambda s: "test")
    return value, jax.tree_util.tree_unflatten(tree, grads)[0]


def _same_bits(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def mlp(params, x, y):
    h = x
    for w, b in params:
        h = jax.nn.gelu(h @ w + b)
    return jnp.mean((h - y) ** 2)


def test_a_started_step_on_new_arguments_each_call_is_the_step_run_after(taken):
    rng = np.random.default_rng(0)
    vg = jaxaot.compiled_value_and_grad(mlp)
    for _ in range(6):  # new parameters and batch arrays every call: the step reads them by position
        params = [(_rand(rng, 4, 4), _rand(rng, 4)) for _ in range(2)]
        x, y = _rand(rng, 3, 4), _rand(rng, 3, 4)
        got = vg(params, x, y)
        _close(got, jax.value_and_grad(mlp)(params, x, y))
        _same_bits(got, _after(mlp, params, x, y))
    assert taken == [4, 0]  # from the third call on (two calls in a row ran one executable)


def test_a_path_that_changes_drops_the_started_step_and_waits(taken):
    def f(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2) if h.mean() > 0 else jnp.sum(jnp.sin(h))

    rng = np.random.default_rng(1)
    vg = jaxaot.compiled_value_and_grad(f)
    w = _rand(rng, 3, 2)
    signs = [1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1]
    for sign in signs:  # the branch taken follows the batch's sign
        x = sign * (abs(_rand(rng, 4, 3)) + 0.1)
        w = abs(w)
        got = vg(w, x)
        _close(got, jax.value_and_grad(f)(w, x))
        _same_bits(got, _after(f, w, x))
    # used from the 3rd call on; dropped at each change of side, after which one call waits and the next learns
    assert taken == [5, 2]


def test_arrays_the_forward_closes_over_are_followed_by_identity(taken):
    rng = np.random.default_rng(2)
    held = {"w2": _rand(rng, 2, 2)}

    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) @ held["w2"])

    vg = jaxaot.compiled_value_and_grad(f)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    old = held["w2"]  # still alive: the step started after the swap reads it
    for k in range(8):
        if k == 5:
            held["w2"] = _rand(rng, 2, 2)  # a new array of the same type
        got = vg(w, x)
        _close(got, jax.value_and_grad(f)(w, x))
        _same_bits(got, _after(f, w, x))
    assert taken == [4, 1] and old is not held["w2"]  # the call after the swap dropped the step it started

    as_numpy = {"w2": np.asarray(_rand(rng, 2, 2))}  # copied to the device at each call: never started
    g = jaxaot.compiled_value_and_grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) @ as_numpy["w2"]))
    before = list(taken)
    for _ in range(4):
        _close(g(w, x), jax.value_and_grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) @ as_numpy["w2"]))(w, x))
    assert taken == before


def test_numpy_differentiated_leaves_start_no_step(taken):
    f = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
    vg = jaxaot.compiled_value_and_grad(f)
    rng = np.random.default_rng(4)
    w, x = np.array(_rand(rng, 3, 2)), _rand(rng, 4, 3)
    for _ in range(4):
        _close(vg(w, x), jax.value_and_grad(f)(w, x))
        w += 0.5  # the caller changes its array in place between calls
    assert taken == [0, 0]


def test_a_forward_that_raises_starts_nothing_until_it_runs_twice_again(taken):
    def f(w, fail):
        if fail:
            raise ValueError("the forward's own error")
        return jnp.sum(jnp.tanh(w) ** 2)

    vg = jaxaot.compiled_value_and_grad(f)
    w = jnp.arange(3.0)
    for fail in (False, False, False, True, False, False, False):
        if fail:
            with pytest.raises(ValueError):
                vg(w, fail)
        else:
            _close(vg(w, fail), jax.value_and_grad(f)(w, fail))
    assert taken == [2, 0]  # used at calls 3 and 7; the one started at call 4 went with its error


def test_misses_in_a_row_wait_twice_as_long_each_time():
    state, x = ahead.Ahead(), jnp.ones(2)
    exes = [lambda diff, args, k=k: ("ran", k) for k in range(2)]

    def call(k):  # a call whose recording ends at executable k: whether one was started, whether it was used
        started = state.start([x], [x])
        return started is not None, state.finish(started, exes[k], [x], [x], [x]) is not None

    ends = [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1]  # where each call's recording ends
    got = [call(k) for k in ends]
    assert not any(used for _, used in got)  # each started step was the other one
    # two calls in a row at 0: the 3rd starts it; after the n-th miss in a row, 2**(n-1) calls pass before one
    # learns the executable again, and the call after that starts it
    assert [i for i, (started, _) in enumerate(got) if started] == [2, 4, 7, 12]
    calls = [call(1) for _ in range(8)]  # waits out its last miss, learns 1, then starts it and uses it
    assert calls == [(False, False)] * 5 + [(True, True)] * 3
    assert state.backoff == 1  # after a hit, a miss waits one call again


def test_the_setting_off_starts_no_step(taken):
    rng = np.random.default_rng(3)
    vg = jaxaot.compiled_value_and_grad(mlp)
    params = [(_rand(rng, 4, 4), _rand(rng, 4)) for _ in range(2)]
    x, y = _rand(rng, 3, 4), _rand(rng, 3, 4)
    with jaxaot.config.override(start_steps_ahead=False):
        for _ in range(4):
            _same_bits(vg(params, x, y), _after(mlp, params, x, y))
    assert taken == [0, 0]
    _same_bits(vg(params, x, y), _after(mlp, params, x, y))  # on again: the executable two calls ran starts
    assert taken == [1, 0]


@pytest.fixture
def look_programs(monkeypatch):
    """``[looks given by a started step, look programs run when Python looked, look programs started ahead]``."""
    counts = [0, 0, 0]
    look, run, start = ahead.Started.look, force.Plan.run, force.start_ahead

    def served(self, plan, args):
        out = look(self, plan, args)
        counts[0] += out is not None
        return out

    def ran(self, values, trace):
        counts[1] += 1
        return run(self, values, trace)

    def started(node, values, trace, begun, step=None):
        before = len(begun)
        start(node, values, trace, begun, step)
        counts[2] += len(begun) - before

    monkeypatch.setattr(ahead.Started, "look", served)
    monkeypatch.setattr(force.Plan, "run", ran)
    monkeypatch.setattr(force, "start_ahead", started)
    return counts


def test_a_started_step_gives_the_values_python_looks_at(taken, look_programs):
    def f(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2) if h.mean() > -1.0 else jnp.sum(jnp.sin(h))

    rng = np.random.default_rng(6)
    vg = jaxaot.compiled_value_and_grad(f)
    for _ in range(6):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        got = vg(w, x)
        _close(got, jax.value_and_grad(f)(w, x))
        _same_bits(got, _after(f, w, x))
    # the first two calls compute the look with its own program; from the third the started step gives it
    assert taken == [4, 0] and look_programs[0] == 4
    assert look_programs[1] + look_programs[2] <= 2 + 6  # (and each _after's recording one)


def test_a_look_after_an_array_the_step_was_not_given_runs_its_own_program(taken, look_programs):
    rng = np.random.default_rng(7)
    held = {"w2": _rand(rng, 2, 2)}

    def f(w, x):
        h = jnp.tanh(x @ w) @ held["w2"]
        return jnp.sum(h ** 2) if h.mean() > -10.0 else jnp.sum(h)

    vg = jaxaot.compiled_value_and_grad(f)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    for k in range(5):
        vg(w, x)
    served = look_programs[0]
    old, held["w2"] = held["w2"], 100.0 * _rand(rng, 2, 2)  # read before the look: its value is not the step's
    got = vg(w, x)
    _close(got, jax.value_and_grad(f)(w, x))
    _same_bits(got, _after(f, w, x))
    assert look_programs[0] == served and taken[1] == 1 and old is not held["w2"]


def test_off_a_cpu_python_reads_a_started_step_s_look_from_host_memory(taken, monkeypatch):
    """Off a CPU the step returns the looked-at values in pinned host memory too (CPU stands in: its pinned host
    memory kind exists). A look a started step gives is read there by Python, and the recording goes on from the
    value in device memory: the same losses and gradients as the step run after the recording and as JAX."""
    monkeypatch.setattr(step, "HOST_COPY_PLATFORMS", step.HOST_COPY_PLATFORMS | {"cpu"})
    given = []
    look = ahead.Started.look

    def served(self, plan, args):
        out = look(self, plan, args)
        if out is not None:
            given.append(out)
        return out

    monkeypatch.setattr(ahead.Started, "look", served)

    def f(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2) * h.mean() if h.mean() > 0.0 else jnp.sum(jnp.sin(h))

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(f)
    w = _rand(rng, 3, 2)
    for sign in (1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0):
        x = _rand(rng, 4, 3)
        x = x * sign * jnp.sign(jnp.mean(jnp.tanh(x @ w)))  # the branch the sign asks for
        got = vg(w, x)
        _close(got, jax.value_and_grad(f)(w, x))
        _same_bits(got, _after(f, w, x))
    assert given and taken[0] >= 2
    assert {value.sharding.memory_kind for value, _ in given} == {"device"}
    assert {read.sharding.memory_kind for _, read in given} == {"pinned_host"}


@jax.custom_vjp
def _logged_sin(x):
    return jnp.sin(x)


_BACKWARD_LOG: list = []
_logged_sin.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)),
                   lambda c, g: (jax.debug.callback(_BACKWARD_LOG.append, g.sum()) or g * c,))


@pytest.mark.parametrize("replay", [False, True])
def test_a_step_with_host_callbacks_is_never_run_on_a_guess(replay):
    """A callback in a custom rule's backward runs once per call, for the branch taken, as under
    ``jax.value_and_grad``: the step holding it is not started ahead (nor replayed before its guards confirm it),
    where a dropped run would have run it too, for a branch Python did not take."""
    def loss(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(_logged_sin(h) ** 2) if h.mean() > 0 else jnp.sum(_logged_sin(2 * h))

    rng = np.random.default_rng()
    w, x = jnp.abs(_rand(rng, 4, 4)), jnp.abs(_rand(rng, 3, 4))
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for xs in (x, x, x, -x, -x, -x, x):
        _BACKWARD_LOG.clear()
        want = jax.value_and_grad(loss)(w, xs)
        jax.effects_barrier()
        expected, _BACKWARD_LOG[:] = list(_BACKWARD_LOG), []
        _close(vg(w, xs), want)
        jax.effects_barrier()
        assert len(_BACKWARD_LOG) == 1
        np.testing.assert_allclose(_BACKWARD_LOG, expected, rtol=1e-5)
