"""What messages call a user's function: its own name, or what it wraps, never a placeholder; and the names a
gradient of it carries, as JAX's gradients carry them.

Example:
    >>> import functools
    >>> callable_name(functools.partial(lambda x, s: x * s, s=2.0)), callable_name(len)
    ('partial(<lambda>)', 'len')
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable)


def callable_name(fn: Any) -> str:
    """``fn``'s ``__name__``; for a ``functools.partial``, ``partial(<the function's name>)``; for a callable
    object without one, its class's name."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def named_as_gradient(wrapper: _F, fun: Any, what: str, argnums: Any) -> _F:
    """``wrapper``, a gradient of ``fun``, named as ``jax.value_and_grad`` names its result: ``fun``'s name, qualified
    name and module, a docstring saying what it returns (``what``: "Value and gradient", "Gradient") and
    ``__wrapped__``, so that ``inspect.signature`` and ``jax.jit``'s ``static_argnames`` read ``fun``'s parameters."""
    name = callable_name(fun)
    wrapper.__name__, wrapper.__qualname__ = name, getattr(fun, "__qualname__", name)
    wrapper.__module__ = getattr(fun, "__module__", wrapper.__module__)
    wrapper.__doc__ = f"{what} of {name} with respect to positional argument(s) {argnums}, compiled by jaxaot."
    wrapper.__wrapped__ = fun
    return wrapper
