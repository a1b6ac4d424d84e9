"""The process-wide cache of compiled steps and backwards, its counters and its recompile reasons.

An entry is keyed by a recording's structure (its inputs, equations and wiring)
plus what the executable bakes in (parameter hooks), so functions with the same
program share one executable. It is thread-safe (each structure compiles once,
other threads wait for it; a failed compile leaves no entry) and holds at most
``jaxaot.config.compiled_autograd_cache_size`` entries, least recently used dropped;
a structure compiled again after that says so. :func:`stats` and :func:`reset` are
``jaxaot.compiled_autograd.stats()`` and ``reset()``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any, Callable, Hashable, NamedTuple

from jaxaot._src.config import config

logger = logging.getLogger("jaxaot")


@dataclasses.dataclass(frozen=True)
class Stats:
    """What the compiled-autograd cache has done since the last :func:`reset`.

    Attributes:
      compiles: backwards compiled (one per new structure).
      hits: steps that reused a compiled backward.
      reasons: one readable line per compile, saying what changed (old vs new).
      entries: executables held now.
      fallbacks: one line per function that left lazy recording, saying why
        and for which mode (eager recording, or ``jax.vjp`` with a captured backward).
      replays: steps that ran a compiled step without running the forward's Python (``replay=True``);
        they count among the hits too.
      evictions: executables dropped to keep to ``jaxaot.config.compiled_autograd_cache_size``.
    """

    compiles: int
    hits: int
    reasons: tuple[str, ...]
    entries: int
    fallbacks: tuple[str, ...] = ()
    replays: int = 0
    evictions: int = 0


class Compiled(NamedTuple):
    """What one compile cost and why it happened (:meth:`BackwardCache.get` returns it to the caller that
    compiled; the per-function ``cache_info()`` keeps it)."""

    reason: str
    times: dict   #: seconds per stage: ``trace_step`` (the replay traced) and ``compile_step`` (XLA), say


class _Entry:
    """One compiled backward; ``ready`` is set once ``executable`` (or ``error``) is there."""

    __slots__ = ("executable", "error", "ready", "structure")

    def __init__(self, structure: Any) -> None:
        self.executable: Any = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.structure = structure


class BackwardCache:
    """``key -> compiled backward``, compiling each key once across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: "collections.OrderedDict[Hashable, _Entry]" = collections.OrderedDict()
        self._compiles = 0
        self._hits = 0
        self._reasons: list[str] = []
        self._fallbacks: list[str] = []
        self._replays = 0
        self._evictions = 0
        self._evicted: "collections.OrderedDict[int, None]" = collections.OrderedDict()  # hashes of dropped keys

    def get(self, key: Hashable, structure: Any, compile_fn: Callable[[], tuple[Any, dict]],
            reason_fn: Callable[[], str]) -> tuple[Any, Compiled | None]:
        """``(executable for key, None)``, or on a miss ``(executable, Compiled)`` for the caller that compiled
        it: ``compile_fn()`` returns the executable and its stage times, ``reason_fn()`` says why."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                owner = False
            else:
                entry = self._entries[key] = _Entry(structure)
                owner = True
                limit = config.compiled_autograd_cache_size
                while len(self._entries) > limit:
                    self._evicted[hash(self._entries.popitem(last=False)[0])] = None
                    self._evictions += 1
                while len(self._evicted) > limit:
                    self._evicted.popitem(last=False)
                back = hash(key) in self._evicted  # compiled before, dropped since
                if back:
                    del self._evicted[hash(key)]
        if not owner:
            entry.ready.wait()
            if entry.error is not None:
                raise entry.error
            return entry.executable, None
        try:
            reason = reason_fn()
            if back:
                reason += (f" (compiled before, and dropped since: the cache keeps {limit} executables, "
                           f"jaxaot.config.compiled_autograd_cache_size)")
            entry.executable, times = compile_fn()
        except BaseException as e:
            entry.error = e
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            raise
        finally:
            entry.ready.set()
        with self._lock:
            self._compiles += 1
            self._reasons.append(reason)
        logger.info("compiled autograd: %s", reason)
        return entry.executable, Compiled(reason, times)

    def note_replay(self) -> None:
        with self._lock:
            self._replays += 1
            self._hits += 1

    def note_fallback(self, reason: str) -> None:
        with self._lock:
            self._fallbacks.append(reason)
        logger.info("compiled autograd: %s", reason)

    def stats(self) -> Stats:
        with self._lock:
            return Stats(self._compiles, self._hits, tuple(self._reasons), len(self._entries), tuple(self._fallbacks),
                         self._replays, self._evictions)

    def reset(self) -> None:
        with self._lock:
            self._entries.clear()
            self._evicted.clear()
            self._compiles = self._hits = self._replays = self._evictions = 0
            self._reasons.clear()
            self._fallbacks.clear()


#: The cache every compiled_grad uses.
CACHE = BackwardCache()
#: The programs that compute values Python looks at while a forward is recorded (:mod:`.force`), by
#: structure; apart from :data:`CACHE`, so its counts and reasons are the steps' alone.
LOOKS = BackwardCache()


def stats() -> Stats:
    """Compiles, cache hits and the reason for each compile, since the last :func:`reset`.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> jaxaot.compiled_autograd.reset()
        >>> g = jaxaot.compiled_grad(lambda x: jnp.sum(x ** 2))
        >>> for _ in range(3):
        ...     _ = g(jnp.ones(3))
        >>> s = jaxaot.compiled_autograd.stats()
        >>> (s.compiles, s.hits)
        (1, 2)
    """
    return CACHE.stats()


def note_fallback(reason: str) -> None:
    """Record (and log) that a function left lazy recording, and why."""
    CACHE.note_fallback(reason)


def note_replay() -> None:
    """Count one replayed step (:mod:`.replay`)."""
    CACHE.note_replay()


def reset() -> None:
    """Drop every compiled step and backward (and the programs of looked-at values), and zero the counters."""
    CACHE.reset()
    LOOKS.reset()
