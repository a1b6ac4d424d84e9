"""The structure of a recorded forward or a captured backward: what decides whether an executable fits it.

Two programs share a :class:`Structure` when they have the same inputs, equations
(primitive, params, literals, output avals) and wiring, whatever the objects: the
key is a nested tuple built in one pass, so a dict looks it up and a hash
collision costs a comparison, never a wrong executable. Literal values are part of
the key (keep data-dependent scalars as arrays), as are the values of arrays a
sub-jaxpr closes over (:class:`ConstValues`). A recording builds its key
incrementally down a bounded trie of :class:`Node`, so a path seen before gets
its ``Structure`` back without building a key.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
import threading
import types
import weakref
from typing import Any

import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.python_reads import closure_values, function_key, is_library, rule_reads

#: id(sub-jaxpr) -> (the jaxpr, its key): sub-jaxprs recur across steps (loop bodies are cached by JAX).
_SUB_KEYS: "collections.OrderedDict[int, tuple[Any, tuple]]" = collections.OrderedDict()
_SUB_MAX = 512
_SUB_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Structure:
    """A program's key, plus what :func:`explain` needs to say how two keys differ.

    Attributes:
      key: the hashable key (inputs, equations, outputs).
      jaxpr: what it was computed from, a jaxpr or a tape (with ``eqns`` carrying
        ``source_info``), for source lines in reasons.
      vid_avals: for tapes, the aval key of every value by its number.
      kind: ``"backward"`` (a captured backward) or ``"forward"`` (a recorded forward).
      looks: for tapes, the values Python looked at while recording (:class:`~.tape.Look`), not part
        of the key: which side a Python branch took shows only through the equations that follow.
    """

    key: tuple
    jaxpr: Any
    vid_avals: tuple | None = None
    kind: str = "backward"
    looks: tuple = dataclasses.field(default=(), compare=False)
    token: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.token is None:  # the key, hashed once: what caches look this structure up by
            object.__setattr__(self, "token", _Interned(self.key))

    def with_looks(self, looks: tuple) -> "Structure":
        """``dataclasses.replace(self, looks=looks)``, without running ``__init__`` again (once per recording)."""
        new = object.__new__(Structure)
        new.__dict__.update(self.__dict__, looks=looks)
        return new

    @property
    def inputs(self) -> tuple:
        return self.key[0]

    @property
    def eqns(self) -> tuple:
        return self.key[1]


def literal_value_key(x: Any) -> tuple | None:
    """The value part of a scalar literal's key (a Python or NumPy scalar, a one-element NumPy array), or None
    when ``x`` is no scalar literal. Floats by their exact bits (``-0.0`` and ``0.0`` differ)."""
    t = type(x)
    if t is float:
        return ("f", x.hex())
    if t is int:
        return ("i", x)
    if t is bool:
        return ("b", x)
    if t is complex:
        return ("c", x.real.hex(), x.imag.hex())
    if isinstance(x, (np.generic, np.ndarray)):  # before the subclasses: np.float64 is a float, typed as JAX types it
        if np.size(x) != 1:
            return None
        a = np.asarray(x)
        return ("a", a.dtype, a.shape, a.tobytes())
    if isinstance(x, (bool, int, float, complex)):  # a subclass (IntEnum, ...): by the value it carries
        base = next(b for b in (bool, int, float, complex) if isinstance(x, b))
        return literal_value_key(base(x))
    return None


def owner(x: np.ndarray) -> Any:
    """A weak reference to the NumPy array owning ``x``'s memory (``x`` is often JAX's view of it), or None where
    no array owns it (a buffer of another kind). One still alive when a recording ends is the forward's state
    (closed over, a global): a one-element array is keyed as a literal, yet may be written in place."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return weakref.ref(x) if x.base is None else None


def handed_to_jax() -> list:
    """The owners (:func:`owner`) of the one-element NumPy arrays the forward handed to the JAX function
    running: JAX converts one of another dtype to a copy of its own (``float64`` to ``float32``), which keeps
    no link to it. Its frames are walked up to the forward's."""
    found = []
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("jax.", "jaxaot.")):
            break
        if module.startswith("jax."):
            for v in frame.f_locals.values():
                for a in v if type(v) is tuple else (v,):
                    if type(a) is np.ndarray and a.size == 1:
                        found.append(owner(a))
        frame = frame.f_back
    return found


def aval_key(aval: Any) -> tuple:
    """``(shape, dtype, weak_type)`` of an aval."""
    return (tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False)))


_aval_key = aval_key


class _Interned:
    """A sub-jaxpr's key, interned: equal keys are one object, hashed once."""

    __slots__ = ("key", "_hash", "closes")

    def __init__(self, key: tuple, closes: bool = False) -> None:
        self.key = key
        self._hash = hash(key)
        self.closes = closes  #: it, or a sub-jaxpr in it, closes over arrays (:class:`ConstValues`)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return self is other or (isinstance(other, _Interned) and self._hash == other._hash and self.key == other.key)


#: sub-jaxpr key -> its interned object (bounded: a dropped one is only a slower comparison).
_INTERNED: dict[tuple, _Interned] = {}


def _exact(x: Any) -> Any:
    """A number as a key by its bits: ``-0.0`` is not ``0.0`` (``arctan2`` tells them apart) and a NaN equals
    itself (``==`` never matches one, so every step keyed by one would compile anew)."""
    if isinstance(x, float):  # JAX's typed literals (TypedFloat) and NumPy's float64 too
        return ("float", type(x).__name__, float.hex(x))
    if isinstance(x, complex):
        return ("complex", type(x).__name__, x.real.hex(), x.imag.hex())
    return x


def _literal_key(lit: Any) -> tuple:
    val = lit.val
    if hasattr(val, "shape"):  # a 0-d array: its item and dtype
        val = (_exact(val.item()), str(val.dtype)) if getattr(val, "size", 2) == 1 else ("array", repr(val))
    return ("lit", _aval_key(lit.aval), _exact(val))


def param_key(value: Any) -> Any:
    """A hashable key of one equation param (jaxprs by structure)."""
    return _param_key(value)


def _param_key(value: Any) -> Any:
    if isinstance(value, (C.ClosedJaxpr, C.Jaxpr)):
        return ("jaxpr", _sub_key(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *(_param_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", *((k, _param_key(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # by its fields: the jaxprs in them by
        # structure (a Pallas kernel's grid mapping holds its index maps, traced anew at every call)
        return ("dataclass", type(value), *((f.name, _param_key(getattr(value, f.name, None)))
                                            for f in dataclasses.fields(value)))
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__qualname__, repr(value))
    return _exact(value)


def _sub_key(jaxpr: Any) -> _Interned:
    with _SUB_LOCK:
        hit = _SUB_KEYS.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            _SUB_KEYS.move_to_end(id(jaxpr))
            return hit[1]
    before = _READS.count
    full = (_const_values(C.consts_of(jaxpr)), jaxpr_key(C.jaxpr_of(jaxpr)))
    if _READS.count != before:  # a rule's key in it reads values (rules_keyed): keyed anew at each recording
        return _Interned(full)
    with _SUB_LOCK:
        key = _INTERNED.get(full)
        if key is None:
            if len(_INTERNED) >= 4 * _SUB_MAX:
                _INTERNED.clear()
            key = _INTERNED[full] = _Interned(full, bool(full[0]) or closes_over(tuple(e[3] for e in full[1][1])))
        _SUB_KEYS[id(jaxpr)] = (jaxpr, key)
        while len(_SUB_KEYS) > _SUB_MAX:
            _SUB_KEYS.popitem(last=False)
    return key


class ConstValues(tuple):
    """The arrays a sub-jaxpr closes over (JAX's consts), by aval and value, in its key: an executable
    compiled with them holds their values. The recording makes a ``jit`` region's its inputs instead
    (:mod:`.primitives`); these are the rest (a ``jit`` inside a ``cond``), a new value a new structure."""


def _const_values(consts: list) -> ConstValues:
    out = []
    for c in consts:
        try:
            value = C.ById(c) if isinstance(c, C.Tracer) else np.asarray(c)
        except Exception:  # noqa: BLE001 - no value to read (a deleted array): the object itself
            value = C.ById(c)
        out.append((_aval_key(C.shaped_abstractify(c)),
                    value if type(value) is C.ById else (value.dtype.str, value.shape, value.tobytes())))
    return ConstValues(out)


def closes_over(key: Any) -> bool:
    """Whether a params key holds a sub-jaxpr closing over arrays (:class:`ConstValues`: a replay guard's concern)."""
    t = type(key)
    if t is _Interned:
        return key.closes
    if t is tuple:
        for k in key:
            if closes_over(k):
                return True
    return False


def consts_differ(a: Any, b: Any) -> bool:
    """Whether two params keys differ in the :class:`ConstValues` of a sub-jaxpr (for a recompile's reason)."""
    a, b = (a.key if isinstance(a, _Interned) else a), (b.key if isinstance(b, _Interned) else b)
    if type(a) is ConstValues and type(b) is ConstValues:
        return a != b
    return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
            and any(consts_differ(x, y) for x, y in zip(a, b) if x != y))


class _ReadCount(threading.local):
    count = 0  #: custom rules keyed in sub-jaxprs in this thread (:func:`rules_keyed`)


_READS = _ReadCount()


def rules_keyed() -> int:
    """How many custom rules in sub-jaxprs this thread has keyed: a key made while it grew holds values that may
    change in place (a rule's closure, defaults, globals, bound object), so it is made anew at each recording."""
    return _READS.count


def _eqn_params_key(eqn: Any) -> tuple:
    """An equation's params by value; a custom rule's (new wrappers each time its body is traced) by the rules'
    functions, static arguments and what they read besides their arguments (a global a schedule changes), as the
    recording keys a rule called outside any sub-jaxpr."""
    if C.is_callback_primitive(eqn.primitive):  # JAX wraps the user's callback anew at every trace (a hook's)
        return tuple((k, _callback_key(p) if callable(p) else _param_key(p)) for k, p in sorted(eqn.params.items()))
    rules = C.custom_rule_wrappers(eqn)
    if not rules:  # none, or not found: every param as it is (a rule by identity: at worst a compile per call)
        return tuple((k, _param_key(p)) for k, p in sorted(eqn.params.items()))
    kept = tuple((k, _param_key(p)) for k, p in sorted(eqn.params.items()) if not C.is_rule_param(p))
    _READS.count += 1  # its key reads values that may change in place (rules_keyed): never cached by identity
    return (*kept, ("rules", tuple(rule_identity(C.rule_key(w)) for w in rules)))


def _callback_key(fn: Any, depth: int = 0) -> Any:
    """A host callback as a key: a library's wrappers (JAX's, new at every trace) by their code and what they hold,
    the user's callable itself (the executable calls the one it was compiled with: another object compiles anew)."""
    if isinstance(fn, functools.partial):
        return ("partial", _callback_key(fn.func, depth), _param_key(fn.args), _param_key(fn.keywords))
    if depth < 3 and isinstance(fn, types.FunctionType) and is_library(fn.__module__):
        return ("library callback", fn.__code__, tuple(_callback_key(v, depth + 1) for v in closure_values(fn)))
    return _param_key(fn)


def rule_identity(key: Any) -> tuple:
    """A rule's key (``C.rule_key``) as a step's structure holds it: its function by code, defaults and closure
    (:func:`~jaxaot._src.python_reads.function_key`: a rule defined in the forward is a new function at every
    call, the same rule), and what the function reads besides its arguments (``rule_reads``: a global a
    schedule changes, a bound object's attributes), which a new value of compiles anew, as eager JAX reads it."""
    fn = key[0] if type(key) is tuple and key else None
    return ((function_key(fn), *_by_code(key[1:])) if fn is not None else key), rule_reads(fn)


def _by_code(part: Any) -> Any:
    """The functions among a rule's transformations' static arguments by their code (jax 0.11 hands its
    ``bwd`` flattening the custom_vjp's own function, a new one where the rule is defined in the forward)."""
    if type(part) is tuple:
        return tuple(_by_code(p) for p in part)
    return function_key(part) if isinstance(part, types.FunctionType) else part


def jaxpr_key(jaxpr: Any) -> tuple:
    """``(inputs, eqns, outputs)`` of an open jaxpr, vars numbered in order of definition."""
    ids: dict[Any, int] = {}
    inputs = []
    for v in (*jaxpr.constvars, *jaxpr.invars):
        ids[v] = len(ids)
        inputs.append(_aval_key(v.aval))

    def ref(v: Any) -> Any:
        return _literal_key(v) if C.is_literal(v) else ids[v]

    eqns = []
    for eqn in jaxpr.eqns:
        ins = tuple(ref(v) for v in eqn.invars)
        outs = []
        for v in eqn.outvars:
            if not C.is_drop_var(v):
                ids[v] = len(ids)
            outs.append(_aval_key(v.aval))
        params = _eqn_params_key(eqn) if eqn.params else ()
        eqns.append((str(eqn.primitive), ins, tuple(outs), params))
    return (tuple(inputs), tuple(eqns), tuple(ref(v) for v in jaxpr.outvars))


class Node:
    """One point of a recording, in the trie of every recording seen: ``children`` by the next event.

    ``plan`` holds what a node learns once and reuses (a compiled program that
    computes a value Python looks at there); ``ahead`` the plans whose inputs are all
    known from this node on (a recording starts them here, before Python looks);
    ``info`` where in the user's code the operation (or the look at a value) that
    leads to it was recorded first (a traceback is not taken again on every step); ``structure`` the
    :class:`Structure` of a recording that ends there; ``calls`` the array operators replayed from
    their templates there, by call, with what each appended (:mod:`.ops`).
    """

    __slots__ = ("children", "plan", "ahead", "info", "structure", "calls")

    def __init__(self) -> None:
        self.children: dict = {}
        self.plan: Any = None
        self.ahead: tuple = ()
        self.info: Any = None
        self.structure: Structure | None = None
        self.calls: dict | None = None

    def step(self, edge: Any) -> "Node":
        """The node after ``edge`` (a hashable event), created on first use."""
        child = self.children.get(edge)
        if child is None:
            _COUNT[0] += 1
            child = self.children.setdefault(edge, Node())
        return child


#: The most trie nodes kept, over all tries; past it every trie restarts (recordings then build their
#: keys again, once).
MAX_NODES = 200_000
_COUNT = [0]
_GENERATION = [0]


class Trie:
    """One trie's root (a compiled function's, or the process-wide one), restarted with all the others
    when the nodes of all of them pass :data:`MAX_NODES`."""

    __slots__ = ("node", "generation")

    def __init__(self) -> None:
        self.node, self.generation = Node(), _GENERATION[0]

    def root(self) -> Node:
        """Where a recording starts."""
        if _COUNT[0] > MAX_NODES:
            _COUNT[0] = 0
            _GENERATION[0] += 1
        if self.generation != _GENERATION[0]:
            self.node, self.generation = Node(), _GENERATION[0]
        return self.node


_PROCESS = Trie()
#: full key -> Structure, so a key built again after the trie restarted maps to the same structure.
_STRUCTURES: dict[tuple, Structure] = {}


#: JAX configurations seen (:func:`jaxaot._src.compat.trace_context`), each a small number for keys.
_CONFIGS: dict[Any, int] = {}


def config_number(ctx: Any) -> int:
    """A small number standing for JAX's configuration ``ctx`` (``trace_context()``) in keys. What lowering reads
    (``jax_threefry_partitionable``, matmul precision) is in every compiled program's key, as in ``jit``'s."""
    n = _CONFIGS.get(ctx)
    if n is None:
        with _SUB_LOCK:  # two new configurations at once must not share a number
            n = _CONFIGS.setdefault(ctx, len(_CONFIGS))
    return n


def root() -> Node:
    """The process-wide trie's root (recordings not made for a compiled function start there)."""
    return _PROCESS.root()


def interned(structure: Structure) -> Structure:
    """The structure with ``structure``'s key seen first (bounded: a dropped one is only re-hashed)."""
    with _SUB_LOCK:
        seen = _STRUCTURES.get(structure.key)
        if seen is not None:
            return seen
        if len(_STRUCTURES) >= 4 * _SUB_MAX:
            _STRUCTURES.clear()
        _STRUCTURES[structure.key] = structure
    return structure


def structure_of(closed: Any) -> Structure:
    """The :class:`Structure` of a closed jaxpr whose consts were hoisted to inputs."""
    return Structure(jaxpr_key(C.jaxpr_of(closed)), closed)
