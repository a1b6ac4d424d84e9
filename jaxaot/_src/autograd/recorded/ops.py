"""Array operators on recorded values, replayed from what ``jax.numpy`` recorded for the same operand types.

Running ``jax.numpy``'s Python for every ``x * 0.5`` on a recorded value costs
far more than writing the operation down. What it records depends only on what
it is given, so the first call with a given :func:`signature` keeps its recording
as a :class:`Template` that later calls replay onto the tape, exactly as running
``jax.numpy`` would; a call a recording made at the same point of the structure trie
before appends what it appended there. Operations that depended on values (or ran
callbacks, or made constants) are never templated. Templates are process-wide and bounded.
"""

from __future__ import annotations

import operator
import types
from typing import Any

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded.structure import aval_key, config_number, literal_value_key, owner

#: signature -> :class:`Template` (cleared when it reaches :data:`MAX_TEMPLATES`).
TEMPLATES: dict[tuple, "Template"] = {}
MAX_TEMPLATES = 4096

_Tracer = C.RecordingTracer
_SCALARS = frozenset({int, float, bool, complex, str, type(None), types.EllipsisType})
#: NumPy's scalar types (each has one dtype: the type and the bytes are the value).
_NUMPY_SCALARS = frozenset(np.dtype(c).type for c in "?bhilqBHILQefdgFDG")


class Op:
    """One kind of recorded operation: primitive, params, output avals, params key.

    ``edge`` is what the structure trie steps by (with the input numbers): the object itself, when it is
    interned (the same primitive on the same avals and params gets the same ``Op``), else a content key.
    """

    __slots__ = ("prim", "params", "out_avals", "out_aval", "pkey", "staged", "effects", "edge", "consts", "closes",
                 "special")

    def __init__(self, prim: Any, params: dict, out_avals: tuple, pkey: tuple, staged: bool, effects: Any,
                 by_content: bool = False) -> None:
        self.prim, self.params, self.out_avals, self.pkey = prim, params, out_avals, pkey
        self.out_aval = out_avals[0] if len(out_avals) == 1 else None  #: the one output's aval (None: not one)
        self.staged, self.effects = staged, effects
        self.consts: tuple = ()  #: arrays a jit region closes over, taken before its inputs (:mod:`.primitives`)
        self.special = bool(effects)  #: it has effects or ``consts``: what recording it checks first
        self.closes = False  #: (a primitive's) a sub-jaxpr in its params closes over arrays, in its key by value
        self.edge = (prim, pkey, tuple(map(aval_key, out_avals))) if by_content else self


class Unsupported(Exception):
    """An argument no signature can describe (the operation runs as written)."""


class Template:
    """What one operation recorded: ``events`` and which value it returned.

    An event is ``("r", i)`` (operand ``i``, an array, made an input), ``("l", key, value)`` (a literal
    made an input) or ``(op, specs)`` (an operation on the values ``specs`` name). A spec is an int: a
    non-negative one is operand ``i``; ``-1 - j`` the ``j``-th value the template made (constants
    and operation outputs, in order).
    """

    __slots__ = ("events", "result", "steps", "at")

    def __init__(self, events: tuple, result: int, operands: int) -> None:
        self.events, self.result = events, result
        self.steps = tuple(_step(ev, operands) for ev in events)
        self.at = result if result >= 0 else operands - 1 - result  #: the result's place among the values

    def apply(self, tape: Any, vids: tuple, ops: list | None) -> Any:
        """Replay onto ``tape``; ``vids``: the operands' value numbers (-1: not a recorded value), ``ops``
        the operands themselves (read only by ``("r", i)`` events)."""
        values = list(vids)  # the operands' value numbers, then each value the template makes
        record = tape.record
        for kind, a, b in self.steps:
            if kind is _OP1:
                values += record(a, (values[b],))
            elif kind is _OPN:
                values += record(a, b(values))
            elif kind is _OPV:
                values += record(a, vids)
            elif kind is _LIT:
                values.append(tape.ref_literal(a, b))
            else:
                values.append(tape.ref(ops[a]))
        vid = values[self.at]
        return _Tracer(tape.trace, tape.avals[vid], vid)


#: What a template's step does (:func:`_step`).
_OP1, _OPN, _OPV, _LIT, _REF = "op1", "opn", "opv", "lit", "ref"


def _step(ev: tuple, operands: int) -> tuple:
    """One event as ``(kind, a, b)``: an operation ``a`` on one value (``b``: its place among the operands
    and the values made), on several (``b`` takes them from that list), on the operands in order, a literal
    (``a`` its key, ``b`` its value) or an operand made an input (``a``: which)."""
    first = ev[0]
    if first == "l":
        return (_LIT, ev[1], ev[2])
    if first == "r":
        return (_REF, ev[1], None)
    at = tuple(s if s >= 0 else operands - 1 - s for s in ev[1])
    if len(at) == 1:
        return (_OP1, first, at[0])
    if at == tuple(range(operands)):
        return (_OPV, first, None)
    return (_OPN, first, operator.itemgetter(*at))


def _scalar(t: type, a: Any) -> tuple:
    """A Python scalar's part of a signature: its type and exact value (``-0.0`` is not ``0.0``)."""
    if t is float:
        return (t, a.hex())
    if t is complex:
        return (t, a.real.hex(), a.imag.hex())
    return (t, a)


def _sig(a: Any, ops: list, trace: Any) -> Any:
    t = type(a)
    if t is _Tracer:
        if a._trace is not trace:
            raise Unsupported
        ops.append(a)
        return a.aval
    if t in _SCALARS:
        return _scalar(t, a)
    if t is tuple or t is list:
        return (t, *(_sig(x, ops, trace) for x in a))
    if t is slice:
        return (slice, _sig(a.start, ops, trace), _sig(a.stop, ops, trace), _sig(a.step, ops, trace))
    if isinstance(a, np.generic):
        return (t, a.dtype, a.tobytes())
    if isinstance(a, (np.dtype, type)):
        return ("dtype", a)
    if isinstance(a, jax.Array) and not isinstance(a, C.Tracer):
        ops.append(a)
        return ("array", C.typeof(a))
    raise Unsupported


_trace_context = C.trace_context


def _context(tape: Any) -> int:
    """A small number for JAX's configuration now (it may change inside the forward, under a ``with``), kept on
    the tape with the configuration it was last read for."""
    ctx = _trace_context()
    if ctx == tape.context and tape.context_id is not None:
        return tape.context_id
    tape.context = ctx
    tape.context_id = config_number(ctx)
    return tape.context_id


def _common(fn: Any, x: Any, args: tuple, tape: Any) -> tuple | None:
    """``(key, numbers)`` of :func:`signature` for the calls most operators make (no keywords; no argument,
    or one that is a recorded value of this tape or a scalar), built without lists; None for other calls."""
    context = _context(tape)
    shown, xv = tape.shown, x.vid
    if not args:  # a method of no arguments (x.sum(), x.T)
        return (fn, x.aval, shown[xv], context), (xv,)
    if len(args) != 1:
        return None
    a = args[0]
    t = type(a)
    if t is _Tracer and a._trace is tape.trace:
        av = a.vid
        return (fn, x.aval, a.aval, a is x or av == xv, shown[xv], shown[av], context), (xv, av)
    if t is float:
        return (fn, x.aval, (float, a.hex()), shown[xv], context), (xv,)
    if t in _SCALARS:
        return (fn, x.aval, _scalar(t, a), shown[xv], context), (xv,)
    if t in _NUMPY_SCALARS:  # np.float32(0.5) * x, as jax.nn's functions write their constants
        return (fn, x.aval, (t, a.tobytes()), shown[xv], context), (xv,)
    return None


def _at(fn: Any, x: Any, args: tuple, tape: Any) -> tuple | None:
    """The key of a call most operators make (no keywords; no argument, or one that is a recorded value of this
    tape or a hashable scalar) at the tape's trie node, flat; None for other calls. The node fixes every value
    number's aval, so a value's number stands for it; a scalar is there by type and value (``-0.0`` is not ``0.0``;
    a NaN, equal to nothing, takes the general path)."""
    context = _context(tape)
    shown, xv = tape.shown, x.vid
    if not args:  # a method of no arguments (x.sum(), x.T)
        return (fn, xv, shown[xv], context)
    if len(args) != 1:
        return None
    a = args[0]
    t = type(a)
    if t is _Tracer:
        if a._trace is not tape.trace:
            return None
        av = a.vid
        return (fn, xv, av, shown[xv], shown[av], context)
    if t is float:
        if a != a:
            return None
        return (fn, xv, shown[xv], t, a if a else a.hex(), context)
    if t in _NUMPY_SCALARS:  # np.float32(0.5) * x, as jax.nn's functions write their constants
        return (fn, xv, shown[xv], t, a.tobytes(), context)
    if t in _SCALARS:
        return (fn, xv, shown[xv], *_scalar(t, a), context) if t is complex else (fn, xv, shown[xv], t, a, context)
    return None


def signature(fn: Any, x: Any, args: tuple, kwargs: dict | None, tape: Any) -> tuple[tuple, Any, tuple]:
    """``(key, operands, numbers)`` of one call: what ``jax.numpy``'s behaviour depends on, the recorded
    values and arrays it takes (``x`` first) and their value numbers (-1 for an array). Raises
    :class:`Unsupported` for arguments it cannot describe.

    Besides types and static values, JAX may ask whether a recorded value is known (it skips a
    conversion for unknown ones): which operands the tape shows (``tape.visible``) is part of the key,
    as is which operands are the same value."""
    if not kwargs:
        common = _common(fn, x, args, tape)
        if common is not None:
            key, vids = common
            return key, ((x, args[0]) if len(vids) == 2 else (x,)), vids
    trace, shown = tape.trace, tape.shown
    context = _context(tape) if kwargs else tape.context_id  # set by _common, which every call without keywords reached
    ops = [x]
    sig = tuple([_sig(a, ops, trace) for a in args])
    kw = tuple(sorted((k, _sig(v, ops, trace)) for k, v in kwargs.items())) if kwargs else ()
    same = tuple([next(j for j, y in enumerate(ops) if y is o or (type(o) is _Tracer and type(y) is _Tracer
                                                                  and y.vid == o.vid)) for o in ops])
    visible = tuple([type(o) is _Tracer and shown[o.vid] for o in ops])
    vids = tuple([o.vid if type(o) is _Tracer else -1 for o in ops])
    return (fn, x.aval, sig, kw, same, visible, context), ops, vids


def call(tape: Any, name: str, fn: Any, x: Any, args: tuple, kwargs: dict | None) -> Any:
    """``fn(x, *args, **kwargs)`` (the operation ``name``) recorded on ``tape``: replayed from its template,
    or run and templated (in lazy recording; eager recording runs it as written)."""
    if tape.eager:
        return fn(x, *args, **kwargs) if kwargs else fn(x, *args)
    calls = tape.node.calls
    at = _at(fn, x, args, tape) if not kwargs and tape.log is None else None
    if at is not None and calls is not None:  # the common call made here before: one flat key
        made = calls.get(at)
        if made is not None:
            return _append(tape, made)
    try:
        key, ops, vids = signature(fn, x, args, kwargs, tape)
        if at is None:
            at = (key, vids)
            made = calls.get(at) if calls is not None and tape.log is None else None
            if made is not None:  # made at this point of the trie before
                return _append(tape, made)
        template = TEMPLATES.get(key)
    except (Unsupported, TypeError):  # TypeError: something unhashable in the signature
        for a in (*args, *kwargs.values()) if kwargs else args:  # JAX may copy it (a dtype of its own): seen here
            if isinstance(a, np.ndarray) and a.size == 1:
                tape.held.append(owner(a))
        return fn(x, *args, **kwargs) if kwargs else fn(x, *args)
    if template is not None:
        if tape.log is None and -1 not in vids:  # recorded values and scalars only: the trie node fixes the rest
            return _applied(tape, at, template, vids, ops)
        return template.apply(tape, vids, ops)
    outer = tape.log
    if outer is None:
        tape.log = []
    start = len(tape.log)
    before = (len(tape.looks), tape.read_count, tape.callbacks)
    try:
        out = fn(x, *args, **kwargs) if kwargs else fn(x, *args)
        events = tape.log[start:]
    finally:
        if outer is None:
            tape.log = None
    if before == (len(tape.looks), tape.read_count, tape.callbacks) and type(out) is _Tracer and out._trace is tape.trace:
        template = _template(events, ops, out.vid)
        if template is not None:
            if len(TEMPLATES) >= MAX_TEMPLATES:
                TEMPLATES.clear()
            TEMPLATES[key] = template
    return out


def _applied(tape: Any, at: tuple, template: Template, vids: tuple, ops: list) -> Any:
    """``template`` applied to ``tape``; what it appended is kept on the trie node by ``at`` (the call's key and
    operands), for :func:`_append`: the node fixes every value number, aval and literal the template reads, so
    the same call there appends the same operations (one that made a literal new to the tape, an input, is
    applied anew each time)."""
    node = tape.node
    at_ops, at_values, at_inputs = len(tape.ops), len(tape.avals), len(tape.inputs)
    out = template.apply(tape, vids, ops)
    if len(tape.inputs) == at_inputs:
        n = len(tape.avals) - at_values
        if node.calls is None:
            node.calls = {}
        node.calls[at] = (tuple(tape.ops[at_ops:]), tuple(tape.avals[at_values:]), (None,) * n, (False,) * n,
                          tape.node, out.vid)
    return out


def _append(tape: Any, made: tuple) -> Any:
    """Append what a call appended at this trie node before (:func:`_applied`); its result."""
    ops, avals, nones, falses, end, vid = made
    tape.ops.extend(ops)
    tape.avals.extend(avals)
    tape.values.extend(nones)
    tape.shown.extend(falses)
    tape.node = end
    return _Tracer(tape.trace, tape.avals[vid], vid)


def _template(events: list, ops: list, result: int) -> Template | None:
    """The :class:`Template` of one call's events, or None when something in them depended on more than
    the signature."""
    where: dict[int, int] = {}
    for i, o in enumerate(ops):
        if type(o) is _Tracer:
            where.setdefault(o.vid, i)
    out: list = []
    made = 0
    for ev in events:
        if ev[0] == "r":
            _, obj, vid = ev
            i = next((i for i, o in enumerate(ops) if o is obj), None)
            if i is not None:
                out.append(("r", i))
            else:
                lit = literal_value_key(obj)
                if lit is None:
                    return None  # an array constant of the operation's own: new each call
                out.append(("l", (lit, C.typeof(obj)), obj.copy() if isinstance(obj, np.ndarray) else obj))
            where[vid] = -1 - made
            made += 1
        else:
            _, op, ins, outs = ev
            if op.staged or op.special or op.closes:
                return None  # custom rules close over per-call state; a jit region over arrays
            specs = []
            for v in ins:
                spec = where.get(v)
                if spec is None:
                    return None  # a value the signature does not name
                specs.append(spec)
            out.append((op, tuple(specs)))
            for v in outs:
                where[v] = -1 - made
                made += 1
    spec = where.get(result)
    return None if spec is None else Template(tuple(out), spec, len(ops))
