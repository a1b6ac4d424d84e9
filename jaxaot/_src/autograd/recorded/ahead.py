"""A recorded step's executable started before its recording ends, on the arrays it is expected to read.

Once two calls in a row ran the same step executable, the next call starts it at
once, on its differentiated leaves and the arrays the step read last time (the
call's arrays by position, others by identity, held weakly), so that the device
computes while Python records. When the recording ends at that executable on the
same arrays, the started run's outputs are the step's; else they are dropped, and
the function waits a while (longer after each miss) before starting one again.
The step also returns the scalars Python looked at: a look at the same point, on
the arrays the step was given, takes its value from the started run (:meth:`Started.look`;
off a CPU Python reads the step's copy in pinned host memory), not a program of its own. A step with host
callbacks (:data:`EFFECTFUL`) is never started ahead. ``jaxaot.config.start_steps_ahead = False`` starts none.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable, NamedTuple, Sequence

from jaxaot._src.compat import ArrayImpl as _ArrayImpl
from jaxaot._src.config import config

#: The most calls a function waits, after a miss, before it starts a step ahead again.
MAX_WAIT = 64
#: Step executables with effects (a host callback in a custom rule's backward): never started before it is known
#: that they run (a started run that is dropped would have run its callbacks, and for the branch not taken).
EFFECTFUL: weakref.WeakSet = weakref.WeakSet()


class Started(NamedTuple):
    """A step started ahead: its executable, the arrays it was given, its outputs (not waited for), and
    where among them the values Python looked at are (a look's plan -> index among the recorded outputs, and
    index of its copy in pinned host memory or None)."""

    exe: Any
    args: list
    out: Any
    looks: dict

    def look(self, plan: Any, args: Sequence[Any]) -> tuple[Any, Any] | None:
        """``(value, what Python reads)`` of ``plan`` from this step's outputs, when the step returns it and the
        arrays a recording read so far (``args``, in order) are the first of those the step was given; else None.
        Python reads the value's copy in pinned host memory where the step returns one, and the recording keeps
        the value in device memory, where the later operations read it."""
        found = self.looks.get(plan)
        if found is None or len(args) > len(self.args) or not all(map(operator.is_, args, self.args)):
            return None
        k, h = found
        return self.out[1][k], self.out[1][k if h is None else h]


class Ahead:
    """One function's step started ahead (module docstring): the executable the last call ran, where its
    arrays came from, and how many calls to wait after a miss."""

    __slots__ = ("exe", "sources", "looks", "last", "wait", "backoff")

    def __init__(self) -> None:
        self.exe: Any = None          #: the executable to start (None: start none)
        self.sources: tuple = ()      #: per array it reads: the call's array at that index, or a weak reference
        self.looks: dict = {}         #: a look's plan -> its value's and host copy's indices (:attr:`Started.looks`)
        self.last: Any = None         #: the executable the last recorded call ran
        self.wait = 0                 #: calls left before one starts ahead again
        self.backoff = 1              #: calls to wait after the next miss

    def start(self, diff: Sequence[Any], arrays: Sequence[Any]) -> Started | None:
        """Start the expected step on ``diff`` (differentiated leaves, device arrays) and ``arrays`` (the call's
        other arrays); None when none is expected, a leaf is no device array, or an array it read is gone."""
        exe = self.exe
        if exe is None or not config.start_steps_ahead or any(
                type(x) is not _ArrayImpl or x.is_deleted() for x in diff):
            return None  # (a NumPy leaf could change before the recording reads it; a donated one is gone)
        args = _expected(self.sources, arrays)
        if args is None:
            return None
        try:
            out = exe(list(diff), args)
        except Exception:  # noqa: BLE001 - the step runs again after its recording, and raises there
            return None
        for k, h in self.looks.values():  # the copies to the host queue behind the step: ready when Python looks
            if h is None:
                out[1][k].copy_to_host_async()
        return Started(exe, args, out, self.looks)

    def finish(self, started: Started | None, exe: Any, args: Sequence[Any], objects: Sequence[Any],
               arrays: Sequence[Any], looks: Callable[[], dict] | None = None) -> Any:
        """The outputs of ``started`` when the recording ended at its executable on the same ``args`` (None:
        run ``exe``). Learns what the next call starts: ``exe`` once two calls in a row ran it. ``objects``: what
        the forward used for each of ``args`` (a NumPy array, where the step reads its copy on the device);
        ``looks()``: where the step returns the values Python looked at (:attr:`Started.looks`), read only
        when the next call is to start ``exe``."""
        if started is not None:
            if started.exe is exe and len(args) == len(started.args) and all(map(operator.is_, args, started.args)):
                self.backoff = 1
                return started.out  # the same executable on the same arrays: what it starts next time too
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_WAIT)
        stable = exe is self.last and exe not in EFFECTFUL
        self.last = exe
        if self.wait:
            self.wait -= 1
            self.exe = None
        elif stable:
            sources = _sources(args, objects, arrays)
            self.exe, self.sources = (exe, sources) if sources is not None else (None, ())
            self.looks = looks() if looks is not None and self.exe is not None else {}
        else:
            self.exe = None
        return None

    def drop(self) -> None:
        """The recording failed: start nothing until two calls in a row run one executable again."""
        self.exe = self.last = None


def _sources(args: Sequence[Any], objects: Sequence[Any], arrays: Sequence[Any]) -> tuple | None:
    """Where each of ``args`` came from: the index of the same object among ``arrays``, else a weak reference
    to it; None when one is a copy the recording made (of a NumPy array, new at each call) or cannot be
    referenced weakly."""
    out = []
    for a, o in zip(args, objects, strict=True):
        at = next((i for i, x in enumerate(arrays) if x is a), None)
        if at is None:
            if o is not a:
                return None
            try:
                at = weakref.ref(a)
            except TypeError:
                return None
        out.append(at)
    return tuple(out)


def _expected(sources: tuple, arrays: Sequence[Any]) -> list | None:
    """The arrays ``sources`` name in this call, or None when one of them is gone or deleted."""
    out = []
    for s in sources:
        if type(s) is int:
            if s >= len(arrays) or (type(arrays[s]) is _ArrayImpl and arrays[s].is_deleted()):
                return None  # (the runtime would log that it cannot read a donated buffer)
            out.append(arrays[s])
        else:
            a = s()
            if a is None or a.is_deleted():  # gone, or donated to another program since (a buffer no longer there)
                return None
            out.append(a)
    return out
