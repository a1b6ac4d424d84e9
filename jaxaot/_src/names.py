"""What messages call a user's function: its own name, or what it wraps, never a placeholder.

Example:
    >>> import functools
    >>> callable_name(functools.partial(lambda x, s: x * s, s=2.0)), callable_name(len)
    ('partial(<lambda>)', 'len')
"""

from __future__ import annotations

import functools
from typing import Any


def callable_name(fn: Any) -> str:
    """``fn``'s ``__name__``; for a ``functools.partial``, ``partial(<the function's name>)``; for a callable
    object without one, its class's name."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__
