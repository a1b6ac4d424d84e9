"""What one compiled-gradient function keeps between calls: its mode, its last step, its counts and replays.

:func:`~jaxaot.compiled_value_and_grad` makes one :class:`Plans` per wrapped
function. It holds the parameter-hook plans by tree structure, the running
mode (lazy or eager recording, vjp capture), the structure and inputs of the
last step (a compile's reason compares against them), the guard trees of
:mod:`.replay` when replay is on, and what ``cache_info()`` reports.
"""

from __future__ import annotations

import collections

import threading
from typing import Any, Callable

from jaxaot._src.autograd.recorded import param_hooks as PH
from jaxaot._src.autograd.recorded.ahead import Ahead
from jaxaot._src.autograd.recorded import replay as R
from jaxaot._src.autograd.recorded.step_cache import Compiled
from jaxaot._src.autograd.recorded.step_reasons import explain
from jaxaot._src.autograd.recorded.structure import Trie
from jaxaot._src.runtime import ArgNames, CacheEntryInfo, CacheInfo, inputs_change


def name_of(fun: Any) -> str:
    """A function's name for messages."""
    return getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or type(fun).__name__


#: The most ``cache_info()`` entries a function keeps, the latest (as many as the process keeps executables).
MAX_INFO_ENTRIES = 256


class Plans:
    """Per-function state (module docstring). ``last`` is ``(structure, call)`` of the last step, ``call`` a
    :class:`~jaxaot._src.autograd.recorded.call.Call` whose arrays were let go."""

    def __init__(self, fun: Callable, hooks: tuple, replay: bool) -> None:
        self.name = name_of(fun)
        self.names = ArgNames.of(fun)
        self.hooks = hooks
        self.replay = replay
        self.trees = R.Trees()
        self.trie = Trie()  #: this function's structure trie (:mod:`.structure`)
        self.by_tree: dict[Any, tuple] = {}
        self.last: tuple | None = None
        self.mode = "lazy"  #: "lazy", "eager" (recording) or "vjp" (capture); see :mod:`.driver`
        self.ahead = Ahead()  #: the step started before its recording ends (:mod:`.ahead`)
        self.lock = threading.Lock()
        self.hits = 0
        self.misses = 0  #: every entry made, those dropped from :attr:`entries` included
        self.entries: collections.deque[CacheEntryInfo] = collections.deque(maxlen=MAX_INFO_ENTRIES)

    def reason(self, call: Any, miss: R.Miss | None = None) -> Callable[[Any], str]:
        """``reason(structure)``: why this call's step compiles, against the last step (``miss``: the guard
        that failed, when a replay was tried)."""
        last_structure, last_call = self.last or (None, None)
        names = self.names

        def reason(structure: Any) -> str:
            head = f"compiled_grad({self.name})"
            if last_structure is None or last_structure.kind != structure.kind:
                what = ("a step of {} recorded operations" if structure.kind == "forward"
                        else "a backward of {} operations, captured under jax.vjp")
                return f"{head}: first call ({what.format(len(structure.eqns))})"
            inputs = call.inputs(names)
            last_inputs = last_call.inputs(names) if last_call is not None else None
            if last_inputs is not None and last_inputs.avals != inputs.avals:
                change = inputs_change(last_inputs.named(names), inputs.named(names))
                if change:
                    return f"{head}: {change}"
            if last_structure.token == structure.token:
                return (f"{head}: the same program as the last step, not in the cache (or under other parameter hooks, "
                        "or another JAX configuration)")
            values = inputs.values_change(last_inputs) if last_inputs is not None else ""
            how = explain(last_structure, structure)
            guard = miss.text() if miss is not None and miss.text() not in how else ""
            lead = "; ".join(t for t in (guard, values) if t)
            return f"{head}: {lead + '; ' if lead else ''}{how}"

        return reason

    def count(self, call: Any, compiled: Compiled | None, structure: Any, record_seconds: float,
              miss: R.Miss | None = None) -> None:
        """Count one eager step: a hit, an entry for what it compiled, or (a guard failed, nothing compiled)
        an entry saying which value made it record again."""
        if compiled is not None:
            program = "step" if structure.kind == "forward" else "backward"
            entry = CacheEntryInfo(call.inputs(self.names).text(self.names), compiled.reason, (program,),
                                   program=program, compiles=(program,),
                                   times={"record": record_seconds, **compiled.times})
        elif miss is not None:
            entry = CacheEntryInfo(call.inputs(self.names).text(self.names),
                                   f"compiled_grad({self.name}): recorded again: {miss.text()}", (),
                                   program="replay", times={"record": record_seconds})
        else:
            self.hits += 1
            return
        with self.lock:
            self.entries.append(entry)
            self.misses += 1

    def cache_info(self) -> CacheInfo:
        """What this function compiled: one entry per new structure of its step (``program`` ``step``, or
        ``backward`` under vjp capture), with the seconds spent recording, tracing and in XLA and the reason.
        A structure another function compiled first counts as a hit (the cache is shared). With replay, a
        replayed step is a hit, and a call whose looked-at value took an outcome no recording had, and
        that compiled nothing, is an entry of ``program`` ``replay`` naming that value. The latest
        :data:`MAX_INFO_ENTRIES` entries are kept (a forward whose looked-at value changes every step records every
        step); ``misses`` counts them all."""
        with self.lock:
            return CacheInfo(self.hits, self.misses, tuple(self.entries))

    def plan(self, treedef: Any, tree: Any, multiple: bool) -> tuple:
        """The parameter-hook plan for differentiated values of this tree structure."""
        if not self.hooks:
            return ()
        planned = self.by_tree.get(treedef)
        if planned is None:
            planned = PH.plan(self.hooks, PH.leaf_path_texts(tree, multiple))
            with self.lock:
                self.by_tree[treedef] = planned
        return planned
