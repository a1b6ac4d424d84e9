"""Static arguments that misbehave get a typed error naming them, and never poison the function.

The attack: a static value whose ``__eq__`` raises, passed once, made every
later call with any other static value raise (the recompile reason compared the
two). ``jax.jit`` gives the right answers for the same calls; so does jaxaot now,
and where a call cannot proceed (a ``__hash__`` that raises, an ``__eq__`` that
raises when the cache must compare) it raises :class:`~jaxaot.errors.InvalidInputError`.
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


def test_a_hash_that_raises_is_a_typed_error_naming_the_argument():
    f, g = _pair()
    x = jnp.ones(3)
    with pytest.raises(InvalidInputError, match=r"static argument arg\[1\] of type BadHash cannot be hashed: "
                                                r"its __hash__ raised RuntimeError: hash boom"):
        f(x, BadHash())
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
