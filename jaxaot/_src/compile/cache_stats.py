"""What the persistent cache did in this process: hit/miss/corrupt counts, and its warnings.

The counts are process-wide and thread-safe. Every :class:`~jaxaot.errors.CacheWarning`
goes through :func:`warn_once`, so a bad file (or an unwritable directory) is
reported once per process, not once per call, and points at the user's call.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import warnings
from pathlib import Path

import jax

from jaxaot.errors import CacheWarning


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """Counts since the process started (or :func:`jaxaot.compilers.reset_cache_stats`).

    ``skipped`` counts partitions and programs that cannot be cached (a
    partitioner ``split_joint`` cannot reproduce, a result that is not a
    serialisable ``jax.stages.Compiled``, host callbacks, unhashable consts,
    an entry directory that is refused). ``corrupt`` counts entries read and
    refused: truncated, badly signed, signed for another key (moved, renamed or
    swapped), not a private regular file, or an executable that does not fit
    its call; each is rebuilt.
    """

    partition_hits: int = 0
    partition_misses: int = 0
    executable_hits: int = 0
    executable_misses: int = 0
    corrupt: int = 0
    skipped: int = 0


_counts: collections.Counter = collections.Counter()
_warned: set[str] = set()
_lock = threading.Lock()


def stats() -> CacheStats:
    """The hit/miss/corrupt counts of this process.

    Example:
        >>> import jaxaot
        >>> isinstance(jaxaot.compilers.cache_stats().executable_misses, int)
        True
    """
    with _lock:
        return CacheStats(**{f.name: _counts[f.name] for f in dataclasses.fields(CacheStats)})


def reset_stats() -> None:
    """Zero the counts and forget which files were already warned about."""
    with _lock:
        _counts.clear()
        _warned.clear()


def count(name: str) -> None:
    """Add one to the :class:`CacheStats` field ``name``."""
    with _lock:
        _counts[name] += 1


#: Frames in these folders are jaxaot's and JAX's own: a warning points past them.
_INTERNAL = (str(Path(__file__).resolve().parents[2]) + os.sep,
             os.path.dirname(os.path.realpath(jax.__file__)) + os.sep)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside jaxaot and JAX, for a warning issued by this module's caller's
    caller (the user's call however deep the cache was reached; 2 if every frame is internal)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def warn_once(path: Path | str, message: str) -> None:
    """Issue a :class:`~jaxaot.errors.CacheWarning` about ``path``, unless one was issued already, pointing at the
    user's call (the first frame outside jaxaot and JAX), so that a filter on the user's module applies."""
    with _lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warnings.warn(message, CacheWarning, stacklevel=_user_stacklevel())
