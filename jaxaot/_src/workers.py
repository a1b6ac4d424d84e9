"""Worker threads for XLA compiles: a lowered program's ``compile()`` releases the GIL, so several compile at once.

Lowering reads the calling thread's JAX configuration (x64, matmul precision, the
mesh in context), so callers lower on their own thread and hand only
``Lowered.compile`` (or other work that reads no thread-local configuration) to
:func:`submit`. One pool serves the process; its size is the machine's cores, at most
:data:`MAX_THREADS`. Work submitted from a worker runs at once on that worker (a
worker waiting on the pool could wait for itself).

Example:
    >>> from jaxaot._src import workers
    >>> workers.submit(sum, [1, 2, 3]).result()
    6
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, Iterable

#: The most compiles that run at once.
MAX_THREADS = 8

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_LOCAL = threading.local()


def threads() -> int:
    """How many compiles run at once: the cores this process may use, at most :data:`MAX_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def overlaps() -> bool:
    """Whether work handed to :func:`submit` from this thread runs beside it (not on a worker, more than one core)."""
    return not getattr(_LOCAL, "worker", False) and threads() > 1


def _run(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    _LOCAL.worker = True
    return fn(*args, **kwargs)


def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    """``fn(*args, **kwargs)`` on a worker thread; its future. On a worker, or with one core, it runs now."""
    global _POOL
    if getattr(_LOCAL, "worker", False) or threads() == 1:
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits, as the pool would
            done.set_exception(err)
        return done
    with _LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(threads(), thread_name_prefix="jaxaot-compile")
        return _POOL.submit(_run, fn, args, kwargs)


def settle(futures: Iterable[concurrent.futures.Future]) -> None:
    """Cancel the work of ``futures`` not started and wait for the rest, keeping none of their results or errors."""
    for future in futures:
        if not future.cancel():
            future.exception()  # waits; an error of work nobody needs is nobody's
