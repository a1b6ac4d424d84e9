"""Progress of long work: a ``tqdm`` bar on a terminal, else INFO lines on the ``jaxaot`` logger.

Work that can take more than a couple of seconds (timing ops, compiling the fused
step's variants, exporting, the demo) calls :func:`step`, :func:`track`,
:func:`task` or :func:`note`; this module decides how to show it: nothing under
``jaxaot.config.quiet`` or while the ``jaxaot`` logger would drop INFO (a library stays
silent until its user turns logging on), a ``tqdm`` bar where it is installed and
stderr is a terminal, else rate-limited logger lines. It imports no JAX.

Example:
    >>> [x for x in track(range(3), "counting")]  # lines on the jaxaot logger, if it shows INFO
    [0, 1, 2]
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Iterable, Iterator, TypeVar

from jaxaot._src.config import config

T = TypeVar("T")

#: The logger progress lines go to (the package's own).
LOGGER = logging.getLogger("jaxaot")
#: Seconds between two logger lines of one task (its first and last line always show).
INTERVAL = 1.0
#: What marks this module's records (``record.jaxaot_progress``), which :func:`to_stderr` shows alone.
_MARK = {"jaxaot_progress": True}

_lock = threading.RLock()  # reentrant: a handler that reports progress itself must not deadlock
_tasks: dict[tuple, "_Task"] = {}  # open tasks, keyed by (what, key) or by (what, key, id(owner))
_owned: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # an owner's counters


class _Task:
    """One task's counter, the time of its last logger line and its bar (if any)."""

    def __init__(self) -> None:
        self.done = 0
        self.logged_at: float | None = None
        self.bar: Any = None


def quiet() -> bool:
    """Whether ``jaxaot.config.quiet`` asks for silence.

    Example:
        >>> from jaxaot._src.config import config
        >>> with config.override(quiet=True):
        ...     quiet()
        True
    """
    return config.quiet


def enabled() -> bool:
    """Whether progress shows at all: not :func:`quiet`, and the ``jaxaot`` logger passes INFO to a handler."""
    return not quiet() and LOGGER.isEnabledFor(logging.INFO) and LOGGER.hasHandlers()


def step(what: str, done: int | None = None, total: int | None = None, detail: str = "", *,
         key: Hashable = None, owner: Any = None) -> None:
    """Say that unit ``done`` of ``total`` of the task ``what`` is under way.

    Args:
      what: the task, e.g. ``"timing ops"`` (one bar or line prefix per ``(what, key, owner)``).
      done: which unit (from 1); None counts the calls of this task instead.
      total: how many units there are, where known; reaching it ends the task.
      detail: what this unit is, shown after the count.
      key, owner: tell apart tasks of one ``what``; an ``owner``'s counters live as long as it does.

    Example:
        >>> step("compiling", 1, 2, "the forward")  # silent: logging is off
    """
    if not enabled():
        return
    with _lock:
        task = _find(what, key, owner)
        task.done = task.done + 1 if done is None else done
        last = total is not None and task.done >= total
        text = f"{what}: {task.done}" + (f"/{total}" if total is not None else "") + (f" ({detail})" if detail else "")
        if _use_bar():
            _close_others(task)
            if task.bar is None:
                task.bar = _new_bar(what, total)
            task.bar.n = task.done
            task.bar.set_postfix_str(detail[:60], refresh=True)
        else:
            now = time.monotonic()
            if task.logged_at is None or task.done == 1 or last or now - task.logged_at >= INTERVAL:
                task.logged_at = now
                LOGGER.info(text, extra=_MARK)
        if last:
            _end(what, key, owner)


def track(items: Iterable[T], what: str, *, total: int | None = None,
          describe: Callable[[T], str] | None = None) -> Iterator[T]:
    """Yield ``items``, calling :func:`step` before each (``total``: ``len(items)`` where it has one).

    Example:
        >>> list(track(["a", "b"], "reading", describe=str.upper))
        ['a', 'b']
    """
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    key = object()  # each loop is its own task
    try:
        for i, item in enumerate(items, 1):
            step(what, i, total, describe(item) if describe else "", key=key)
            yield item
    finally:
        with _lock:
            _end(what, key, None)


def note(text: str) -> None:
    """One line about long work under way (what is being built, where it goes), shown as progress is.

    Example:
        >>> note("jaxaot demo: a 4-layer MLP")  # silent: logging is off
    """
    if enabled():
        with _lock:
            _close_others(None)
        LOGGER.info(text, extra=_MARK)


class _Timed:
    seconds: float = 0.0


@contextlib.contextmanager
def task(what: str) -> Iterator[_Timed]:
    """Log ``"what ..."`` before a single long step and ``"what: done (0.31 s)"`` (or ``failed``) after.

    The object it yields holds the step's ``seconds`` once it ends, shown or not.

    Example:
        >>> with task("sleeping") as t:
        ...     pass
        >>> t.seconds >= 0
        True
    """
    timed = _Timed()
    show = enabled()
    if show:
        with _lock:
            _close_others(None)
        LOGGER.info(f"{what} ...", extra=_MARK)
    start = time.perf_counter()
    try:
        yield timed
    except BaseException:
        timed.seconds = time.perf_counter() - start
        if show:
            LOGGER.info(f"{what}: failed ({timed.seconds:.2f} s)", extra=_MARK)
        raise
    timed.seconds = time.perf_counter() - start
    if show:
        LOGGER.info(f"{what}: done ({timed.seconds:.2f} s)", extra=_MARK)


@contextlib.contextmanager
def to_stderr(fmt: str = "  %(message)s") -> Iterator[None]:
    """Show progress lines on (the current) ``sys.stderr`` inside the block.

    What the ``jaxaot`` command does around each command. Only this module's
    records show (the package's other INFO records, such as the compile cache's,
    are dropped). The logger's level, handlers and propagation come back as they
    were after the block; records do not also reach the root logger's handlers
    meanwhile (no line printed twice).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(lambda record: getattr(record, "jaxaot_progress", False))
    saved = LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
    try:
        yield
    finally:
        with _lock:
            _close_others(None)
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(saved[0])
        LOGGER.propagate = saved[1]


# --------------------------------------------------------------------------- bookkeeping (under _lock)
def _find(what: str, key: Hashable, owner: Any) -> _Task:
    if owner is None:
        return _tasks.setdefault((what, key), _Task())
    try:
        counters = _owned.setdefault(owner, {})
    except TypeError:  # not weakly referable: counted apart by its id while it is open
        return _tasks.setdefault((what, key, id(owner)), _Task())
    task = counters.setdefault((what, key), _Task())
    _tasks[(what, key, id(owner))] = task  # for _close_others; dropped when the task ends
    return task


def _end(what: str, key: Hashable, owner: Any) -> None:
    """Forget a finished task, closing its bar (a later run of it counts from 1 again)."""
    found = _tasks.pop((what, key) if owner is None else (what, key, id(owner)), None)
    if owner is not None:
        with contextlib.suppress(TypeError):
            _owned.get(owner, {}).pop((what, key), None)
    if found is not None and found.bar is not None:
        found.bar.close()
        found.bar = None


def _close_others(keep: _Task | None) -> None:
    """Close the bars of tasks other than ``keep``: the library's long tasks run one after another."""
    for t in _tasks.values():
        if t is not keep and t.bar is not None:
            t.bar.close()
            t.bar = None


def _use_bar() -> bool:
    """A bar where ``tqdm`` is installed (the 'progress' extra) and stderr is a terminal."""
    if not getattr(sys.stderr, "isatty", lambda: False)():
        return False
    try:
        import tqdm  # noqa: F401  (optional: the 'progress' extra)
    except ImportError:
        return False
    return True


def _new_bar(what: str, total: int | None) -> Any:
    from tqdm import tqdm  # optional: the 'progress' extra (present: _use_bar checked)

    return tqdm(total=total, desc=what, file=sys.stderr, leave=False, dynamic_ncols=True)


@atexit.register
def _close_all() -> None:
    with _lock:
        _close_others(None)
