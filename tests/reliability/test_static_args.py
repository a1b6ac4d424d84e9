"""Static arguments that misbehave get a typed error naming them, and never poison the function.

The attacks: a static value whose ``__eq__`` raises, passed once, made every
later call with any other static value raise (the recompile reason compared the
two); and once such a value was cached, every later value of the same hash whose
``__eq__`` returns ``NotImplemented`` (the standard idiom) failed for good, where
``jax.jit`` returns the right answer. The table at the end runs each case through
``jax.jit`` and jaxaot side by side: the same result, or the same type of error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot.errors import InvalidInputError


class BadEq:
    def __len__(self):
        return 2

    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise RuntimeError("boom")


class BadHash:
    def __len__(self):
        return 2

    def __hash__(self):
        raise RuntimeError("hash boom")


class BadRepr(BadEq):
    def __repr__(self):
        raise RuntimeError("repr boom")


class ArrayEq:
    """An ``__eq__`` whose result has no truth value (like a numpy array's)."""

    def __len__(self):
        return 2

    def __hash__(self):
        return 7

    def __eq__(self, other):
        return np.array([True, False])


class Box:
    """Hashed and compared by a mutable field: mutating it after a call changes its hash."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __hash__(self):
        return hash(("Box", self.n))

    def __eq__(self, other):
        return isinstance(other, Box) and other.n == self.n


def _fn(x, c):
    return jnp.sum(x * len(c))


def _pair():
    return jaxaot.aot_function(_fn, static_argnums=1), jax.jit(_fn, static_argnums=1)


def _same(f, g, x, c):
    np.testing.assert_allclose(f(x, c), g(x, c))
    np.testing.assert_allclose(jax.grad(f)(x, c), jax.grad(g)(x, c))


def test_an_eq_that_raises_does_not_poison_other_values():
    f, g = _pair()
    x = jnp.ones(3)
    bad = BadEq()
    _same(f, g, x, bad)
    _same(f, g, x, (1, 2))        # raised RuntimeError: boom, before
    _same(f, g, x, bad)           # the same object: found by identity
    _same(f, g, jnp.ones(4), BadEq())  # a miss for other reasons: only the reason text compares them
    with pytest.raises(InvalidInputError, match=r"static argument arg\[1\] of type BadEq cannot be compared.*"
                                                r"__eq__ raised RuntimeError: boom"):
        f(x, BadEq())             # the cache must compare two BadEq: jax.jit raises too
    with pytest.raises(ValueError, match="comparable"):
        g(x, BadEq())
    _same(f, g, x, (1, 2, 3))     # and the function keeps working
    _same(f, g, x, (4, 5))
    reasons = [e.reason for e in f.cache_info().entries]
    assert reasons[0] == "first call" and reasons[1].startswith("static argument `c`: <")
    assert reasons[1].endswith("→ (1, 2)") and reasons[2].startswith("static argument `c`: (1, 2) → <")


def test_a_hash_that_raises_raises_its_own_error_naming_the_argument():
    f, g = _pair()
    x = jnp.ones(3)
    with pytest.raises(RuntimeError, match="hash boom") as caught:  # as jax.jit raises it
        f(x, BadHash())
    assert any("__hash__ of static argument arg[1] (of type BadHash)" in n for n in caught.value.__notes__)
    _same(f, g, x, (1, 2))


def test_unhashable_static_values_are_a_typed_error():
    f, g = _pair()
    x = jnp.ones(3)
    with pytest.raises(InvalidInputError, match=r"arg\[1\] of type list is not hashable"):
        f(x, [1, 2])
    _same(f, g, x, (1, 2))


def test_an_eq_without_a_truth_value_is_a_typed_error_when_compared():
    f, g = _pair()
    x = jnp.ones(3)
    first = ArrayEq()
    _same(f, g, x, first)
    _same(f, g, x, first)
    with pytest.raises(InvalidInputError, match=r"arg\[1\] of type ArrayEq cannot be compared.*ValueError"):
        f(x, ArrayEq())
    _same(f, g, x, (7,))


def test_a_repr_that_raises_does_not_break_the_call_or_cache_info():
    f, g = _pair()
    x = jnp.ones(3)
    _same(f, g, x, BadRepr())
    _same(f, g, x, (1, 2))
    info = f.cache_info()
    assert "its __repr__ raised RuntimeError" in info.entries[0].signature
    assert info.entries[1].reason.startswith("static argument `c`: <BadRepr object (its __repr__ raised")


def test_a_value_mutated_after_the_call_is_a_new_value_not_the_old_program():
    f, g = _pair()
    x = jnp.ones(3)
    box = Box(2)
    np.testing.assert_allclose(f(x, box), 6.0)
    box.n = 5  # its hash and equality change: the program traced for n=2 must not run
    np.testing.assert_allclose(f(x, box), 15.0)
    np.testing.assert_allclose(f(x, Box(2)), 6.0)
    np.testing.assert_allclose(f(x, box), g(x, box))
    reasons = [e.reason for e in f.cache_info().entries]
    assert reasons[1] == "static argument `c` was mutated since an earlier call (its hash changed)"


# --------------------------------------------------------------------------- the table: jaxaot against jax.jit
# jax.jit keeps process-wide caches that compare static values across functions: each case clears them, and
# hashes its values apart from every other case's.
class RaisingEq:
    def __init__(self, h):
        self.h = h

    def __len__(self):
        return 2

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        raise RuntimeError("boom")


class NotImplementedEq:
    """The standard idiom for "cannot compare": ``__eq__`` returns ``NotImplemented``."""

    def __init__(self, h):
        self.h = h

    def __len__(self):
        return 3

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return NotImplemented


class NoTruthEq(RaisingEq):
    def __eq__(self, other):
        return np.array([True, False])


class TruthyEq(RaisingEq):
    def __eq__(self, other):
        return "yes"


class HashNotInt:
    def __len__(self):
        return 2

    def __hash__(self):
        return "not an int"


class Counter:
    """Hashed and compared by identity, with a mutable size: mutating it keeps its hash (a stale program)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class Pair(tuple):
    pass


def _typed(x, c):
    """Depends on the static value's type, not only its value: ``1``, ``1.0`` and ``True`` give other dtypes."""
    return jnp.sum(x) * (len(c) if hasattr(c, "__len__") else c), jnp.asarray(c if not hasattr(c, "__len__") else 0)


def _steps(*values):
    return [lambda v=v: v for v in values]


def _mutated(box, n):
    def step():
        box.n = n
        return box
    return step


_box, _counter, _nan, _ni = Box(2), Counter(2), float("nan"), NotImplementedEq(102)
STATIC_CASES = {
    "eq raises, then NotImplemented of the same hash": _steps(RaisingEq(101), *[NotImplementedEq(101)
                                                                               for _ in range(4)]),
    "NotImplemented, new objects and the same one": _steps(NotImplementedEq(102), _ni, _ni, NotImplementedEq(102)),
    "two values whose eq raises": _steps(RaisingEq(103), RaisingEq(103), (1, 2)),
    "hash raises": _steps(BadHash(), (1, 2)),
    "hash is not an int": _steps(HashNotInt(), (1,)),
    "unhashable list": _steps([1, 2], (1, 2)),
    "unhashable dict": _steps({1: 2}),
    "unhashable array": _steps(np.arange(3), (0, 1, 2)),
    "eq without a truth value": _steps(NoTruthEq(104), NoTruthEq(104), (7,)),
    "eq returns a truthy non-bool": _steps(TruthyEq(105), TruthyEq(105)),
    "equal values of other types": _steps(1, 1.0, True, 1, 2.0, 2),
    "a tuple and an equal tuple subclass": _steps((1, 2), Pair((1, 2)), (1, 2)),
    "NaN, the same object and another": _steps(_nan, _nan, float("nan")),
    "mutated keeping its hash (stale under jax.jit too)": [lambda: _counter, _mutated(_counter, 5),
                                                           lambda: Counter(5)],
}
if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11):  # jax 0.10's jax.jit runs a stale program
    STATIC_CASES["mutated so that its hash changes"] = [lambda: _box, _mutated(_box, 5), lambda: Box(5),
                                                        lambda: Box(2)]


def _outcome(fn, x, c):
    try:
        return "value", [np.asarray(v) for v in fn(x, c)]
    except Exception as err:  # the error is part of the outcome
        return "error", err


def _compare(case, steps):
    def typed(x, c):  # a fresh function: jax.jit's caches are per function, and outlive its wrapper
        return _typed(x, c)

    jax.clear_caches()  # values left in jax.jit's process-wide caches by earlier tests would change its answers
    f = jaxaot.aot_function(typed, static_argnums=1)
    g = jax.jit(typed, static_argnums=1)
    x = jnp.arange(3.0)
    for i, step in enumerate(steps):
        c = step()
        (theirs_kind, theirs), (ours_kind, ours) = _outcome(g, x, c), _outcome(f, x, c)
        where = f"{case}, call {i} with {type(c).__name__}"
        if theirs_kind == "error":
            assert ours_kind == "error" and isinstance(ours, type(theirs)), (where, theirs, ours)
        else:
            assert ours_kind == "value", (where, ours)
            for a, b in zip(ours, theirs):
                assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
                np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize("case", list(STATIC_CASES))
def test_static_arguments_behave_as_under_jax_jit(case):
    _compare(case, STATIC_CASES[case])
