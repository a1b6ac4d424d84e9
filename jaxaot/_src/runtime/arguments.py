"""A call's arguments as the runtime sees them: static values apart, the rest flattened.

Values named by ``static_argnums`` key the compile cache; the rest is one pytree
whose leaves are the programs' inputs. Each static value is held in a
:class:`StaticArg`, which keys the cache as ``jax.jit`` does: hashed once (an
unhashable value is a :class:`~jaxaot.errors.StaticArgumentError`), compared only
with values of the same type and hash, and an ``__eq__`` that raises is an error
naming the argument. ``tests/reliability/test_static_args.py`` compares each case
with ``jax.jit``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from jaxaot.errors import InvalidInputError, StaticArgumentError


def normalize_argnums(name: str, argnums: int | Sequence[int]) -> tuple[int, ...]:
    """``argnums`` as a sorted tuple of non-negative ints, or :class:`~jaxaot.errors.InvalidInputError`."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if any(not isinstance(i, int) or i < 0 for i in nums):
        raise InvalidInputError(f"{name} must be non-negative ints, got {nums!r}.")
    return tuple(sorted(nums))


class StaticArg:
    """One static argument as the compile cache keys it: its position, its value and its hash (computed once).

    Two compare equal when their values do; the values' ``__eq__`` runs only
    when their hashes agree and their types are the same (as in ``jax.jit``),
    and the same object with another hash (mutated since) is not equal to its
    earlier self.

    Example:
        >>> StaticArg(1, (2, 3)) == StaticArg(1, (2, 3)), StaticArg(1, (2, 3)) == StaticArg(1, (2, 4))
        (True, False)
        >>> StaticArg(1, [2, 3])
        Traceback (most recent call last):
        ...
        jaxaot.errors.StaticArgumentError: static argument arg[1] of type list is not hashable...
    """

    __slots__ = ("index", "value", "_hash")

    def __init__(self, index: int, value: Any):
        self.index, self.value = index, value
        try:
            self._hash = hash(value)
        except TypeError as err:
            raise StaticArgumentError(
                f"static argument arg[{index}] of type {type(value).__name__} is not hashable ({err}). Static "
                "arguments key the compile cache, as in jax.jit: pass a hashable value (a tuple instead of a "
                "list, say) or pass it as an array argument instead."
            ) from None
        except Exception as err:  # the user's own error, as jax.jit raises it
            err.add_note(f"raised by the __hash__ of static argument arg[{index}] (of type {type(value).__name__}): "
                         "static arguments key the compile cache, as in jax.jit, so their __hash__ must return an int.")
            raise

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, StaticArg):
            return NotImplemented
        if self.value is other.value:
            return self._hash == other._hash
        if self._hash != other._hash or type(self.value) is not type(other.value):
            return False
        try:
            return bool(other.value == self.value)
        except Exception as err:
            raise StaticArgumentError(
                f"static argument arg[{other.index}] of type {type(other.value).__name__} cannot be compared "
                f"with the static value {safe_repr(self.value, 80)} of an earlier call (type "
                f"{type(self.value).__name__}): __eq__ raised {type(err).__name__}: {err}. Static arguments key "
                "the compile cache, as in jax.jit: give them an __eq__ that returns a bool for any other value."
            ) from err

    def __repr__(self) -> str:
        return safe_repr(self.value)


def safe_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)``, shortened to ``limit`` characters; a stand-in when ``__repr__`` raises."""
    try:
        text = repr(value)
    except Exception as err:
        text = f"<{type(value).__name__} object (its __repr__ raised {type(err).__name__})>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def split_static(fn_name: str, static_argnums: Sequence[int], args: tuple, kwargs: dict
                 ) -> tuple[tuple, list, Any]:
    """``(static values, dynamic leaves, treedef of (dynamic args, kwargs))``; each static value is a :class:`StaticArg`."""
    if not static_argnums:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        return (), leaves, treedef
    n = len(args)
    for i in static_argnums:
        if i >= n:
            raise InvalidInputError(
                f"static_argnums contains {i}, but {fn_name} was called with {n} positional "
                "arguments. Pass the static argument positionally or fix static_argnums."
            )
    static = tuple(StaticArg(i, args[i]) for i in static_argnums)
    dyn = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    leaves, treedef = jax.tree_util.tree_flatten((dyn, kwargs))
    return static, leaves, treedef


def flat_function(fn: Callable, static_argnums: Sequence[int], static: tuple, treedef: Any) -> Callable:
    """``fn`` as a function of the dynamic leaves, with the static values put back in place."""

    def flat_fn(*flat):
        dyn, kwargs = jax.tree_util.tree_unflatten(treedef, flat)
        args = list(dyn)
        for i, s in zip(static_argnums, static):
            args.insert(i, s.value if isinstance(s, StaticArg) else s)
        return fn(*args, **kwargs)

    return flat_fn


def donated_leaves(treedef: Any, num_static: int, static_argnums: Sequence[int],
                   donate_argnums: Sequence[int]) -> list[int]:
    """The leaves (flat input positions) of the positional arguments in ``donate_argnums``."""
    if not donate_argnums:
        return []
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    dyn_positions = [i for i in range(num_static + len(dummy[0])) if i not in static_argnums]
    out = []
    for k, arg in enumerate(dummy[0]):
        if dyn_positions[k] in donate_argnums:
            out.extend(jax.tree_util.tree_leaves(arg))
    return out
