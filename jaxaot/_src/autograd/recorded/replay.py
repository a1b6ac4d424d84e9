"""Replay: the compiled step of a recording proven static, called without running the forward's Python.

With ``replay=True`` the forward is recorded guarded: JAX sees no argument's value, so
the recording is fixed by the call's key and the outcomes of the values Python looked
at. :func:`judge` turns a recording into that path, :func:`remember` adds it to the
function's :class:`Guard` tree. A call runs the step the last call took ahead of its
looks and keeps it if the looked-at values it returns agree (:func:`expected`,
:func:`confirms`); else :func:`run` walks the tree, and an unseen outcome is a
:class:`Miss` that records. As under ``jit``, the forward's Python side effects
happen only when it is recorded (``docs/concepts/compiled_autograd.md``).
"""

from __future__ import annotations

import struct
import threading
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded.structure import closes_over

#: The most guard trees (keys) per function, and recorded paths in all its trees: past either, the oldest tree
#: is dropped (the only one starts afresh). A mixture of experts routing 4 tokens among 3 has 81 paths.
MAX_KEYS = 64
MAX_PATHS = 1024
#: Calls that walk the tree look by look after a step run ahead gave other outcomes than its path's.
WALK_AFTER_MISS = 8


class Step(NamedTuple):
    """A recorded path's end: the step executable and what the call returns besides its outputs."""

    exe: Any
    structure: Any
    kept: list       #: the forward's other outputs' leaves: None where the step returns them
    rest_tree: Any
    outcomes: tuple = ()  #: ``(how, outcome)`` per looked-at value, the last of the step's outputs
    fetch_early: bool = False  #: start the looked-at values' copies to the host at once (off a CPU device, where
    #: the step does not return them in host memory: :func:`~.step.host_copies`)


class Guard:
    """A point of a guard tree: a value Python looked at (``vid``, ``how`` it was converted, the ``plan``
    computing it, where) with one child per outcome seen, or, at a path's end, its :class:`Step`."""

    __slots__ = ("vid", "how", "plan", "source_info", "children", "step", "last", "walks")

    def __init__(self) -> None:
        self.vid: int | None = None
        self.how = ""
        self.plan: Any = None
        self.source_info: Any = None
        self.children: dict = {}
        self.step: Step | None = None
        self.last: Any = None  #: the outcome taken last (for the reason when another one comes)
        self.walks = 0  #: (at a root) calls left that walk the tree before a step runs ahead again


class Miss(NamedTuple):
    """A call whose guard failed: a looked-at value gave an outcome no recording took."""

    guard: Guard
    was: Any
    now: Any

    def text(self) -> str:
        """Which value changed, in words."""
        src = C.recorded_source(self.guard.source_info)
        where = f" at {src}" if src else ""
        how = self.guard.how
        if self.was is None or self.now is None:
            return f"the value Python looked at{where} changed"
        if how == "bool":
            return f"Python branch{where} took the other side (the condition was {self.was}, now {self.now})"
        if how == "int":
            return f"Python read {self.was} → {self.now}{where}"
        if how in ("float", "complex"):
            return f"Python read {self.was:.6g} → {self.now:.6g}{where}"
        return f"the value Python looked at{where} changed"


class _Exact:
    """A number Python received, equal only to the same bits: ``-0.0`` is not ``0.0`` (``math.copysign`` tells
    them apart), and a NaN is the same NaN again (an outcome, a key of the guard tree)."""

    __slots__ = ()

    def _bits(self) -> bytes:
        z = complex(self)  # type: ignore[arg-type]
        return struct.pack("<dd", z.real, z.imag)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._bits() == other._bits()  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._bits())


class _Float(_Exact, float):
    __slots__ = ()


class _Complex(_Exact, complex):
    __slots__ = ()


def received(value: Any, how: str) -> Any:
    """What Python received of ``value``: its truth, its int, float or complex (compared by their bits:
    :class:`_Float`), or (``value``) the whole array as ``(dtype, shape, bytes)``."""
    if type(value) is C.ArrayImpl and not value.shape:  # a scalar: converted on the host, as JAX would
        value = C.host_value(value)
    if how == "bool":
        return bool(value)
    if how == "int":
        return int(value)
    if how == "float":
        return _Float(value)
    if how == "complex":
        return _Complex(value)
    a = np.asarray(value)
    return (a.dtype, a.shape, a.tobytes())


def guarded_looks(tape: Any) -> list:
    """The looks a replay checks (the tape's, less those at literals): in the guarded step's outputs, last."""
    return [look for look in tape.looks if tape.kinds.get(look.vid) != "lit"]


def judge(recorded: Any) -> tuple[list | None, str]:
    """``(path, "")`` for a recording that may be replayed, the path being ``(vid, how, plan, source info,
    outcome)`` per value Python looked at; else ``(None, why not)``."""
    tape = recorded.tape
    if not tape.guarded or tape.eager:
        return None, "it was not recorded guarded"
    if tape.callbacks:
        return None, "the forward runs host callbacks"
    held = any(ref is None or ref() is not None for ref in tape.held)  # a one-element NumPy array's owner
    if tape.constants or held or any(op.closes or (op.staged and closes_over(op.pkey)) for op, *_ in tape.ops):
        return None, "the forward uses arrays it closes over or reads from globals"  # jit regions' too
    if any(leaf is not None and isinstance(leaf, (jax.Array, np.ndarray)) for leaf in recorded.rest):
        return None, "an auxiliary output is an array that is no recorded value"
    path = []
    for look in guarded_looks(tape):
        if look.plan is not None and look.plan.exe is None:
            return None, "a value Python looked at did not compile into one program"
        how = "value" if look.vid in tape.reads else look.how
        path.append((look.vid, how, look.plan, look.source_info, received(tape.values[look.vid], how)))
    return path, ""


class Quick(NamedTuple):
    """A call key's guard tree, found by :func:`~.call.quick_key`: where the differentiated leaves and the
    other arrays are among the flattened arguments, their tree, and a call of that key (its arrays let
    go) for the reasons of later compiles."""

    root: Guard
    diff_at: tuple
    array_at: tuple
    diff_tree: Any
    call: Any


class Trees:
    """A function's guard trees, by call key, and by quick key (thread-safe to extend; read without locking)."""

    def __init__(self) -> None:
        self.roots: dict[tuple, Guard] = {}
        self.paths: dict[tuple, int] = {}
        self.quick: dict[tuple, Quick] = {}
        self.lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.roots)

    def get(self, key: tuple) -> Guard | None:
        return self.roots.get(key)

    def add_quick(self, key: tuple, quick_key: tuple, entry: Quick) -> None:
        """Find ``entry.root``, the tree of ``key``, by ``quick_key`` too, while that tree is kept."""
        with self.lock:
            if self.roots.get(key) is not entry.root:
                return
            quick = self.quick if len(self.quick) < MAX_KEYS else dict(list(self.quick.items())[1:])  # the oldest out
            quick[quick_key] = entry
            self.quick = quick

    def _drop(self, key: tuple) -> None:
        """Forget ``key``'s tree (its quick keys too); the caller holds the lock."""
        root = self.roots.pop(key)
        self.paths.pop(key, None)
        self.quick = {q: e for q, e in self.quick.items() if e.root is not root}  # replaced whole: read unlocked

    def remember(self, key: tuple, path: Sequence[tuple], step: Step) -> None:
        """Add one recorded path (from :func:`judge`) ending in ``step``."""
        with self.lock:
            if len(self.roots) >= MAX_KEYS and key not in self.roots:
                self._drop(next(iter(self.roots)))  # the key that has been kept longest
            while self.roots and sum(self.paths.values()) >= MAX_PATHS:
                self._drop(next((k for k in self.roots if k != key), key))
            node = self.roots.setdefault(key, Guard())
            self.paths[key] = self.paths.get(key, 0) + 1
            for vid, how, plan, info, outcome in path:
                if node.step is not None or node.vid != vid or node.how != how or node.plan is not plan:
                    # a new point, or a recording that looked elsewhere here: this path replaces what was
                    node.vid, node.how, node.plan, node.source_info = vid, how, plan, info
                    node.children, node.step = {}, None
                node.last = outcome
                node = node.children.setdefault(outcome, Guard())
            node.vid, node.children, node.step = None, {}, step


def expected(root: Guard) -> Step | None:
    """The step at the end of the outcomes the last call took (None while calls walk after a miss)."""
    if root.walks:
        root.walks -= 1
        return None
    node = root
    while node.step is None:
        if node.vid is None:
            return None
        node = node.children.get(node.last)
        if node is None:
            return None
    return node.step


def confirms(step: Step, outs: Sequence[Any], root: Guard) -> bool:
    """Whether the looked-at values ``step`` returned (the last of ``outs``: off a CPU, their copies in host
    memory) take its path's outcomes;
    if not, the next :data:`WALK_AFTER_MISS` calls of ``root`` walk the tree instead of running ahead."""
    looked = outs[len(outs) - len(step.outcomes):]
    if len(looked) > 1 or step.fetch_early:  # copies queued behind the step, together
        for value in looked:
            value.copy_to_host_async()
    for value, (how, outcome) in zip(looked, step.outcomes):
        if received(value, how) != outcome:
            root.walks = WALK_AFTER_MISS
            return False
    return True


def run(root: Guard, diff: Sequence[Any], arrays: Sequence[Any]) -> Step | Miss:
    """Walk ``root``'s tree for a call with these differentiated leaves and other arrays: the
    :class:`Step` of the path its looked-at values take, or the :class:`Miss` where none was recorded."""
    env = {i: x for i, x in enumerate((*diff, *arrays))}  # the inputs' value numbers, as recorded
    node = root
    while node.step is None:
        if node.vid is None:
            return Miss(node, None, None)
        value = env.get(node.vid)
        if value is None:
            plan = node.plan
            value = env[node.vid] = plan.exe(*[env[v] for v in plan.ins])
        outcome = received(value, node.how)
        child = node.children.get(outcome)
        if child is None:
            return Miss(node, node.last, outcome)
        node.last = outcome
        node = child
    return node.step
