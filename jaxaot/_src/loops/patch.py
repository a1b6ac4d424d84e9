"""``patch_while_loop``: :func:`~jaxaot._src.loops.rewrite.differentiable` as a context manager.

A library that keeps its solver in ``lax.while_loop`` cannot be reverse-differentiated.
Inside ``with patch_while_loop(...)``, every ``while`` the block traces becomes
jaxaot's loop with the given options: JAX's ``while`` primitive's binds are
rewritten, so every caller is reached, and the options join the jit cache keys, so
an entry point traced outside the block is traced again. Options apply to the
entering thread; blocks nest; jaxaot's own lowerings are never rewritten.

Example:
    >>> import jax, jaxaot
    >>> def library_sqrt(a):  # stands in for third-party code
    ...     return jax.lax.while_loop(lambda x: abs(x * x - a) > 1e-5, lambda x: 0.5 * (x + a / x), a)
    >>> with jaxaot.loops.patch_while_loop(max_steps=64):
    ...     g = jax.grad(library_sqrt)(4.0)
    >>> round(float(g), 3)
    0.25
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from jaxaot._src import compat as C
from jaxaot._src.loops.common import while_loop_p
from jaxaot._src.loops.rewrite import LoopOptions, while_loop_params

_STATE = threading.local()
_INSTALL = threading.Lock()
_installed = False


def _active() -> LoopOptions | None:
    stack = getattr(_STATE, "stack", None)
    return stack[-1] if stack else None


def _bind(jax_bind: Callable, *args: Any, **params: Any) -> Any:
    """A bind of JAX's ``while``: jaxaot's loop inside a block of this thread, JAX's otherwise."""
    options = _active()
    if options is None:
        return jax_bind(*args, **params)
    return while_loop_p.bind(*args, **while_loop_params(params, options))


def _install() -> None:
    global _installed
    with _INSTALL:
        if not _installed:
            C.intercept_while_binds(_bind)
            _installed = True


def patch_while_loop(*, max_steps: int | None = None, checkpoints: int | None = None,
                     checkpoint_memory: str = "device") -> contextlib.AbstractContextManager[None]:
    """A block in which every ``lax.while_loop`` traced is ``jaxaot.loops.while_loop(max_steps=...,
    checkpoints=..., checkpoint_memory=...)`` (see the module docstring).

    The options are checked here, when ``patch_while_loop(...)`` is called (not when the
    block is entered): :class:`~jaxaot.errors.InvalidLoopOptionError` names a bad one.
    """
    return _patched(LoopOptions(max_steps, checkpoints, checkpoint_memory).check("patch_while_loop"))


@contextlib.contextmanager
def _patched(options: LoopOptions) -> Iterator[None]:
    _install()
    stack = _STATE.__dict__.setdefault("stack", [])
    stack.append(options)
    try:
        with C.loop_options_scope(options.key()):
            yield
    finally:
        stack.pop()


__all__ = ["patch_while_loop"]


#: JAX's message where reverse mode meets ``lax.while_loop`` (or ``fori_loop`` with traced bounds).
_LAX_REFUSES = "Reverse-mode differentiation does not work for lax.while_loop"


def note_remedy(err: BaseException) -> None:
    """Add to JAX's refusal of a ``lax.while_loop`` gradient (kept as it is, a ``ValueError``) how jaxaot takes it."""
    if _LAX_REFUSES in str(err) and not any("jaxaot.loops" in n for n in getattr(err, "__notes__", ())):
        err.add_note("jaxaot differentiates such a loop: wrap the function in jaxaot.loops.differentiable(f, "
                     "max_steps=N) (or checkpoints=K), or trace it inside `with jaxaot.loops.patch_while_loop(...)`, "
                     "or write the loop with jaxaot.loops.while_loop (docs: loops).")
