"""Which positional arguments a gradient differentiates: ``argnums``, read in one place for every gradient and
placed among one call's arguments, and ``reduce_axes``, the option ``jax.grad`` still takes and refuses unless
empty."""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

from jaxaot.errors import InvalidInputError, InvalidValueError


def as_index(value: Any) -> int | None:
    """``value`` as a Python int where it is an integer (an ``int``, ``np.int64``, anything ``operator.index``
    takes, as JAX reads ``argnums``), else None; a bool is not one.

    Example:
        >>> import numpy as np
        >>> as_index(np.int64(2)), as_index(True), as_index(1.0)
        (2, None, None)
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def normalize_argnums(argnums: Any) -> Any:
    """``argnums`` with each integer as a Python int (an int stays an int, a tuple or list a tuple or list); anything
    else (a float, a bool, Flax's ``nnx.DiffState``) is returned as it is, for the caller's checks.

    Example:
        >>> import numpy as np
        >>> normalize_argnums(np.int64(1)), normalize_argnums([0, np.int32(-1)]), normalize_argnums(range(2))
        (1, [0, -1], (0, 1))
        >>> normalize_argnums(np.array([0, 2]))
        (0, 2)
    """
    index = as_index(argnums)
    if index is not None:
        return index
    if isinstance(argnums, np.ndarray) and argnums.ndim == 1:  # JAX reads an array of integers as their tuple
        argnums = tuple(argnums.tolist()) if np.issubdtype(argnums.dtype, np.integer) else argnums
    if isinstance(argnums, (tuple, list, range)):  # JAX takes any sequence of integers (a range becomes a tuple)
        nums = [as_index(n) for n in argnums]
        if all(n is not None for n in nums):
            return list(nums) if isinstance(argnums, list) else tuple(nums)
    return argnums


def parse_argnums(argnums: Any, who: str) -> tuple[tuple[int, ...], bool]:
    """``(positions, single)`` of ``argnums``, checked when the gradient is built: an integer (``operator.index``
    reads it, as JAX does: ``np.int64(1)`` is one, a bool is not) or a non-empty sequence of distinct integers (a
    list, tuple or range); ``single``: it was one integer. Else :class:`~jaxaot.errors.InvalidInputError` saying
    what was wrong (``who``: the function it was given to, for the message). Every gradient reads ``argnums``
    here; a call checks its range (:func:`resolve_argnums`).

    Example:
        >>> import numpy as np
        >>> parse_argnums(np.int64(1), "grad"), parse_argnums(range(2), "grad")
        (((1,), True), ((0, 1), False))
    """
    argnums = normalize_argnums(argnums)
    single = isinstance(argnums, int) and not isinstance(argnums, bool)
    nums = (argnums,) if single else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if not nums or any(not isinstance(n, int) or isinstance(n, bool) for n in nums):
        raise InvalidInputError(f"argnums of {who} must be an integer or a non-empty sequence of integers, got "
                                f"{argnums!r}.")
    if len(set(nums)) != len(nums):  # jax.value_and_grad fails at the call (or returns None for one of them)
        twice = next(n for n in nums if nums.count(n) > 1)
        raise InvalidInputError(f"argnums={argnums!r} of {who} names argument {twice} more than once (one "
                                "argument's gradient cannot be returned twice): name each once.")
    return nums, single


def resolve_argnums(nums: Sequence[int], nargs: int, argnums: Any, who: str) -> tuple[int, ...]:
    """``nums`` (``argnums`` as a sequence; a negative one counts from the end, as in ``jax.grad``) as positions
    among a call's ``nargs`` positional arguments, or :class:`~jaxaot.errors.InvalidInputError` naming the range
    or the argument named twice (``who``: the function, for the message); a negative position below ``-nargs``
    is :class:`~jaxaot.errors.InvalidValueError`, as JAX's is a ``ValueError``.

    Example:
        >>> resolve_argnums((0, -1), 3, (0, -1), "loss")
        (0, 2)
    """
    if any(not -nargs <= n < nargs for n in nums):
        # JAX's types: too few arguments for a position is a TypeError, a negative one below -nargs a ValueError.
        error = InvalidValueError if any(n < -nargs for n in nums) else InvalidInputError
        raise error(
            f"argnums={argnums!r} is out of range: {who} got {nargs} positional argument(s). Pass argnums from "
            f"{-nargs} to {nargs - 1}, or pass the argument positionally.")
    at = tuple(n % nargs for n in nums)
    if len(set(at)) != len(at):  # JAX raises too: one argument's gradient cannot be returned twice
        twice = next(n for n in at if at.count(n) > 1)
        raise InvalidInputError(f"argnums={argnums!r} names argument {twice} more than once; name each argument once.")
    return at


def check_reduce_axes(reduce_axes: Any) -> None:
    """Refuse a non-empty ``reduce_axes`` as ``jax.grad`` does (``NotImplementedError``: JAX deprecated it); an
    empty one is accepted, so a call written for ``jax.grad`` runs unchanged."""
    if reduce_axes:
        raise NotImplementedError("reduce_axes argument to grad is deprecated")
