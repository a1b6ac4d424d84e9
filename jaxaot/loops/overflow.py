"""The run-time check that a bounded loop's stack did not overflow.

A stacking loop of ``max_steps`` rows stops when its stack is full and returns
``overflowed`` (the condition still held). :func:`check_overflow` turns that flag
into a :class:`~jaxaot.errors.LoopOverflowError` at run time through one
``jax.debug.callback``: one device-to-host copy of a boolean per loop run, no
extra device work. The error names ``max_steps`` and the two ways out.

Under ``jax.jit`` the callback's exception reaches the caller as JAX's
``jax.errors.JaxRuntimeError`` (``INTERNAL: CpuCallback error``), with the message
on its last line: JAX does not re-raise a callback's exception type.
:func:`reraise_overflow` turns such an error back into a
:class:`~jaxaot.errors.LoopOverflowError` (the JAX error as its ``__cause__``);
``aot_function`` calls run inside it, and so can user code around a ``jax.jit``.

``jax.export`` cannot serialize host callbacks, so :mod:`jaxaot.artifacts`
replaces each such check by an extra boolean output; :func:`overflow_check_max_steps`
is how it recognises one (and reads its ``max_steps``) among a program's eqns.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda f: check_overflow(f, max_steps=8))(jnp.bool_(False))
    >>> [overflow_check_max_steps(e) for e in closed.jaxpr.eqns]
    [8]
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import jax
import numpy as np

from jaxaot.errors import LoopOverflowError

#: How deep :func:`overflow_check_max_steps` looks into the closures around the callback.
_MAX_WRAPPER_DEPTH = 4


def raise_if_overflowed(overflowed: Any, max_steps: int) -> None:
    """Raise :class:`LoopOverflowError` if ``overflowed`` (a concrete value) is true."""
    if np.any(np.asarray(overflowed)):
        raise LoopOverflowError(
            f"{_MESSAGE_START}{max_steps} iterations, the bound of its reverse mode: "
            f"raise max_steps, or use checkpoints=k alone (any trip count)."
        )


_MESSAGE_START = "while_loop needed more than max_steps="
#: The exception classes JAX raises when a compiled program's host callback failed.
RUNTIME_ERRORS = tuple(t for t in (getattr(jax.errors, "JaxRuntimeError", None),) if t is not None) or (RuntimeError,)


@contextlib.contextmanager
def reraise_overflow() -> Iterator[None]:
    """Re-raise JAX's runtime error for an overflowed ``max_steps`` as
    :class:`LoopOverflowError` (other errors pass through unchanged).

    Example:
        >>> import jax, jaxaot
        >>> f = jax.jit(jax.grad(lambda x: jaxaot.while_loop(lambda c: c < 9.0, lambda c: c + x, 0.0, max_steps=2)))
        >>> try:
        ...     with reraise_overflow():
        ...         f(1.0).block_until_ready()
        ... except LoopOverflowError as e:
        ...     print(str(e)[:37])
        while_loop needed more than max_steps
    """
    try:
        yield
    except RUNTIME_ERRORS as e:
        overflow = loop_overflow_from(e)
        if overflow is None:
            raise
        raise overflow from e


def loop_overflow_from(error: BaseException) -> LoopOverflowError | None:
    """The :class:`LoopOverflowError` that JAX's runtime ``error`` carries, if it is one (else None).

    JAX wraps an exception raised in a host callback of a compiled program in its
    own runtime error; the overflow check's message survives in its text.
    """
    text = str(error)
    at = text.rfind(_MESSAGE_START)
    if at < 0 or isinstance(error, LoopOverflowError):
        return None
    return LoopOverflowError(text[at:].splitlines()[0])


def check_overflow(overflowed: Any, max_steps: int) -> None:
    """Raise :class:`LoopOverflowError` at run time when a stack overflowed."""
    jax.debug.callback(functools.partial(raise_if_overflowed, max_steps=max_steps), overflowed)


def overflow_check_max_steps(eqn: Any) -> int | None:
    """``max_steps`` if ``eqn`` is the callback of :func:`check_overflow`, else None."""
    if str(eqn.primitive) != "debug_callback" or len(eqn.invars) != 1:
        return None
    return _find_check(eqn.params.get("callback"), 0)


def _find_check(obj: Any, depth: int) -> int | None:
    # jax.debug.callback wraps the callback in closures; look a few levels in.
    if depth > _MAX_WRAPPER_DEPTH or obj is None:
        return None
    if isinstance(obj, functools.partial):
        if obj.func is raise_if_overflowed and "max_steps" in obj.keywords:
            return int(obj.keywords["max_steps"])
        return _find_check(obj.func, depth + 1)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            found = _find_check(cell.cell_contents, depth + 1) if callable(cell.cell_contents) else None
        except ValueError:  # an empty cell
            found = None
        if found is not None:
            return found
    return None
