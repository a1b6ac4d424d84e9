"""What :meth:`LoadedAOT.cache_info <jaxaot._src.artifacts.loaded.LoadedAOT.cache_info>` reports.

``jax.export`` programs compile per concrete input shape on their first call: the log keeps one entry per
input shapes seen, the programs run for it and the reason it is new, against the nearest shapes seen before.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

import numpy as np

from jaxaot._src.pytrees import format_aval
from jaxaot._src.runtime import CacheEntryInfo, CacheInfo, inputs_change, log_compile


def shapes_of(leaves: Sequence[Any]) -> tuple:
    return tuple(tuple(np.shape(x)) for x in leaves)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """An input as the signature names it (a dtype name, typed PRNG keys included) for the call log's text."""
    shape: tuple
    dtype: str


class CallLog:
    """What :meth:`LoadedAOT.cache_info` reports: the input shapes seen (each a compile of the programs it ran,
    by JAX, on their first call) and lookups that found theirs."""

    def __init__(self, loaded: Any):
        self.loaded, self.hits, self.lock = loaded, 0, threading.Lock()
        self.entries: dict[tuple, tuple[str, list[str]]] = {}  # input shapes -> (reason, programs run)
        self.by_residuals: dict[tuple, tuple] = {}  # residual shapes -> input shapes (the backward's entry)

    def look_up(self, shapes: tuple) -> None:
        if shapes in self.entries:
            self.hits += 1
            return
        with self.lock:
            if shapes not in self.entries:
                named = self._named(shapes)
                old = min(self.entries, key=lambda k: sum(a != b for a, b in zip(k, shapes)), default=None)
                reason = "first call" if old is None else inputs_change(self._named(old), named) or "new shapes"
                self.entries[shapes] = (reason, [])
                log_compile(self.loaded.__name__, self._text(named), reason)

    def ran(self, shapes: tuple, program: str, residuals: tuple | None = None) -> None:
        entry = self.entries.get(shapes)
        if entry is not None and program not in entry[1]:
            with self.lock:
                if program not in entry[1]:
                    entry[1].append(program)
        if residuals is not None and residuals not in self.by_residuals:
            self.by_residuals[residuals] = shapes

    def ran_backward(self, residuals: tuple) -> None:
        shapes = self.by_residuals.get(residuals)
        if shapes is not None:
            self.ran(shapes, "backward")

    def _named(self, shapes: tuple) -> list:
        s = self.loaded.signature
        return [(p, _Leaf(tuple(shape), spec.dtype)) for p, spec, shape in zip(s.in_paths, s.in_specs, shapes)]

    @staticmethod
    def _text(named: list) -> str:
        return ", ".join(f"{p}: {format_aval(a)}" for p, a in named)

    def info(self) -> CacheInfo:
        with self.lock:
            items = [(k, reason, tuple(run)) for k, (reason, run) in self.entries.items()]
        entries = tuple(CacheEntryInfo(self._text(self._named(k)), reason, run, compiles=run)
                        for k, reason, run in items)
        return CacheInfo(self.hits, len(entries), entries)
