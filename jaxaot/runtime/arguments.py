"""A call's arguments as the runtime sees them: static values apart, the rest flattened.

``static_argnums`` name positional arguments that are compile-time constants:
they key the compile cache and are passed back into the user function as they
are. Everything else, ``(dynamic positional args, kwargs)``, is one pytree whose
leaves are the programs' inputs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from jaxaot.errors import InvalidInputError


def normalize_argnums(name: str, argnums: int | Sequence[int]) -> tuple[int, ...]:
    """``argnums`` as a sorted tuple of non-negative ints, or :class:`~jaxaot.InvalidInputError`."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if any(not isinstance(i, int) or i < 0 for i in nums):
        raise InvalidInputError(f"{name} must be non-negative ints, got {nums!r}.")
    return tuple(sorted(nums))


def split_static(fn_name: str, static_argnums: Sequence[int], args: tuple, kwargs: dict
                 ) -> tuple[tuple, list, Any]:
    """``(static values, dynamic leaves, treedef of (dynamic args, kwargs))``."""
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
    static = tuple(args[i] for i in static_argnums)
    for i, s in zip(static_argnums, static):
        try:
            hash(s)
        except TypeError:
            raise InvalidInputError(
                f"static argument arg[{i}] of type {type(s).__name__} is not hashable. Static "
                "arguments key the compile cache: pass a hashable value (a tuple instead of a "
                "list, say) or pass it as an array argument instead."
            ) from None
    dyn = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    leaves, treedef = jax.tree_util.tree_flatten((dyn, kwargs))
    return static, leaves, treedef


def flat_function(fn: Callable, static_argnums: Sequence[int], static: tuple, treedef: Any) -> Callable:
    """``fn`` as a function of the dynamic leaves, with the static values put back in place."""

    def flat_fn(*flat):
        dyn, kwargs = jax.tree_util.tree_unflatten(treedef, flat)
        args = list(dyn)
        for i, s in zip(static_argnums, static):
            args.insert(i, s)
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
