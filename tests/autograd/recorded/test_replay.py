"""replay=True: the compiled step runs without the forward's Python while its guards hold, and never stale.

Every loss and gradient is compared with ``jax.value_and_grad`` on fresh random
inputs, replayed or recorded; the counts say which calls replayed.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, in_threads, rand as _rand
from jaxaot import compiled_autograd
from zoo import ZOO


def _scalar(fn):
    """``fn`` made a loss: the sum of squares of its float outputs."""

    def loss(*args):
        leaves = jax.tree_util.tree_leaves(fn(*args))
        return sum(jnp.sum(jnp.square(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))

    return loss


def _float_positions(args):
    return tuple(i for i, a in enumerate(args)
                 if all(jnp.issubdtype(jnp.result_type(x), jnp.floating) for x in jax.tree_util.tree_leaves(a)))


def _replays():
    return compiled_autograd.stats().replays


#: The zoo entries the default suite replays; the rest run in the slow suite.
CHEAP = ("mlp_gelu", "cond", "custom_jvp", "int_outputs")


@pytest.mark.parametrize("name", [n if n in CHEAP else pytest.param(n, marks=pytest.mark.slow) for n in ZOO])
def test_replay_matches_jax_on_the_zoo(name):
    fn, make_args = ZOO[name]
    loss = _scalar(fn)
    args = make_args(jax.random.key(0))
    nums = _float_positions(args)
    vg = jaxaot.compiled_value_and_grad(loss, argnums=nums, replay=True)
    for i in range(3):
        args = make_args(jax.random.key(i))
        _close(vg(*args), jax.value_and_grad(loss, argnums=nums)(*args), tol=1e-4)
    assert _replays() == 2 and compiled_autograd.stats().compiles == 1


def branchy(params, x):
    h = jnp.tanh(x @ params["w1"])
    if h.mean() > 0:  # the guarded look
        h = h * params["s"]
    else:
        h = jnp.sin(h) + params["s"]
    return jnp.mean((h @ params["w2"]) ** 2)


BRANCH_LINE = branchy.__code__.co_firstlineno + 2


def _inputs(rng, sign):
    p = {"w1": _rand(rng, 5, 8), "w2": _rand(rng, 8, 3), "s": _rand(rng, 8)}
    x = _rand(rng, 4, 5)
    taken = bool(jnp.tanh(x @ p["w1"]).mean() > 0)
    return (p, x) if taken == sign else (p, -x)


def test_a_branch_guard_replays_each_side_and_records_when_the_outcome_is_new():
    rng = np.random.default_rng(0)
    vg = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for sign in (True, True, False, False, True):
        args = _inputs(rng, sign)
        _close(vg(*args), jax.value_and_grad(branchy)(*args))
    s = compiled_autograd.stats()
    assert (s.compiles, s.replays) == (2, 3)  # calls 2, 4 and 5 replayed
    reason = vg.cache_info().entries[1].reason
    assert f"Python branch at {__file__}:{BRANCH_LINE}" in reason, reason
    assert reason.count("took the other side (the condition was True, now False)") == 1, reason


def test_a_step_run_ahead_is_kept_only_when_its_looks_agree(monkeypatch):
    from jaxaot._src.autograd.recorded import replay

    looks_run = []
    walk = replay.run
    monkeypatch.setattr(replay, "run", lambda *a: looks_run.append(1) or walk(*a))
    rng = np.random.default_rng(2)
    vg = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for sign in (True, False):  # both sides recorded; the second call's ahead run (True) was dropped
        vg(*_inputs(rng, sign))
    for _ in range(replay.WALK_AFTER_MISS):  # after a dropped run, calls look value by value for a while
        vg(*_inputs(rng, False))
    assert len(looks_run) == 1 + replay.WALK_AFTER_MISS
    for sign in (False,) * 3 + (True, False) * 3:  # the same side runs ahead and is kept; the others never stale
        args = _inputs(rng, sign)
        _close(vg(*args), jax.value_and_grad(branchy)(*args))
    assert len(looks_run) == 1 + replay.WALK_AFTER_MISS + 6  # 3 kept; the first True dropped, the 5 after it walk
    assert compiled_autograd.stats().compiles == 2 and _replays() == replay.WALK_AFTER_MISS + 9


def test_a_new_outcome_whose_step_exists_is_an_entry_naming_the_value():
    rng = np.random.default_rng(1)
    first = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for sign in (True, False):
        first(*_inputs(rng, sign))
    other = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for sign in (True, False, False):
        args = _inputs(rng, sign)
        _close(other(*args), jax.value_and_grad(branchy)(*args))
    info = other.cache_info()
    assert compiled_autograd.stats().compiles == 2 and info.hits == 2  # the shared steps; one replay
    (entry,) = info.entries
    assert entry.program == "replay" and entry.compiles == ()
    assert entry.reason.startswith("compiled_grad(branchy): recorded again: Python branch at ")
    assert "(the condition was True, now False)" in entry.reason


def test_python_side_effects_run_every_step_unless_replay_is_asked_for(capsys):
    counter = []

    def f(w, x):
        counter.append(1)
        print("forward ran")
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    rng = np.random.default_rng(2)
    for replay, runs in ((False, 4), (True, 1)):
        counter.clear()
        vg = jaxaot.compiled_value_and_grad(f, replay=replay)
        for _ in range(4):
            w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
            _close(vg(w, x), jax.value_and_grad(f)(w, x))
        assert len(counter) == runs + 4  # jax.value_and_grad ran it four times too
    assert capsys.readouterr().out.count("forward ran") == 4 + 1 + 8


def test_loop_counts_and_values_python_read_are_guarded():
    def looped(w, x, n):
        for _ in range(n):  # a static argument: part of the key
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def converge(w, x):
        while float(jnp.abs(x).max()) > 0.5:  # Python reads a float: a new value records again
            x = 0.5 * jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    def fixed(w, x, n):  # the reference: the trip count found on concrete values, then jax.value_and_grad
        for _ in range(n):
            x = 0.5 * jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    def trips(w, x):
        n = 0
        while float(jnp.abs(x).max()) > 0.5:
            x, n = 0.5 * jnp.tanh(x @ w), n + 1
        return n

    rng = np.random.default_rng(3)
    g = jaxaot.compiled_value_and_grad(looped, replay=True)
    for n in (2, 3, 2, 3, 2):
        w, x = _rand(rng, 4, 4), _rand(rng, 3, 4)
        _close(g(w, x, n), jax.value_and_grad(looped)(w, x, n))
    assert _replays() == 3
    c = jaxaot.compiled_value_and_grad(converge, replay=True)
    for _ in range(3):
        w, x = _rand(rng, 4, 4), 3 * _rand(rng, 2, 4)
        _close(c(w, x), jax.value_and_grad(fixed)(w, x, trips(w, x)))
    assert _replays() == 3  # every float differed: each call recorded


def test_what_the_arguments_do_not_fix_is_recorded_every_step(capsys):
    box = [jnp.ones(3)]

    def closes_over(w):
        return jnp.sum(w * box[0])  # an array read from outside the arguments

    def debug_prints(w):
        jax.debug.print("w0 {}", w[0])  # a host callback
        return jnp.sum(w ** 2)

    rng = np.random.default_rng(4)
    a = jaxaot.compiled_value_and_grad(closes_over, replay=True)
    b = jaxaot.compiled_value_and_grad(debug_prints, replay=True)
    for _ in range(3):
        box[0] = _rand(rng, 3)
        w = _rand(rng, 3)
        _close(a(w), jax.value_and_grad(closes_over)(w))
        _close(b(w), jax.value_and_grad(lambda w: jnp.sum(w ** 2))(w))
    assert _replays() == 0
    assert capsys.readouterr().out.count("w0") == 3


def test_new_shapes_and_static_values_record_and_say_why():
    def f(w, x, scale):
        return jnp.sum(jnp.tanh(x @ w) * scale)

    rng = np.random.default_rng(5)
    vg = jaxaot.compiled_value_and_grad(f, replay=True)
    for rows, scale in ((4, 1.0), (4, 1.0), (6, 1.0), (6, 2.0), (4, 1.0)):
        w, x = _rand(rng, 3, 2), _rand(rng, rows, 3)
        _close(vg(w, x, scale), jax.value_and_grad(f)(w, x, scale))
    assert _replays() == 2
    reasons = [e.reason for e in vg.cache_info().entries]
    assert reasons[1].endswith("x: shape (4, 3) → (6, 3)") and "scale: 1.0 → 2.0" in reasons[2]


def test_past_the_most_keys_only_the_oldest_is_dropped(monkeypatch):
    """A function called with more call keys than it keeps trees for forgets the oldest key alone: the keys
    called since still replay, and the forgotten one records once, then replays again."""
    monkeypatch.setattr("jaxaot._src.autograd.recorded.replay.MAX_KEYS", 3)
    f = lambda x: jnp.sum(jnp.tanh(x) ** 2)  # noqa: E731
    vg = jaxaot.compiled_value_and_grad(f, replay=True)
    rng = np.random.default_rng()
    replayed = []
    for n in (1, 2, 3, 4, 3, 4, 1, 1):  # keys 1, 2, 3; 4 drops 1; 1 drops 2
        x = _rand(rng, n)
        before = _replays()
        _close(vg(x), jax.value_and_grad(f)(x))
        replayed.append(_replays() - before)
    assert replayed == [0, 0, 0, 0, 1, 1, 0, 1]


def test_a_key_with_more_paths_than_a_routing_layer_has_keeps_every_one():
    """Past 64 outcomes under one key (4 tokens routed among 3 experts have 81 paths) each path replays once seen;
    only past ``MAX_PATHS`` in all does the oldest tree go."""
    runs = []

    def f(w, a):
        runs.append(int(a) % 2)  # Python looks at the value (the outcome is the whole int): a path per value
        return jnp.sum(jnp.tanh(w) ** 2)

    vg = jaxaot.compiled_value_and_grad(f, replay=True)
    w, values = _rand(np.random.default_rng(), 3), [jnp.int32(i) for i in range(90)]
    for a in values * 2:
        _close(vg(w, a), jax.value_and_grad(f)(w, a))
    runs.clear()
    for a in values:
        vg(w, a)
    assert runs == []  # every call replayed: no forward's Python ran
    assert compiled_autograd.stats().compiles == 1  # one structure for every path


def test_a_float_python_read_is_guarded_by_its_bits_signed_zero_and_nan_too():
    """``-0.0`` and ``0.0`` compare equal, but Python tells them apart (``math.copysign``): a replay recorded at
    one never answers for the other. A NaN, equal to nothing, replays the NaN's recording (also complex)."""
    import math

    def loss(w, x):
        s = float(x)
        return jnp.sum(w) * math.copysign(1.0, s) * (2.0 if s != s else 1.0)

    def cplx(w, x):
        z = complex(x)
        return jnp.sum(w) * math.copysign(1.0, z.imag)

    rng = np.random.default_rng()
    vg = jaxaot.compiled_value_and_grad(loss, replay=True)
    for v in (0.0, -0.0, 0.0, -0.0, float("nan"), float("nan"), -0.0):
        w, x = _rand(rng, 3), jnp.asarray(v, jnp.float32)
        _close(vg(w, x), jax.value_and_grad(loss)(w, x))
    assert _replays() == 4  # the second +0.0, both later -0.0s, the second NaN
    c = jaxaot.compiled_value_and_grad(cplx, replay=True)
    for v in (0j, complex(0.0, -0.0), 0j, complex(0.0, -0.0)):
        w, x = _rand(rng, 3), jnp.asarray(v, jnp.complex64)
        _close(c(w, x), jax.value_and_grad(cplx)(w, x))
    assert _replays() == 6


def test_aux_outputs_numpy_arguments_and_keywords_replay():
    def f(w, x, *, shift):
        h = x @ w + shift
        return jnp.sum(h ** 2), {"h": h, "tag": "ok"}

    rng = np.random.default_rng(6)
    vg = jaxaot.compiled_value_and_grad(f, has_aux=True, replay=True)
    for _ in range(3):
        w = _rand(rng, 3, 2)
        x = rng.standard_normal((4, 3)).astype(np.float32)  # NumPy: an array argument like any other
        shift = _rand(rng, 2)
        (value, aux), g = vg(w, x, shift=shift)
        (rv, raux), rg = jax.value_and_grad(f, has_aux=True)(w, x, shift=shift)
        _close((value, aux["h"], g), (rv, raux["h"], rg))
        assert aux["tag"] == "ok"
    assert _replays() == 2


def test_eight_threads_replay_both_sides_of_a_branch():
    rng = np.random.default_rng(7)
    inputs = [_inputs(rng, True), _inputs(rng, False)]
    vg = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for args in inputs:
        vg(*args)

    def step(i, k):
        args = inputs[(i + k) % 2]
        _close(vg(*args), jax.value_and_grad(branchy)(*args))

    in_threads(step)
    s = compiled_autograd.stats()
    assert s.compiles == 2 and s.replays == 8 * 6


def test_replay_must_be_a_bool():
    with pytest.raises(jaxaot.errors.InvalidInputError, match="replay"):
        jaxaot.compiled_value_and_grad(branchy, replay="yes")


def test_the_concept_page_blocks_run():
    page = Path(__file__).resolve().parents[3] / "docs" / "concepts" / "compiled_autograd.md"
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
    assert len(blocks) == 4  # the first example, the callback's log, replay's, and param_hooks' (in its list item)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - the page's own examples
    assert len(namespace["runs"]) == 2


def test_hooks_replay_as_they_were_traced():
    def f(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(jaxaot.grad_hook(h, lambda g: 2.0 * g) ** 2)  # a new lambda each recorded step

    def reference(w, x):
        h, pull = jax.vjp(lambda w: jnp.tanh(x @ w), w)
        return jnp.sum(h ** 2), jnp.clip(pull(4.0 * h)[0], -0.5, 0.5)

    rng = np.random.default_rng(8)
    vg = jaxaot.compiled_value_and_grad(f, replay=True, param_hooks={"*": lambda p, g: jnp.clip(g, -0.5, 0.5)})
    for _ in range(3):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(vg(w, x), reference(w, x))
    assert _replays() == 2


def test_replay_with_a_look_equals_recording_and_jax_on_fresh_inputs(monkeypatch):
    from jaxaot._src.autograd.recorded import call

    made = []
    new_call = call.Call.__init__
    monkeypatch.setattr(call.Call, "__init__", lambda self, *a: made.append(1) or new_call(self, *a))
    rng = np.random.default_rng(9)
    replayed = jaxaot.compiled_value_and_grad(branchy, replay=True)
    recorded = jaxaot.compiled_value_and_grad(branchy)
    signs = (True, True, False, True, False, False, True, True)
    for sign in signs:
        args = _inputs(rng, sign)
        out = replayed(*args)
        _close(out, recorded(*args), tol=1e-6)
        _close(out, jax.value_and_grad(branchy)(*args))
    # one step per branch, shared: a guarded recording's step and the other's both return the looked-at value
    assert compiled_autograd.stats().compiles == 2 and _replays() == len(signs) - 2
    # the recording function splits every call; the replaying one only the two it recorded (a replay is
    # found by one flatten of the arguments)
    assert len(made) == len(signs) + 2


def test_a_quick_replay_whose_guard_fails_records_again_and_is_never_stale():
    def scaled(w, x, *, scale, bias=None):
        h = jnp.tanh(x @ w) * scale
        if bias is not None:
            h = h + bias
        while float(jnp.max(jnp.abs(h))) > 1.0:  # a value Python reads: each new one records again
            h = 0.5 * h
        return jnp.sum(h ** 2)

    def trips(w, x, scale, bias):
        h = jnp.tanh(x @ w) * scale + (0.0 if bias is None else bias)
        n = 0
        while float(jnp.max(jnp.abs(h))) > 1.0:
            h, n = 0.5 * h, n + 1
        return n

    def reference(w, x, scale, bias):
        n = trips(w, x, scale, bias)

        def f(w):
            h = jnp.tanh(x @ w) * scale + (0.0 if bias is None else bias)
            return jnp.sum((0.5 ** n * h) ** 2)

        return jax.value_and_grad(f)(w)

    rng = np.random.default_rng(10)
    vg = jaxaot.compiled_value_and_grad(scaled, replay=True)
    w, x, bias = _rand(rng, 3, 2), _rand(rng, 4, 3), _rand(rng, 2)
    calls = [(w, x, 0.5, None), (w, x, 0.5, None), (w, x, 0.5, bias), (w, x, 0.5, None), (w, 9 * x, 0.5, None),
             (w, x, 3.0, None), (w, x, 0.5, None), (w, x.astype(jnp.float16), 0.5, None), (w, x, 0.5, None)]
    for w_, x_, scale, b in calls:
        kwargs = {"scale": scale} if b is None else {"bias": b, "scale": scale}
        _close(vg(w_, x_, **kwargs), reference(w_, x_, scale, b), tol=1e-3)
    # replayed: calls 2, 4, 7 and 9; a new float Python read (9 * x) and the new static values and dtype record
    assert _replays() == 4
    reasons = [e.reason for e in vg.cache_info().entries]
    assert any("Python read" in r for r in reasons), reasons


def test_host_value_reads_what_numpy_reads():
    from jaxaot._src import compat as C

    rng = np.random.default_rng(11)
    for x in (jnp.float32(rng.standard_normal()), jnp.asarray(rng.standard_normal((3, 2)), jnp.bfloat16),
              jnp.asarray(rng.integers(0, 9, 4)), jnp.asarray(True), jnp.ones(()) * np.nan):
        got, want = C.host_value(x), np.asarray(x)
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_off_a_cpu_the_looked_at_values_are_read_from_host_memory(monkeypatch):
    """Off a CPU the step also returns the values Python looked at in pinned host memory, and a replay reads them
    there (CPU stands in: its pinned host memory kind exists too). Same losses and gradients as recording and
    JAX, each side of the branch replayed, and the copies are the step's last outputs."""
    from jaxaot._src.autograd.recorded import replay, step

    received = []  # what replays read their guards from
    real = replay.confirms

    def confirms(found, outs, root):
        received.extend(outs[len(outs) - len(found.outcomes):])
        return real(found, outs, root)

    monkeypatch.setattr(replay, "confirms", confirms)
    monkeypatch.setattr(step, "HOST_COPY_PLATFORMS", step.HOST_COPY_PLATFORMS | {"cpu"})
    rng = np.random.default_rng()
    replayed = jaxaot.compiled_value_and_grad(branchy, replay=True)
    recorded = jaxaot.compiled_value_and_grad(branchy)
    signs = (True, True, False, False, True, False)
    for sign in signs:
        args = _inputs(rng, sign)
        out = replayed(*args)
        _close(out, recorded(*args), tol=1e-6)
        _close(out, jax.value_and_grad(branchy)(*args))
    assert _replays() == len(signs) - 2 and compiled_autograd.stats().compiles == 2
    assert received and {v.sharding.memory_kind for v in received} == {"pinned_host"}
    monkeypatch.setattr(step, "HOST_COPY_PLATFORMS", frozenset())  # a CPU as it is: device memory, read there
    received.clear()
    again = jaxaot.compiled_value_and_grad(branchy, replay=True)
    for sign in signs:
        args = _inputs(rng, sign)
        _close(again(*args), jax.value_and_grad(branchy)(*args))
    assert received and {v.sharding.memory_kind for v in received} == {"device"}


@pytest.mark.parametrize("replay", [False, True])
def test_keywords_in_either_order_are_one_step(replay):
    """``f(w, a=.., b=..)`` and ``f(w, b=.., a=..)`` are one call, as ``jit`` keys them: one compile, then replays."""
    def loss(w, *, a, b):
        return jnp.sum(jnp.tanh(w * a) * 2.0 + b)

    rng = np.random.default_rng()
    w, a, b = _rand(rng, 4), _rand(rng, 4), _rand(rng, 4)
    compiled_autograd.reset()
    vg = jaxaot.compiled_value_and_grad(loss, replay=replay)
    for i in range(6):
        kwargs = {"a": a, "b": b} if i % 2 == 0 else {"b": b, "a": a}
        _close(vg(w, **kwargs), jax.value_and_grad(loss)(w, **kwargs))
    stats = compiled_autograd.stats()
    assert stats.compiles == 1 and (stats.replays == 5 if replay else True)
