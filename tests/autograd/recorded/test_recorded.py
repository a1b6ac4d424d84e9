"""The recorded forward of compiled_grad: lazy values, one program per structure, fallbacks.

Every gradient is compared with ``jax.grad`` (or ``nnx.grad``) on fresh random inputs.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, in_threads, rand as _rand
from jaxaot import compiled_autograd
from jaxaot._src.autograd.recorded import step, tape


def _no_fallback():
    assert compiled_autograd.stats().fallbacks == ()


def test_branches_on_data_record_lazily_and_compile_once_per_branch():
    def f(w, x):
        h = jnp.tanh(x @ w)
        if h.sum() > 0:  # Python needs this value: only x @ w, tanh and sum run eagerly
            return jnp.sum(h ** 2)
        return jnp.sum(jnp.cos(h))

    rng = np.random.default_rng(0)
    vg = jaxaot.compiled_value_and_grad(f)
    taken = set()
    for _ in range(10):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3) + rng.standard_normal()
        taken.add(bool(jnp.tanh(x @ w).sum() > 0))
        _close(vg(w, x), jax.value_and_grad(f)(w, x))
    assert taken == {True, False}
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (2, 8)
    _no_fallback()


def test_a_forward_that_looks_at_no_value_dispatches_nothing_before_the_step():
    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    rng = np.random.default_rng(1)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    leaves, tree = jax.tree_util.tree_flatten((w,))
    recorded = step.record(lambda w: (f(w, x), None), leaves, tree, eager=False)
    assert len(recorded.program.eqns) >= 3
    t = tape.Tape(eager=False)
    with jaxaot._src.compat.set_current_trace(t.trace):
        y = jnp.sin(t.diff_input(w)) * 2.0
    assert t.known(y.vid) is None  # recorded, not run
    np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(w)) * 2.0, rtol=1e-6)  # run on request


def test_loops_of_varying_length_compile_once_per_length():
    def f(w, x, n):
        for _ in range(n):
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    rng = np.random.default_rng(2)
    g = jaxaot.compiled_grad(f)
    for n in [2, 4, 2, 3, 4, 2]:
        w, x = _rand(rng, 4, 4), _rand(rng, 3, 4)
        _close(g(w, x, n), jax.grad(f)(w, x, n))
    s = compiled_autograd.stats()
    assert (s.compiles, s.hits) == (3, 3)
    assert "n: 2 → 4 (a Python value); the forward took another path: operation 4" in s.reasons[1]
    _no_fallback()


def test_python_loop_until_a_value_converges():
    def f(w, x):
        steps = 0
        while float(jnp.abs(x).max()) > 0.5 and steps < 6:  # the trip count depends on data
            x = 0.5 * jnp.tanh(x @ w)
            steps += 1
        return jnp.sum(x ** 2)

    def fixed(w, x, n):  # the reference: the trip count found on concrete values, then jax.grad
        for _ in range(n):
            x = 0.5 * jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    rng = np.random.default_rng(3)
    g = jaxaot.compiled_grad(f)
    counts = set()
    for _ in range(6):
        w, x = _rand(rng, 4, 4), 3 * _rand(rng, 2, 4)
        n, y = 0, x
        while float(jnp.abs(y).max()) > 0.5 and n < 6:
            y, n = 0.5 * jnp.tanh(y @ w), n + 1
        counts.add(n)
        _close(g(w, x), jax.grad(fixed)(w, x, n))
    assert compiled_autograd.stats().compiles == len(counts)
    _no_fallback()


def test_a_look_seen_before_starts_ahead_and_python_gets_the_same_value(monkeypatch):
    from jaxaot._src.autograd.recorded import force

    runs, started = [], []
    run, start = force.Plan.run, force.start_ahead
    monkeypatch.setattr(force.Plan, "run", lambda self, *a: runs.append(self) or run(self, *a))
    monkeypatch.setattr(force, "start_ahead", lambda node, values, trace, out, step=None: (
        start(node, values, trace, out, step), started.append(len(out))))
    seen = []

    def f(w, x, look):
        h = jnp.tanh(x @ w)
        if look:  # a Python flag: the same recording up to here either way
            m = float(h.mean())
            seen.append(m)
            h = h * 2.0 if m > 0 else h
        return jnp.sum(jnp.sin(h) ** 2)

    rng = np.random.default_rng(14)
    vg = jaxaot.compiled_value_and_grad(f)
    for i, look in enumerate([True, True, True, False, True]):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        runs.clear(), started.clear()
        m = float(jnp.tanh(x @ w).mean())
        doubled = look and m > 0
        reference = jax.value_and_grad(lambda w: jnp.sum(jnp.sin(jnp.tanh(x @ w) * (2.0 if doubled else 1.0)) ** 2))
        _close(vg(w, x, look), reference(w), tol=1e-5)
        if look:
            np.testing.assert_allclose(seen[-1], m, rtol=1e-5, atol=1e-6)
        # the first step compiles the look's program; the second starts it as soon as w and x are known and
        # takes its result; the third takes it from the step started ahead (the first two ran one step), and
        # branches the other way, so the fourth starts no step and starts the look's program for nothing (its
        # recording does not look); the last runs it when Python looks, as the first did
        assert (len(runs), sum(started)) == [(1, 0), (0, 1), (0, 0), (0, 1), (1, 0)][i]
    _no_fallback()


def test_aot_function_regions_and_while_loop_are_single_operations():
    region = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w))
    inner = jax.jit(lambda h, v: jnp.sin(h * v))

    def f(w, v, x):
        h = region(w, x)
        h = jaxaot.loops.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, inner(c[1], v)), (0, h), max_steps=3)[1]
        return jnp.sum(h ** 2) + jnp.sum(region(w, 2.0 * x))

    rng = np.random.default_rng(4)
    g = jaxaot.compiled_grad(f, argnums=(0, 1))
    for _ in range(3):
        w, v, x = _rand(rng, 3, 4), _rand(rng, 4), _rand(rng, 2, 3)
        _close(g(w, v, x), jax.grad(f, argnums=(0, 1))(w, v, x))
    leaves, tree = jax.tree_util.tree_flatten((w, v))
    recorded = step.record(lambda w, v: (f(w, v, x), None), leaves, tree, eager=False)
    prims = [str(e.prim) for e in recorded.program.eqns]
    assert prims.count("custom_vjp_call") == 2  # each region call is one recorded operation
    assert len(prims) < 20  # not inlined op by op
    assert compiled_autograd.stats().compiles == 1
    _no_fallback()


def test_one_compile_over_50_steps_and_a_reason_naming_the_change():
    def f(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"]) @ p["v"])

    rng = np.random.default_rng(5)
    vg = jaxaot.compiled_value_and_grad(f)
    p = {"w": _rand(rng, 5, 8), "v": _rand(rng, 8, 2)}
    for _ in range(50):
        x = _rand(rng, 4, 5)
        value, g = vg(p, x)
        _close((value, g), jax.value_and_grad(f)(p, x))
        p = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)
    assert (compiled_autograd.stats().compiles, compiled_autograd.stats().hits) == (1, 49)
    vg(p, _rand(rng, 7, 5))
    s = compiled_autograd.stats()
    assert s.compiles == 2
    assert s.reasons[1].endswith(".f): x: shape (4, 5) → (7, 5)")  # the argument by name, old vs new
    _no_fallback()


def test_closed_over_and_numpy_arrays_are_inputs_not_constants():
    scale = np.ones((4, 2), np.float32)
    bias = jnp.zeros(2)

    def f(w, x):
        return jnp.sum((x @ w * scale + bias) ** 2)

    rng = np.random.default_rng(6)
    g = jaxaot.compiled_grad(f)
    for i in range(4):
        scale[...] = rng.standard_normal((4, 2))  # mutated in place between steps
        bias = _rand(rng, 2)  # rebound between steps
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(g(w, x), jax.grad(f)(w, x))
    assert compiled_autograd.stats().compiles == 1
    _no_fallback()


def test_prints_and_debug_prints_show_values_once(capsys):
    def f(w, x):
        h = x @ w
        print("loss", float(jnp.sum(h)))
        jax.debug.print("debug {}", jnp.sum(h))
        return jnp.sum(h ** 2)

    rng = np.random.default_rng(7)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    g = jaxaot.compiled_grad(f)
    for _ in range(2):
        _close(g(w, x), jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w))
    out = capsys.readouterr().out.splitlines()
    expected = float(jnp.sum(x @ w))
    assert len([l for l in out if l.startswith("loss")]) == 2 and len([l for l in out if l.startswith("debug")]) == 2
    assert abs(float(out[0].split()[1]) - expected) < 1e-4
    _no_fallback()


def test_hooks_run_in_order_and_lambdas_made_each_step_do_not_recompile():
    seen = []

    def f(w, x):
        h = jnp.tanh(x @ w)
        s = jnp.mean(h)  # a forward value the hook closes over
        h = jaxaot.grad_hook(h, lambda g: (seen.append("add"), g + 1.0)[1])  # new lambdas every step
        h = jaxaot.grad_hook(h, lambda g: (seen.append("mul"), g * s)[1])
        return jnp.sum(h ** 2)

    def reference(w, x):  # the outer hook first: times the mean, then plus one
        h, pull = jax.vjp(lambda w: jnp.tanh(x @ w), w)
        return pull(2 * h * jnp.mean(h) + 1.0)[0]

    rng = np.random.default_rng(8)
    g = jaxaot.compiled_grad(f)
    for _ in range(5):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(g(w, x), reference(w, x))
    assert seen == ["add", "mul"] * 5  # each hook traced once per step, in order
    assert compiled_autograd.stats().compiles == 1
    _no_fallback()


def test_nnx_dropout_and_batch_norm_record_without_fallback():
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(5, 8, rngs=rngs)
            self.bn = nnx.BatchNorm(8, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)
            self.l2 = nnx.Linear(8, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    ours, ref = Net(nnx.Rngs(0, dropout=3)), Net(nnx.Rngs(0, dropout=3))
    g = jaxaot.compiled_grad(loss)
    rng = np.random.default_rng(9)
    for _ in range(4):
        x = _rand(rng, 6, 5)
        got, want = g(ours, x), nnx.grad(loss)(ref, x)
        _close(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), tol=1e-4)
        _close(ours.bn.mean[...], ref.bn.mean[...], tol=1e-5)  # batch statistics written back
    assert compiled_autograd.stats().compiles == 1
    _no_fallback()


def test_values_jax_needs_switch_to_eager_recording():
    def f(w, x):
        h = x @ w
        return jnp.sum(h[h > 0] ** 2)  # boolean-mask indexing: JAX needs the mask's value

    rng = np.random.default_rng(10)
    g = jaxaot.compiled_grad(f)
    for _ in range(3):
        w, x = _rand(rng, 3, 3), _rand(rng, 4, 3)
        _close(g(w, x), jax.grad(f)(w, x))
    (fallback,) = compiled_autograd.stats().fallbacks
    assert "NonConcreteBooleanIndexError" in fallback and "recording eagerly" in fallback


def test_what_cannot_be_recorded_falls_back_to_vjp_capture():
    noisy = jax.jit(lambda h: (jax.debug.print("inside {}", h.sum()), h * 2.0)[1])

    def f(w, x):
        return jnp.sum(noisy(x @ w) ** 2)  # a side effect inside a jit region

    rng = np.random.default_rng(11)
    g = jaxaot.compiled_grad(f)
    for _ in range(3):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(g(w, x), jax.grad(f)(w, x))
    s = compiled_autograd.stats()
    (fallback,) = s.fallbacks
    assert "jax.vjp" in fallback and s.compiles == 1


def test_the_forwards_own_errors_propagate_and_the_next_call_works():
    def f(w, x, bad):
        return jnp.sum((x @ x) if bad else (x @ w))

    w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    g = jaxaot.compiled_grad(f)
    with pytest.raises(TypeError, match="dot_general"):
        g(w, x, True)
    _close(g(w, x, False), jax.grad(f)(w, x, False))
    _no_fallback()


def _refusing_rule():
    @jax.custom_vjp
    def act(x):
        return jnp.sin(x)

    def bwd(x, g):
        if g.shape[-1] == 5:  # the user's own check, traced when the step compiles
            raise ValueError("act: width 5 is not supported")
        return (g * jnp.cos(x),)

    act.defvjp(lambda x: (jnp.sin(x), x), bwd)
    return lambda w, x: jnp.sum(act(jnp.tanh(x @ w)) ** 2), {}


def _refusing_hook():
    def clip(p, g):
        if g.shape[-1] == 5:
            raise ValueError("clip: width 5 is not supported")
        return jnp.clip(g, -1.0, 1.0)

    return lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2), {"param_hooks": {lambda path: True: clip}}


@pytest.mark.parametrize("make", [_refusing_rule, _refusing_hook])
def test_a_step_refusing_one_call_leaves_the_function_recording_lazily(make):
    """The user's error from the compiled step (a custom rule, a parameter hook) is the call's, not lazy
    recording's: eager recording, retried, fails the same way, and the function keeps its mode and replays."""
    loss, options = make()
    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=True, **options)
    vg(_rand(rng, 3, 2), _rand(rng, 4, 3))
    with pytest.raises(ValueError, match="width 5 is not supported"):
        vg(_rand(rng, 3, 5), _rand(rng, 4, 3))
    before = compiled_autograd.stats().replays
    for _ in range(3):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        got = vg(w, x)
        if not options:
            _close(got, jax.value_and_grad(loss)(w, x))
    assert compiled_autograd.stats().replays - before == 3
    _no_fallback()


def test_aux_outputs_come_back_concrete():
    def f(w, x):
        h = x @ w
        return jnp.sum(h ** 2), {"h": h, "n": 3, "mean": jnp.mean(h)}

    rng = np.random.default_rng(12)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    (value, aux), grad = jaxaot.compiled_value_and_grad(f, has_aux=True)(w, x)
    (rv, raux), rg = jax.value_and_grad(f, has_aux=True)(w, x)
    _close((value, aux, grad), (rv, raux, rg))
    assert isinstance(aux["h"], jax.Array) and not isinstance(aux["h"], jax.core.Tracer)


def test_nested_transforms_inside_the_forward():
    def f(w, x):
        c, ys = jax.lax.scan(lambda c, xi: (jnp.tanh(c @ w + xi), c.sum()), jnp.zeros(3), x)
        v = jax.vmap(lambda r: jnp.dot(r, w).sum())(x)
        penalty = jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)  # a gradient inside the forward
        return jnp.sum(c) + ys.sum() + v.sum() + jnp.sum(penalty ** 2)

    rng = np.random.default_rng(13)
    g = jaxaot.compiled_grad(f)
    for _ in range(2):
        w, x = _rand(rng, 3, 3), _rand(rng, 5, 3)
        _close(g(w, x), jax.grad(f)(w, x), tol=1e-4)
    assert compiled_autograd.stats().compiles == 1
    _no_fallback()


def test_eight_threads_with_branches_compile_each_structure_once():
    def f(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2) if h.mean() > 0 else jnp.sum(jnp.sin(h))

    vg = jaxaot.compiled_value_and_grad(f)
    rng = np.random.default_rng(14)
    w = _rand(rng, 3, 2)
    inputs = [(w, jnp.abs(_rand(rng, 4, 3))), (w, -jnp.abs(_rand(rng, 4, 3))), (w, _rand(rng, 5, 3))]

    def step(i, k):
        args = inputs[(i + k) % 3]
        _close(vg(*args)[1], jax.grad(f)(*args))

    in_threads(step)
    s = compiled_autograd.stats()
    structures = {bool(jnp.tanh(x @ w).mean() > 0) for _, x in inputs[:2]}
    assert structures == {True, False}
    assert s.compiles == 3 and s.hits == 8 * 6 - 3
    _no_fallback()


def test_a_finished_recording_is_freed_by_reference_counting_and_an_escaped_tracer_still_answers():
    """A recording is no reference cycle once it ends: the tape, its trace and the arrays they hold (the step's
    outputs, the looked-at values) go as the step returns, not at the cycle collector's next pass; a tracer that
    escaped still keeps its recording, and answers as before."""
    escaped = []

    def loss(w, x):
        h = jnp.tanh(x @ w)
        if h.mean() > -2.0:  # a look, every step
            h = h * 2.0
        escaped[:] = [h.sum()]
        return jnp.sum(h ** 2)

    rng = np.random.default_rng()
    w, x = _rand(rng, 5, 4), _rand(rng, 3, 5)
    vg = jaxaot.compiled_value_and_grad(loss)
    for _ in range(3):
        _close(vg(w, x), jax.value_and_grad(loss)(w, x))
    escaped.clear()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            vg(w, x)
        escaped.clear()
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not cyclic & {"Tape", "RecordingTrace", "ArrayImpl", "Started"}, cyclic
    vg(w, x)
    (leaked,) = escaped
    assert float(leaked) == pytest.approx(float(jnp.sum(jnp.tanh(x @ w) * 2.0)), rel=1e-5)
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jnp.sin(leaked)
