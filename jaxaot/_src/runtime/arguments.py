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

import inspect
from typing import Any, Callable, Sequence

import jax

from jaxaot._src.pytrees import is_array_leaf, not_array_message
from jaxaot.errors import InvalidInputError, InvalidValueError, StaticArgumentError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def check_traceable(fn: Any, who: str) -> None:
    """:class:`~jaxaot.errors.InvalidInputError` when ``fn`` is a generator function (sync or async), as
    ``jax.jit`` and ``jax.value_and_grad`` refuse one: calling it returns a generator, not arrays to trace."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise InvalidInputError(
            f"{who} expects a function that returns arrays, got a generator function ({safe_repr(fn, 120)}): a "
            "generator cannot be traced. Return the values (a list or tuple of arrays) instead of yielding them.")


def positional_count(fn: Any) -> int | None:
    """The number of ``fn``'s positional parameters; None when it takes ``*args`` or has no signature (as
    ``jax.jit``, which then checks no position)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in _POSITIONAL for p in params)


def argnums_of(name: str, value: Any, fn: Any, who: str) -> tuple[int, ...]:
    """``static_argnums`` / ``donate_argnums`` of ``fn`` as sorted distinct positions (a repeated one counts once,
    as in ``jax.jit``).

    An int or a sequence of non-negative ints (no bools), else :class:`~jaxaot.errors.InvalidInputError`: a
    negative position, which ``jax.jit`` counts from the end of each call, is refused, naming the position it
    stands for where ``fn``'s positional parameters are fixed. Checked against those parameters as ``jax.jit``
    checks them: one beyond them is an :class:`~jaxaot.errors.InvalidValueError` (a ``ValueError``, as
    ``jax.jit``'s) naming it and their number.
    """
    items = (value,) if isinstance(value, int) or not isinstance(value, (tuple, list, range)) else tuple(value)
    if any(isinstance(i, bool) or not isinstance(i, int) for i in items):
        raise InvalidInputError(f"{name} must be non-negative ints (argument positions): an int or a sequence of "
                                f"ints, got {value!r}.")
    n = positional_count(fn)
    negative = [i for i in items if i < 0]
    if negative:
        hint = (f" (position {n + negative[0]} of {who}'s {n} positional parameters)"
                if n is not None and -n <= negative[0] else "")
        raise InvalidInputError(f"{name}={value!r} has the negative position {negative[0]}: pass positions counted "
                                f"from the first argument{hint}. Static and donated arguments are fixed per function, "
                                "not counted from the end of each call.")
    if n is not None and items and max(items) >= n:
        fix = f"pass positions from 0 to {n - 1}" if n else f"leave {name} out"
        raise InvalidValueError(f"{name}={value!r} names position {max(items)}, but {who} accepts only {n} "
                                f"positional argument(s): {fix}, or add the parameter to {who}.")
    return tuple(sorted(set(items)))


class _Omitted:
    """A static position the call did not pass: the function's default applies."""

    def __repr__(self) -> str:
        return "(not passed: its default)"


OMITTED = _Omitted()


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

    __slots__ = ("index", "value", "keyword", "_hash")

    def __init__(self, index: int, value: Any, keyword: str | None = None):
        # keyword: the parameter's name where the call passed it by keyword (keyed apart from the same value passed
        # positionally, as jax.jit keys its inferred static_argnames)
        self.index, self.value, self.keyword = index, value, keyword
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
        if self.keyword != other.keyword:
            return False
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


def positional_names(fn: Any) -> tuple[str | None, ...]:
    """The name of each of ``fn``'s positional parameters that may be passed by keyword, None for a positional-only
    one: ``jax.jit`` infers ``static_argnames`` from ``static_argnums`` with these; ``()`` without a signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None
                 for p in params if p.kind in _POSITIONAL)


def split_static(static_argnums: Sequence[int], args: tuple, kwargs: dict, fn: Any = None
                 ) -> tuple[tuple, list, Any]:
    """``(static values, dynamic leaves, treedef of (dynamic args, kwargs))``; each static value is a :class:`StaticArg`.

    A static position the call passes by keyword (``fn``'s parameter of that position named in ``kwargs``) is
    that static argument, as in ``jax.jit``: its :class:`StaticArg` holds the keyword, so it keys its own programs.
    One the call leaves out holds :data:`OMITTED`: the function's default runs, as under ``jax.jit``.
    """
    if not static_argnums:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        return (), leaves, treedef
    n = len(args)
    names = positional_names(fn) if fn is not None and max(static_argnums) >= n else ()
    static = []
    for i in static_argnums:
        name = names[i] if i < len(names) else None
        if i < n:
            static.append(StaticArg(i, args[i]))
        elif name is not None and name in kwargs:
            static.append(StaticArg(i, kwargs[name], keyword=name))
        else:  # not passed: the function's default runs, as under jax.jit (keyed apart from a value passed)
            static.append(StaticArg(i, OMITTED))
    if n <= max(static_argnums):
        kwargs = {k: v for k, v in kwargs.items() if k not in {s.keyword for s in static}}
    dyn = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    leaves, treedef = jax.tree_util.tree_flatten((dyn, kwargs))
    return tuple(static), leaves, treedef


def raise_not_array(static_argnums: Sequence[int], treedef: Any, leaves: Sequence[Any]) -> None:
    """:class:`~jaxaot.errors.InvalidInputError` naming the first of a call's dynamic ``leaves`` (of the
    :func:`split_static` ``treedef``) that is not an array, by its position in the call (``arg[2]['tag']``)."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(len(leaves))))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]
    i = next(i for i, x in enumerate(leaves) if not is_array_leaf(x))
    positions = [p for p in range(len(dummy[0]) + len(static_argnums)) if p not in static_argnums]
    raise InvalidInputError(not_array_message("input", paths[i], leaves[i], positions))


def with_statics(static_argnums: Sequence[int], static: tuple, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """``(args, kwargs)`` with ``static``'s values put back where a call of the dynamic arguments only left them
    out (those passed by keyword among ``kwargs``); None where ``args`` are too few to hold the positional ones."""
    at = [(i, s) for i, s in zip(static_argnums, static)
          if getattr(s, "keyword", None) is None and getattr(s, "value", None) is not OMITTED]
    if at and len(args) + len(at) <= max(i for i, _ in at):
        return None
    full = list(args)
    for i, s in sorted(at, key=lambda p: p[0]):
        full.insert(i, s.value if isinstance(s, StaticArg) else s)
    named = {s.keyword: s.value for s in static if getattr(s, "keyword", None) is not None}
    return tuple(full), {**named, **kwargs}


def flat_function(fn: Callable, static_argnums: Sequence[int], static: tuple, treedef: Any) -> Callable:
    """``fn`` as a function of the dynamic leaves, with the static values put back in place (by keyword where the
    call passed them so)."""

    def flat_fn(*flat):
        dyn, kwargs = jax.tree_util.tree_unflatten(treedef, flat)
        args, kwargs = with_statics(static_argnums, static, tuple(dyn), kwargs)
        return fn(*args, **kwargs)

    flat_fn.__wrapped__ = fn  # JAX's tracing errors name the user's function and where it is defined
    return flat_fn


def donated_leaves(treedef: Any, num_static: int, static_argnums: Sequence[int],
                   donate_argnums: Sequence[int], fn: Any = None) -> list[int]:
    """The leaves (flat input positions) of the arguments at ``donate_argnums``: passed positionally, or by the
    name of ``fn``'s parameter at that position (donated as ``jax.jit`` donates it)."""
    if not donate_argnums:
        return []
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    dyn_positions = [i for i in range(num_static + len(dummy[0])) if i not in static_argnums]
    out = []
    for k, arg in enumerate(dummy[0]):
        if dyn_positions[k] in donate_argnums:
            out.extend(jax.tree_util.tree_leaves(arg))
    if dummy[1] and fn is not None:
        names = positional_names(fn)
        donated = {names[i] for i in donate_argnums if i < len(names) and names[i] is not None}
        for name, arg in dummy[1].items():
            if name in donated:
                out.extend(jax.tree_util.tree_leaves(arg))
    return sorted(out)
