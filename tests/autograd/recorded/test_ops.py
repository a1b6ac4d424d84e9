"""Recording cheaply: operator templates, the structure trie and the compiled looks give what jax.numpy gives.

Each recording is compared with ``jax.value_and_grad`` on fresh random inputs,
on its first step (``jax.numpy`` runs and is templated) and on later ones (the
templates replay); the tapes must be the same, operation for operation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from autograd_helpers import close as _close, rand as _rand
from jaxaot import compiled_autograd
from jaxaot._src.autograd.recorded import ops, step, step_cache
from jaxaot._src.autograd.recorded.structure import Trie


def _record(f, *args):
    leaves, tree = jax.tree_util.tree_flatten((args[0],))
    return step.record(lambda a: (f(a, *args[1:]), None), leaves, tree, eager=False)


def operators(w, x, s, i):
    h = x @ w
    h = (h + 1) * 0.5 - h / 3.0 + 2 ** h[:, :1] - (-h) ** 2 + h ** 2.5 * 0 + abs(h) % 1.5
    h = h.T.reshape(-1, 2).astype(jnp.float32) * s + np.float32(0.25) * h.sum(0).mean()
    h = jnp.where(h > 0, h, 0.1 * h)[:, ::-1] + h[i] + h[..., None][:, 0, 0][:, None] + h[1:3].sum()
    return jnp.sum(h.max(axis=1, keepdims=True) * h.var() + h.std(0).sum() + jnp.tanh(h).min())


def test_operators_methods_and_indexing_replay_exactly_what_jax_numpy_recorded():
    rng = np.random.default_rng(0)
    vg = jaxaot.compiled_value_and_grad(operators)
    w, x = _rand(rng, 3, 4), _rand(rng, 5, 3)
    first = _record(operators, w, x, 2.0, 1)
    for _ in range(2):
        w, x = _rand(rng, 3, 4), _rand(rng, 5, 3)
        _close(vg(w, x, 2.0, 1), jax.value_and_grad(operators)(w, x, 2.0, 1), tol=1e-4)
    again = _record(operators, w, x, 2.0, 1)
    assert again.structure is first.structure  # the same tape: the trie's node gave its structure back
    assert compiled_autograd.stats().compiles == 1
    assert len(ops.TEMPLATES) > 10


def test_a_call_made_again_at_the_same_point_appends_what_its_template_appended(monkeypatch):
    applied = []
    apply = ops.Template.apply
    monkeypatch.setattr(ops.Template, "apply", lambda self, *a: applied.append(self) or apply(self, *a))
    rng = np.random.default_rng(4)
    w, x = _rand(rng, 3, 4), _rand(rng, 5, 3)
    tapes, applies = [], []
    for _ in range(3):  # jax.numpy runs and is templated; the templates are applied; their calls are appended
        applied.clear()
        tapes.append(_record(operators, w, x, 2.0, 1).tape)
        applies.append(list(applied))
    # the third recording applied only the templates of calls that made a literal new to the tape (an input)
    assert all(any(kind == "lit" for kind, *_ in t.steps) for t in applies[2]) and len(applies[2]) < len(applies[1])
    for tape in tapes[1:]:
        assert [e[:3] for e in tape.ops] == [e[:3] for e in tapes[0].ops]  # the same operations, one by one
        assert (tape.avals, tape.inputs, tape.node) == (tapes[0].avals, tapes[0].inputs, tapes[0].node)
    f = jax.jit(lambda w, x: jax.value_and_grad(operators)(w, x, 2.0, 1))  # and what they compute
    _close(jaxaot.compiled_value_and_grad(operators)(w, x, 2.0, 1), f(w, x), tol=1e-4)


def test_scalars_are_keyed_by_exact_value_and_type():
    f = lambda w, s: jnp.sum(w * jnp.arctan2(s * jnp.ones(()), -1.0))  # atan2(±0, -1) = ±pi
    w = jnp.ones(2)
    g = jaxaot.compiled_grad(f)
    _close(g(w, 0.0), jnp.full(2, np.pi))
    _close(g(w, -0.0), jnp.full(2, -np.pi))
    _close(g(w, 0.0), jnp.full(2, np.pi))
    ints = jaxaot.compiled_grad(lambda w, n: jnp.sum(w ** n))  # 3 and 3.0: integer_pow against pow
    for n in (3, 3.0, 3, True):
        _close(ints(w * 2, n), jax.grad(lambda w: jnp.sum(w ** n))(w * 2))
    scaled = jaxaot.compiled_value_and_grad(lambda w, c: jnp.sum(c * w * w))  # NumPy scalars: type and bytes
    for c in (np.float32(0.5), np.float32(-0.0), np.float16(0.5), np.float32(0.5), np.int8(3), np.bool_(True)):
        _close(scaled(w * 3, c), jax.value_and_grad(lambda w: jnp.sum(c * w * w))(w * 3))
        assert scaled(w * 3, c)[0].dtype == (c * jnp.ones(2)).dtype


def test_same_operands_and_known_values_are_part_of_the_signature():
    def f(w, x):
        a = x @ w
        b = a * a  # the same operand twice
        c = a * (a + 1.0)  # two different ones of the same type
        return jnp.sum(b - c) + jnp.sum(w * w)

    rng = np.random.default_rng(1)
    vg = jaxaot.compiled_value_and_grad(f)
    for _ in range(3):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(vg(w, x), jax.value_and_grad(f)(w, x))
    assert compiled_autograd.stats().compiles == 1


def test_a_configuration_change_inside_the_forward_is_seen():
    def f(w):
        a = w * 2  # standard promotion: weak int with f32
        with jax.numpy_dtype_promotion("strict"):
            try:
                b = w + jnp.ones(3, jnp.bfloat16)  # refused under strict promotion
            except jax.errors.JaxTypeError if hasattr(jax.errors, "JaxTypeError") else Exception:
                b = w
        return jnp.sum(a * b)

    g = jaxaot.compiled_grad(f)
    w = jnp.arange(3.0)
    for _ in range(2):
        _close(g(w), jax.grad(f)(w))


def test_a_look_runs_one_compiled_program_once_per_structure():
    def f(w, x):
        h = jnp.tanh(x @ w)
        if h.mean() > 0:  # a look: computed by one program, not three dispatches
            return jnp.sum(h ** 2)
        return jnp.sum(jnp.cos(h))

    rng = np.random.default_rng(2)
    vg = jaxaot.compiled_value_and_grad(f)
    for _ in range(6):
        w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
        _close(vg(w, x), jax.value_and_grad(f)(w, x))
    assert step_cache.LOOKS.stats().compiles == 1
    recorded = _record(f, w, x)
    (look,) = recorded.tape.looks
    assert look.how == "bool" and look.plan.exe is not None and len(look.plan.eqns) == 4  # x @ w, tanh, mean, >
    compiled_autograd.reset()
    assert step_cache.LOOKS.stats().entries == 0


@pytest.mark.parametrize("eager", [False, True])
def test_a_tape_in_either_mode_gives_the_same_structure(eager):
    rng = np.random.default_rng(3)
    w, x = _rand(rng, 3, 2), _rand(rng, 4, 3)
    f = lambda w, x: jnp.sum(jax.nn.gelu(x @ w) * 0.5)
    leaves, tree = jax.tree_util.tree_flatten((w,))
    a = step.record(lambda w: (f(w, x), None), leaves, tree, eager=eager)
    b = step.record(lambda w: (f(w, x), None), leaves, tree, eager=eager)
    assert a.structure.token == b.structure.token


#: The operands ``h * c`` meets at one point of the trie (``h``, ``g``: recorded values made before).
_OPERANDS = {
    "float": lambda h, g: 0.5, "minus zero": lambda h, g: -0.0, "int": lambda h, g: 2, "bool": lambda h, g: True,
    "float32": lambda h, g: np.float32(0.5), "float16": lambda h, g: np.float16(0.5), "same": lambda h, g: h,
    "other": lambda h, g: g, "int8": lambda h, g: np.int8(3), "float one": lambda h, g: 1.0,
    "int one": lambda h, g: 1, "true": lambda h, g: True,
}


def _at_one_point(w, v, kind):
    h, g = jnp.sin(w), jnp.cos(v)  # the same operations before, whatever ``kind``: one trie node
    return jnp.sum(h * _OPERANDS[kind](h, g)) + jnp.sum(h.T * g.T)


def test_calls_made_at_one_point_of_the_trie_are_told_apart_by_their_operands():
    rng = np.random.default_rng(5)
    order = list(_OPERANDS) * 2
    rng.shuffle(order)
    vg, checked = jaxaot.compiled_value_and_grad(lambda p, k: _at_one_point(*p, k)), set()
    for kind in order:  # each kind met at the node after the others: what it appended there must be its own
        w, v = _rand(rng, 3, 2), _rand(rng, 3, 2)
        fresh = step.record(lambda p: (_at_one_point(*p, kind), None), [w, v],
                            jax.tree_util.tree_structure(((w, v),)), eager=False, trie=Trie().root())
        shared = _record(lambda p, k: _at_one_point(*p, k), (w, v), kind)
        assert shared.structure.token == fresh.structure.token, kind  # the same tape as jax.numpy's, afresh
        if kind in checked:  # values once per kind (each kind's step compiles once)
            continue
        checked.add(kind)
        value, grads = vg((w, v), kind)
        want = jax.value_and_grad(lambda p: _at_one_point(*p, kind))((w, v))
        _close((value, grads), want, tol=1e-5)
        assert value.dtype == want[0].dtype


def test_a_nan_operand_is_recorded_afresh_and_never_kept_at_its_point():
    f = lambda w, c: jnp.sum(jnp.sin(w) * c) + jnp.sum(w * w)  # noqa: E731
    vg, trie = jaxaot.compiled_value_and_grad(f), Trie()
    rng = np.random.default_rng(8)
    w = _rand(rng, 3, 2)
    leaves, tree = jax.tree_util.tree_flatten((w,))

    def kept():  # the calls kept over the whole trie
        count, stack = 0, [trie.root()]
        while stack:
            node = stack.pop()
            count += len(node.calls or ())
            stack.extend(node.children.values())
        return count

    # One recording first, in a trie of its own: JAX's caches of jnp.sin's first call (cold in a fresh worker) keep
    # nothing at a point; the counted calls are a training loop's, warm.
    step.record(lambda w: (f(w, float("nan")), None), leaves, tree, eager=False, trie=Trie().root())
    sizes = []
    for _ in range(4):  # a NaN equals nothing, itself included: a key holding it would be kept anew each call
        step.record(lambda w: (f(w, float("nan")), None), leaves, tree, eager=False, trie=trie.root())
        sizes.append(kept())
    assert sizes[1:] == sizes[:-1], sizes
    value, grad = vg(w, float("nan"))
    want = jax.value_and_grad(f)(w, float("nan"))
    np.testing.assert_array_equal(np.isnan(value), np.isnan(want[0]))
    np.testing.assert_allclose(grad, want[1], rtol=1e-6, equal_nan=True)


def test_the_configuration_is_part_of_a_call_made_again_at_one_point():
    raised = []

    def f(w, v, mode):
        h, g = jnp.sin(w), jnp.cos(v)
        with jax.numpy_rank_promotion(mode):
            try:
                y = h + g[0]  # a rank promotion: refused under "raise"
            except ValueError:
                raised.append(mode)
                y = h
        return jnp.sum(y * y)

    rng = np.random.default_rng(6)
    vg = jaxaot.compiled_value_and_grad(f, argnums=(0, 1))
    for mode in ("allow", "allow", "raise", "allow", "raise"):
        w, v = _rand(rng, 3, 2), _rand(rng, 3, 2)
        _close(vg(w, v, mode), jax.value_and_grad(f, argnums=(0, 1))(w, v, mode))
    assert raised.count("raise") == 4 and "allow" not in raised  # each recording and jax.value_and_grad's


def test_a_call_made_again_with_other_dtypes_or_shapes_is_recorded_for_them():
    f = lambda w, c: jnp.sum(jnp.tanh(w) * c + w.T.sum() * 2)  # noqa: E731
    vg = jaxaot.compiled_value_and_grad(f)
    rng = np.random.default_rng(7)
    for dtype, shape, c in ((jnp.float32, (3, 2), 0.5), (jnp.float16, (3, 2), 0.5), (jnp.float32, (2, 3), 0.5),
                            (jnp.float32, (3, 2), np.float16(2)), (jnp.float16, (3, 2), np.float32(2))):
        w = _rand(rng, *shape).astype(dtype)
        for _ in range(2):
            value, grad = vg(w, c)
            want = jax.value_and_grad(f)(w, c)
            _close((value, grad), want, tol=1e-2 if dtype == jnp.float16 else 1e-5)
            assert (value.dtype, grad.dtype) == (want[0].dtype, want[1].dtype)
