"""``patch_while_loop``: give a library's ``lax.while_loop`` reverse mode for a block.

A library that keeps its solver in ``jax.lax.while_loop`` (a Newton solver, an
optimizer, a physics engine's constraint solver) cannot be reverse-differentiated:
``lax.while_loop`` refuses the transpose. Inside ``with patch_while_loop(...)``
the attribute ``jax.lax.while_loop`` is :func:`jaxaot.while_loop` with the given
``max_steps`` / ``checkpoints``, so every call the library makes *while the block
runs* (tracing included: call ``jax.grad``/``jax.jit`` inside the block, or
trace there) builds a jaxaot loop. The forward results are unchanged.

jaxaot itself never reads the public ``jax.lax.while_loop`` / ``fori_loop``
attributes at run time (it binds JAX's implementation once, at import, in
:mod:`jaxaot._compat`), so the swap cannot make jaxaot call itself. What it
cannot reach: code that bound the function before the block (``from jax.lax
import while_loop`` at the library's import), and ``lax.fori_loop`` /
``lax.scan``, which call JAX's loop directly (a ``fori_loop`` with static bounds
is a scan, and differentiates already).

Costs are those of the mode chosen (README, "Choosing a while_loop mode"); the
swap itself costs nothing. It is process-wide while it lasts: another thread
tracing a ``lax.while_loop`` meanwhile gets the jaxaot loop too (same forward).

Example:
    >>> import jax, jaxaot
    >>> def library_sqrt(a):  # stands in for third-party code
    ...     return jax.lax.while_loop(lambda x: abs(x * x - a) > 1e-5, lambda x: 0.5 * (x + a / x), a)
    >>> with jaxaot.patch_while_loop(max_steps=64):
    ...     g = jax.grad(library_sqrt)(4.0)
    >>> round(float(g), 3)
    0.25
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator

import jax

from jaxaot.loops.api import while_loop
from jaxaot.loops.common import check_options
from jaxaot.loops.offline import check_body

_LOCK = threading.Lock()


def patch_while_loop(*, max_steps: int | None = None, checkpoints: int | None = None,
                     checkpoint_memory: str = "device") -> contextlib.AbstractContextManager[None]:
    """Swap ``jax.lax.while_loop`` for ``jaxaot.while_loop(max_steps=..., checkpoints=..., checkpoint_memory=...)``
    for the duration of the block; the previous function is restored on exit, also
    when the block raises. Blocks nest (the innermost options apply).

    The options are checked here, when ``patch_while_loop(...)`` is called (not when the
    block is entered): :class:`~jaxaot.errors.InvalidLoopOptionError` names a bad one.
    """
    check_options(max_steps, checkpoints, checkpoint_memory, who="patch_while_loop")
    if max_steps is not None and checkpoints is not None:
        check_body("patch_while_loop", max_steps, checkpoints, checkpoint_memory, effects=None)
    replacement = functools.partial(while_loop, max_steps=max_steps, checkpoints=checkpoints,
                                    checkpoint_memory=checkpoint_memory)
    functools.update_wrapper(replacement, while_loop)
    return _swapped(replacement)


@contextlib.contextmanager
def _swapped(replacement: Callable) -> Iterator[None]:
    """``jax.lax.while_loop`` is ``replacement`` inside the block, the previous function again after it."""
    with _LOCK:
        previous = jax.lax.while_loop
        jax.lax.while_loop = replacement
    try:
        yield
    finally:
        with _LOCK:
            jax.lax.while_loop = previous


__all__ = ["patch_while_loop"]
