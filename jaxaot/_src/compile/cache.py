"""The persistent compile cache: partitions and compiled executables on disk.

With ``jaxaot.config.cache_dir`` (or ``JAXAOT_CACHE_DIR``) set, the runtime asks
:func:`cached_partition` and :func:`cached_compile` instead of the partitioner and
XLA, so a warm process only traces. Entries are framed, signed and written
atomically by :mod:`~jaxaot._src.compile.store`, under keys from
:mod:`~jaxaot._src.compile.cache_keys`; programs with callbacks or effects are never
stored. A corrupt, foreign or misfitting entry is reported once and rebuilt, and
cache I/O never fails a call: a bad entry costs a compile, never a wrong answer.
:func:`stats` counts what happened.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot, tempfile
    >>> from jaxaot._src.compile import cache
    >>> with jaxaot.config.override(cache_dir=tempfile.mkdtemp()):
    ...     _ = jax.grad(jaxaot.aot_function(lambda x: jnp.sin(x).sum()))(jnp.ones(3))
    ...     _ = jax.grad(jaxaot.aot_function(lambda x: jnp.sin(x).sum()))(jnp.ones(3))
    >>> cache.stats().executable_hits >= 2
    True
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any, Callable, Sequence

from jaxaot._src import compat as C
from jaxaot._src import workers
from jaxaot._src.config import config
from jaxaot._src.compile import executable_codec, partition_codec, store
from jaxaot._src.compile.cache_keys import executable_key, partition_key
from jaxaot._src.compile.cache_stats import CacheStats, count, reset_stats, stats
from jaxaot._src.compile.compilers import RUN_EACH_COMPILE, Compiler, lower_xla, xla
from jaxaot._src.partition import Partition, Partitioner, measured_executables
from jaxaot._src.tracing import JointGraph, JointRecipe

__all__ = ["CacheStats", "cached_compile", "cached_partition", "reset_stats", "start_compile", "stats"]


def cached_partition(partition_fn: Partitioner, recipe: JointRecipe, joint: Callable[[], JointGraph]) -> Partition:
    """``partition_fn(joint())``, from the cache when an entry exists (runtime hook).

    ``joint()`` returns the joint graph of ``recipe``. The entry is keyed by the
    recipe, not the joint graph, so a hit that replays a primal rewrite (the
    min-cut's scan remat) never calls ``joint``: a warm start traces one joint graph.
    """
    if store.cache_root() is None:
        return partition_fn(joint())
    key = partition_key(partition_fn, recipe)
    path = None if key is None else store.entry_path("partitions", key)
    if path is None:
        count("skipped")
        return partition_fn(joint())
    payload = store.read(path)
    if payload is not None:
        part = partition_codec.decode(recipe, payload, joint)
        if part is not None:
            count("partition_hits")
            return part
        store.corrupt(path, "its saved set does not rebuild a valid partition of this joint graph")
    count("partition_misses")
    part = partition_fn(joint())
    if not isinstance(part, Partition):
        return part  # nothing to store: the runtime refuses it, naming the partitioner
    record = partition_codec.encode(joint(), part)
    if record is None:
        count("skipped")
    else:
        store.write(path, record)
    return part


def cached_compile(compiler: Compiler, closed: Any, avals: Sequence[Any], *,
                   pending: concurrent.futures.Future | None = None, **options: Any) -> Any:
    """``compiler(closed, avals, **options)``, from the cache when an entry exists (runtime hook), else the
    byte-budget search's executable of the same program where it holds one, or, without a cache entry to write,
    its cheaper one standing for this compile until it finishes (:func:`_measured`).

    ``pending``: :func:`start_compile`'s compile of this very call, waited for instead of calling the
    compiler (its error raised as the compiler's would be)."""
    path = _executable_path(compiler, closed, avals, options)
    if path is not None:
        exe = _read_executable(path, closed, avals)
        if exe is not None:
            count("executable_hits")
            return exe
        count("executable_misses")
    exe = _measured(compiler, closed, avals, options,
                    provisional=path is None and pending is None and config.provisional_steps)
    if exe is None:
        exe = pending.result() if pending is not None else compiler(closed, avals, **options)
    if path is not None:
        blob = executable_codec.encode(exe, len(avals), len(C.jaxpr_of(closed).outvars))
        if blob is None:
            count("skipped")
        else:
            store.write(path, blob)
    return exe


def start_compile(compiler: Compiler, closed: Any, avals: Sequence[Any], **options: Any
                  ) -> concurrent.futures.Future | None:
    """:func:`cached_compile`'s compile of the same call, lowered on this thread and compiled on a worker
    (:mod:`jaxaot._src.workers`), for its ``pending``; None where it would not compile: a compiler other than
    :func:`~jaxaot._src.compile.compilers.xla` (compiled on the calling thread as ever), an entry in the
    cache or the search's executable of this program, work that cannot run beside this thread, or a program
    that does not lower (the compile then raises where it ran before)."""
    if compiler is not xla or not set(options) <= {"donate_argnums"} or not workers.overlaps():
        return None
    if _stored(compiler, closed, avals, options) or measured_executables.holds(
            closed, avals, {}, options.get("donate_argnums", ())):
        return None
    try:
        lowered = lower_xla(closed, avals, **options)
    except Exception:  # noqa: BLE001 - raised again by the compile that needs this program
        return None
    return workers.submit(compile_lowered, lowered)


def compile_lowered(lowered: Any) -> Any:
    """``lowered.compile()``: what :func:`start_compile` runs on a worker."""
    return lowered.compile()


def _stored(compiler: Compiler, closed: Any, avals: Sequence[Any], options: dict[str, Any]) -> bool:
    """Whether the cache has an entry for this compile (read by :func:`cached_compile`, not here)."""
    if store.cache_root() is None or _runs_host_code(closed):
        return False
    key = executable_key(compiler, closed, avals, options)
    path = None if key is None else store.entry_path("executables", key)
    return path is not None and path.exists()


def _executable_path(compiler: Compiler, closed: Any, avals: Sequence[Any], options: dict[str, Any]) -> Path | None:
    """Where the cache keeps this compile's executable; None without a cache, or where it cannot be kept
    (counted as skipped)."""
    if store.cache_root() is None:
        return None
    unstored = _runs_host_code(closed) or any(compiler is c for c in RUN_EACH_COMPILE)  # a compiler may not hash
    key = None if unstored else executable_key(compiler, closed, avals, options)
    path = None if key is None else store.entry_path("executables", key)
    if path is None:
        count("skipped")
    return path


def _read_executable(path: Path, closed: Any, avals: Sequence[Any]) -> Any | None:
    """The executable stored at ``path`` where it loads and fits this call; a bad entry is reported and dropped."""
    payload = store.read(path)
    if payload is None:
        return None
    exe = executable_codec.decode(payload)
    if exe is None:
        store.corrupt(path, "the serialized executable could not be loaded")
        return None
    misfit = executable_codec.misfit(exe, avals, [v.aval for v in C.jaxpr_of(closed).outvars])
    if misfit is not None:
        store.evict(path, f"it does not fit its call: {misfit}")
        return None
    return exe


def _measured(compiler: Compiler, closed: Any, avals: Sequence[Any], options: dict[str, Any],
              provisional: bool = False) -> Any | None:
    """For :func:`~jaxaot._src.compile.compilers.xla`, the executable a byte budget's search compiled of the same
    program to measure it, where it holds one (the same ``jax.jit(...).lower(avals).compile()``, with the
    backend's own options, donating the same inputs); else, with ``provisional`` and where it measured it with
    cheaper options (on CPU), that executable, run until this compile, begun on a worker, finishes
    (:class:`Provisional`); else None."""
    if compiler is not xla or not set(options) <= {"donate_argnums"}:
        return None
    donated = options.get("donate_argnums", ())
    exe = measured_executables.take(closed, avals, {}, donated)
    if exe is not None or not provisional or not workers.overlaps():
        return exe
    exe = measured_executables.take_provisional(closed, avals, {}, donated)
    if exe is None:
        return None
    try:
        lowered = lower_xla(closed, avals, **options)
    except Exception:  # noqa: BLE001 - raised again by the compile the caller makes, on the calling thread
        return None
    return Provisional(exe, workers.submit(compile_lowered, lowered))


class Provisional:
    """An executable compiled with cheaper options, standing for the runtime's own compile of the same program
    until that finishes on a worker: then calls and attributes go to the runtime's (whose peak is the same or a
    few bytes lower, whose code is faster). Where that compile fails, the cheaper one stays."""

    def __init__(self, exe: Any, final: concurrent.futures.Future):
        self.executable, self.final = exe, final
        final.add_done_callback(self._swap)

    def _swap(self, done: concurrent.futures.Future) -> None:
        if done.exception() is None:
            self.executable = done.result()

    def __call__(self, *args: Any) -> Any:
        return self.executable(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executable, name)


def _runs_host_code(closed: Any) -> bool:
    # A serialized executable cannot carry a Python callback; effects (ordered
    # callbacks, prints) must run, so such programs are always compiled afresh.
    return bool(C.jaxpr_of(closed).effects) or any(C.is_host_callback(e) for e in C.iter_eqns(closed))
