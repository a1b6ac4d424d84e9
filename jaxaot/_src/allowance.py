"""The device bytes plan-time work may hold: one timing's limit, and an allowance shared by the process.

:func:`byte_limit` bounds one timing's allocation (this thread). Under a byte budget the
planner also opens an :func:`allowance`, the budget less what the device holds: timings,
rate probes and candidates' compiles on worker threads (a GPU compile autotunes on device
buffers) each take their bytes with :func:`holding`, in order of asking, waiting while
others hold too much, so together they keep to the budget. A request larger than the
whole allowance runs once nothing else holds, and a thread holding bytes already is let in
at once (its own work must not wait for itself). Outside an allowance nothing waits.

Example:
    >>> from jaxaot._src import allowance
    >>> with allowance.allowance(100):
    ...     with allowance.holding(60):
    ...         allowance.held()
    60
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import threading
from typing import Iterator

_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("jaxaot_profile_bytes", default=None)

_COND = threading.Condition()
_OPEN: dict[int, int] = {}  # token -> bytes of each allowance open now (the smallest applies)
_HOLDING: dict[int, int] = {}  # ticket -> bytes held
_WAITING: collections.deque = collections.deque()  # tickets in the order they asked
_TICKETS = itertools.count()
_THREAD = threading.local()  # .held: how many holds this thread is inside


@contextlib.contextmanager
def byte_limit(nbytes: int | None) -> Iterator[None]:
    """Within the block, timing an eqn allocates at most ``nbytes`` device bytes (None: no limit;
    nested limits keep the smaller)."""
    outer = _LIMIT.get()
    token = _LIMIT.set(nbytes if outer is None else (outer if nbytes is None else min(outer, nbytes)))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def current_limit() -> int | None:
    """The byte limit :func:`byte_limit` set (None: none)."""
    return _LIMIT.get()


def _capacity() -> int | None:
    return min(_OPEN.values()) if _OPEN else None


@contextlib.contextmanager
def allowance(nbytes: int) -> Iterator[None]:
    """Within the block, work that takes bytes with :func:`holding` holds at most ``nbytes`` at once (an
    allowance opened meanwhile, here or on another thread, that is smaller applies while it is open)."""
    token = next(_TICKETS)
    with _COND:
        _OPEN[token] = max(int(nbytes), 0)
        _COND.notify_all()
    try:
        yield
    finally:
        with _COND:
            del _OPEN[token]
            _COND.notify_all()


def held() -> int:
    """Bytes held now by work under :func:`holding`."""
    with _COND:
        return sum(_HOLDING.values())


def _admits(ticket: int, nbytes: int) -> bool:
    capacity = _capacity()
    if capacity is None or getattr(_THREAD, "held", 0):
        return True
    if _WAITING[0] != ticket:
        return False
    return not _HOLDING or sum(_HOLDING.values()) + nbytes <= capacity


@contextlib.contextmanager
def holding(nbytes: int) -> Iterator[None]:
    """Hold ``nbytes`` of the open allowance for the block, waiting (in order of asking) until they fit; at
    once where no allowance is open or ``nbytes`` is 0."""
    nbytes = max(int(nbytes), 0)
    if nbytes == 0:
        yield
        return
    ticket = next(_TICKETS)
    with _COND:
        _WAITING.append(ticket)
        try:
            _COND.wait_for(lambda: _admits(ticket, nbytes))
        finally:
            _WAITING.remove(ticket)
            _COND.notify_all()
        _HOLDING[ticket] = nbytes
    _THREAD.held = getattr(_THREAD, "held", 0) + 1
    try:
        yield
    finally:
        _THREAD.held -= 1
        with _COND:
            del _HOLDING[ticket]
            _COND.notify_all()
