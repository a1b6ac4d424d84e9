"""How many rows a loop's reverse-mode stack gets, and ``dynamic_capacity``.

Reverse mode stacks one row of residuals per iteration, so it needs a capacity
before the trip count is known. :func:`stack_capacity` takes a stacking or counted
loop's own length, ``max_steps``, or the innermost :func:`dynamic_capacity`
context's capacity (the loop then reports the trip count it needed); with none,
:class:`~jaxaot.errors.ReverseModeBoundError`. The contexts are per thread.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Iterator

import jax.numpy as jnp

from jaxaot.errors import ReverseModeBoundError
from jaxaot._src.loops.common import INT, Loop, check_positive, while_loop_p
from jaxaot._src.loops.overflow import overflow_scale

_STATE = threading.local()


def _frames() -> list:
    """This thread's active ``dynamic_capacity`` frames: ``[(capacity, trip_counts), ...]``."""
    if not hasattr(_STATE, "frames"):
        _STATE.frames = []
    return _STATE.frames


def dynamic_capacity(capacity: int) -> ContextManager[list]:
    """Let unbounded loops (no ``max_steps``, no ``checkpoints``) reverse-differentiate.

    Inside the context, each such loop that is linearized stacks at most ``capacity``
    iterations (its forward stops there, so the stack never overflows) and appends
    to the yielded list a traced int32 scalar, created in the trace where the loop's
    forward (known) part runs: the loop's trip count if it is at most ``capacity``,
    else ``capacity + 1``, meaning "needed more; the results are wrong, rerun with a
    larger capacity". The runtime returns these as extra outputs and reruns with the
    capacity doubled while any exceeds ``capacity``.

    Example:
        >>> import jax, jaxaot
        >>> f = lambda x: jaxaot.loops.while_loop(lambda c: c < 5.0, lambda c: c + x, 0.0)
        >>> with jaxaot.loops.dynamic_capacity(8) as trips:
        ...     g = jax.jit(lambda x: jax.vjp(f, x)[1](1.0))(1.0)  # trips are this trace's values
        >>> len(trips)
        1
    """
    check_positive("capacity", capacity, "dynamic_capacity", optional=False)  # here, not when the block is entered
    return _capacity(int(capacity))


@contextlib.contextmanager
def _capacity(capacity: int) -> Iterator[list]:
    trip_counts: list = []
    frames = _frames()
    frames.append((capacity, trip_counts))
    try:
        yield trip_counts
    finally:
        frames.pop()


def stack_capacity(loop: Loop) -> tuple[int, Callable[[Any, Any], Any]]:
    """The stack length for reverse-differentiating ``loop``, and what to do with its
    ``(num_steps, overflowed)`` once the forward ran: that function returns the
    :func:`~jaxaot._src.loops.overflow.overflow_scale` the loop's tangents are multiplied by (a
    ``max_steps`` overflow poisons them with NaN; the caller checks the flag where they are used), or None."""
    if loop.prim is not while_loop_p:
        return loop.length, lambda num_steps, overflowed: None
    if loop.max_steps is not None:
        return loop.max_steps, lambda num_steps, overflowed: overflow_scale(overflowed)
    frames = _frames()
    if frames:
        capacity, trip_counts = frames[-1]

        def report(num_steps, overflowed):  # the runtime reruns with a larger capacity
            trip_counts.append(jnp.where(overflowed, jnp.asarray(capacity + 1, INT), num_steps))

        return capacity, report
    raise unbounded_error()


def is_bounded(loop: Loop) -> bool:
    """Whether reverse mode can stack ``loop``'s iterations: a bound, a length, or a
    :func:`dynamic_capacity` around it. Unbounded loops linearize as ``lax.while_loop``
    does (the whole loop staged), and only their transpose is refused."""
    return loop.prim is not while_loop_p or loop.max_steps is not None or loop.checkpoints is not None \
        or bool(_frames())


def unbounded_error() -> ReverseModeBoundError:
    """The error of transposing (``jax.grad`` / ``jax.vjp``) a loop without a bound."""
    return ReverseModeBoundError(
        "jaxaot.loops.while_loop was reverse-differentiated (jax.grad / jax.vjp / transposing a "
        "jax.linearize) without a bound on its trip count. Pass max_steps=N (stack up to N "
        "carries; more is an error) or checkpoints=k (store k snapshots and recompute), or call "
        "it inside an aot_function, whose runtime sizes the stack itself."
    )
