"""The fused step's compiles begun together on worker threads, so that the variants weighed compile at once.

On an accelerator :func:`~jaxaot._src.fusion.fused_exe` compiles the step and then
each variant it weighs, and the first call times the split programs against it.
Each compile takes seconds; after the step's own (which autotunes the matrix
products the others share), they are independent, so :class:`Prefetch` lowers each
program on the calling thread (lowering reads its JAX configuration) and hands the
XLA compile to :mod:`jaxaot._src.workers`. The decision chain then runs as it
would without it, taking a begun compile where one of its very program exists and
compiling on the calling thread otherwise, so the choices and executables are the
same; compiles it did not ask for are dropped (:meth:`Prefetch.close`). On CPU,
whose layouts are row-major, nothing is begun ahead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Iterable, Sequence

from jaxaot._src import workers
from jaxaot._src.compile import xla
from jaxaot._src.partition import program_platform

#: Whether compiles are begun ahead on accelerators (a switch for tests: off, the chain compiles in turn).
ENABLED = True


@dataclasses.dataclass(frozen=True)
class Variant:
    """The options of one fused step program (:func:`~jaxaot._src.fusion.fused_program`), as the chain weighs them.

    Attributes:
      barrier: ``"all"``, ``"recomputed"`` or ``"none"``.
      layouts: ``"auto"`` or ``"pinned"``.
      order: ``"xla"`` or ``"consume_first"``.
      rederived: the residual positions the backward derives again.
      slices: whether residual slices are kept.
    """

    barrier: str
    layouts: str = "auto"
    order: str = "xla"
    rederived: tuple[int, ...] = ()
    slices: bool = True


def speculates(compiler: Any, avals: Sequence[Any], platforms: Iterable[str]) -> bool:
    """Whether compiles for ``avals`` are begun ahead: :data:`ENABLED`, XLA's own compiler (another compiles on
    the calling thread), workers that run beside this thread, and a platform in ``platforms``."""
    return (ENABLED and compiler is xla and workers.overlaps()
            and program_platform(avals) in frozenset(platforms))


class Prefetch:
    """Compiles begun on workers by key (a fused step's :class:`Variant`, a split program's name), each taken at
    most once; :meth:`close` drops the rest.

    ``build(key)`` returns what a key compiles (a program) and ``start(built)`` its begun compile (a future), or
    None where it compiles on the calling thread.
    """

    def __init__(self, build: Callable[[Any], Any], start: Callable[[Any], concurrent.futures.Future | None]):
        self._build, self._start = build, start
        self._begun: dict[Any, tuple[Any, concurrent.futures.Future]] = {}
        self._seen: set = set()

    def begin(self, keys: Iterable[Any]) -> None:
        """Build each key not yet begun (lowering on this thread) and begin its compile on a worker."""
        for v in keys:
            if v in self._seen:
                continue
            self._seen.add(v)
            try:
                program = self._build(v)
            except Exception:  # noqa: BLE001 - raised again, or refused as ever, where the chain builds it
                continue
            future = self._start(program)
            if future is not None:
                self._begun[v] = (program, future)

    def take(self, key: Any) -> tuple[Any, concurrent.futures.Future | None]:
        """``(what it built, its begun compile)`` for ``key``, no longer held; ``(None, None)`` where none was begun."""
        return self._begun.pop(key, (None, None))

    def ready(self) -> bool:
        """Whether every compile begun and not yet taken has finished (taking one then waits for nothing)."""
        return all(future.done() for _, future in self._begun.values())

    def wait(self) -> None:
        """Wait until every compile begun and not yet taken has finished."""
        concurrent.futures.wait([future for _, future in self._begun.values()])

    def close(self) -> None:
        """Drop the compiles not taken: those not started are cancelled, running ones waited for (so none
        runs beside what follows, a timed step) and their executables let go."""
        begun, self._begun, self._seen = list(self._begun.values()), {}, set()
        workers.settle(future for _, future in begun)
