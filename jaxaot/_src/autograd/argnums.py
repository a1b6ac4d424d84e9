"""Which positional arguments a gradient differentiates: ``argnums`` placed among one call's arguments."""

from __future__ import annotations

from typing import Any, Sequence

from jaxaot.errors import InvalidInputError


def resolve_argnums(nums: Sequence[int], nargs: int, argnums: Any, who: str) -> tuple[int, ...]:
    """``nums`` (``argnums`` as a sequence; a negative one counts from the end, as in ``jax.grad``) as positions
    among a call's ``nargs`` positional arguments, or :class:`~jaxaot.errors.InvalidInputError` naming the range
    or the argument named twice (``who``: the function, for the message).

    Example:
        >>> resolve_argnums((0, -1), 3, (0, -1), "loss")
        (0, 2)
    """
    if any(not -nargs <= n < nargs for n in nums):
        raise InvalidInputError(
            f"argnums={argnums!r} is out of range: {who} got {nargs} positional argument(s). Pass argnums from "
            f"{-nargs} to {nargs - 1}, or pass the argument positionally.")
    at = tuple(n % nargs for n in nums)
    if len(set(at)) != len(at):  # JAX raises too: one argument's gradient cannot be returned twice
        twice = next(n for n in at if at.count(n) > 1)
        raise InvalidInputError(f"argnums={argnums!r} names argument {twice} more than once; name each argument once.")
    return at
