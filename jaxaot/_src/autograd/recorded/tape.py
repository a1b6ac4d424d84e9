"""One step's forward, written down as it runs: the tape a compiled step replays.

Under :class:`~jaxaot._src.compat.recording.RecordingTrace`, each operation reaches
a :class:`Tape` instead of being dispatched. Lazily (the default) values are
computed only when Python asks for one (:mod:`.force`); eagerly, each operation
runs as it is recorded, so JAX specialises on values as it does eagerly. Array
operators replay ``jax.numpy``'s recording (:mod:`.ops`); custom rules are staged
as one equation; host callbacks run at once. Each event steps down the structure
trie, and :func:`replay` re-applies the operations in any trace.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded import force as F
from jaxaot._src.autograd.recorded import ops as O
from jaxaot._src.autograd.recorded.primitives import op as _op
from jaxaot._src.autograd.recorded.structure import (Structure, aval_key, config_number, handed_to_jax, interned,
                                                       literal_value_key, owner, param_key, root, rule_identity)
from jaxaot._src.autograd.recorded.call import place_of

_Tracer = C.RecordingTracer


class Look(NamedTuple):
    """A value Python looked at while the forward was recorded (``if loss > 0``, ``int(n)``)."""

    after: int         #: how many operations were recorded before it
    source_info: Any   #: where (JAX's source info; ``C.recorded_source`` writes it as ``file:line (function)``)
    value: Any         #: the value, when it is a scalar (else None)
    vid: int = -1      #: its value number
    how: str = "value"  #: what Python made of it: ``bool``, ``int``, ``float``, ``complex`` or the whole ``value``
    plan: Any = None   #: the :class:`~.force.Plan` that computed it (None: it was an input or known already)


class Eqn(NamedTuple):
    """One recorded operation (``staged``: ``params`` are an equation's, from ``C.stage_call``)."""

    prim: Any
    params: dict
    ins: tuple
    outs: tuple
    staged: bool
    source_info: Any


#: primitive -> whether it is a host callback (the check reads its name)
_CALLBACK: dict[Any, bool] = {}


def _staged_params_key(params: dict, rules: dict) -> tuple:
    """A staged equation's params without its rule thunks (new per call), plus the rules' identities and what the
    user's rules read besides their arguments (a global a schedule changes): the step traces them when it compiles,
    as ``jit`` does, and eager JAX runs them at every call, so a new value compiles anew."""
    kept = tuple((k, param_key(v)) for k, v in params.items() if not C.is_rule_param(v))
    return kept + tuple(sorted((name, *rule_identity(key)) for name, key in rules.items()))


#: aval -> its key (avals are interned by JAX, so this is an identity lookup)
_AKEYS: dict[Any, tuple] = {}


def akey(aval: Any) -> tuple:
    """:func:`~.structure.aval_key`, memoized."""
    key = _AKEYS.get(aval)
    if key is None:
        if len(_AKEYS) >= 4096:
            _AKEYS.clear()
        key = _AKEYS[aval] = aval_key(aval)
    return key


class Tape:
    """The recorder behind a :class:`~jaxaot._src.compat.recording.RecordingTrace` (one per step).

    Attributes:
      eager: run each operation as it is recorded (else only on demand).
      guarded: keep what replaying the recording needs (:mod:`.replay`): JAX is shown no argument's
        value, so that nothing recorded depends on one.
      values, avals: per value number, its concrete value (None while unknown) and its aval.
      ops: the recorded operations, in order: ``(op, input numbers, output numbers, source info)``, ``op``
        an :class:`~.ops.Op` (:attr:`eqns` has them as :class:`Eqn` objects).
      inputs: ``(value number, kind, aval key[, a literal's value, an arg's place])``; ``kind`` diff, arg or lit.
      args: the runtime values of the ``arg`` inputs, in order; ``arg_objects`` the objects the forward
        used (a NumPy array before its copy to the device); ``constants`` the value numbers of those it
        reached other than as an argument handed over as a recorded value (closures, globals, a jit's consts).
      looks: per value Python looked at (``bool``, ``int``, ``float``, printing), a :class:`Look`: where, after
        how many operations, and the value Python read when a scalar. Not part of the structure;
        recompile reasons use them to say which Python branch went the other way.
      reads: value numbers whose value JAX itself read (``to_concrete_value``) and got (:meth:`visible`).
      callbacks: host callbacks run while recording.
      node: where the recording is in the structure trie (``trie``: its root, one per function; or the process's).
      ahead: the step started ahead (:class:`~.ahead.Started`), giving the looks it returns, or None.
      placement: where the call's committed arrays live (:func:`~.call.placement`), part of every key.
    """

    def __init__(self, eager: bool = False, guarded: bool = False, trie: Any = None, ahead: Any = None,
                 placement: tuple = ()) -> None:
        self.eager, self.ahead, self.guarded, self.placement = eager, ahead, guarded, placement
        self.parent = C.current_trace()
        self.trace = C.RecordingTrace(self)
        self.values, self.avals = [], []
        self.shown: list[bool] = []  #: per value number, whether :meth:`known` shows it
        self.ops, self.inputs = [], []  # (op, ins, outs, source info); (value number, kind, key)
        self.args, self.arg_objects = [], []
        self.kinds: dict[int, str] = {}
        self.constants, self.held = [], []  #: held: owners of one-element NumPy arrays used (:func:`~.structure.owner`)
        self._by_id: dict[int, tuple] = {}  #: id -> (value number, what a NumPy array held when copied, or None)
        self._by_literal: dict[tuple, int] = {}
        self.looks: list[Look] = []
        self.reads: set[int] = set()
        self.read_count = 0  #: values shown to JAX (an operation that was shown one is not templated)
        self.callbacks = 0
        self.log: list | None = None  #: events, while :mod:`.ops` watches an operation
        self.context: Any = C.trace_context()  #: JAX's configuration, as last seen, and its number (:mod:`.ops`)
        self.context_id: int | None = config_number(self.context)
        self.config = self.context_id  #: the call's configuration, which lowering reads: part of every key
        self.node = (root() if trie is None else trie).step(("config", self.config))
        if placement:  # another device's recordings: a trie, programs and executables of their own
            self.node = self.node.step(("placement", placement))
        self._eqns: list[Eqn] = []
        self.known_at: dict[int, tuple] = {}  #: value number -> (order, trie node) where it became known
        self.started: dict = {}  #: plans started ahead (:func:`.force.start_ahead`), by plan

    # -- what the tape holds, in the forms keys and programs need
    @property
    def eqns(self) -> list[Eqn]:
        """The recorded operations as :class:`Eqn` objects (made on demand)."""
        eqns = self._eqns
        eqns.extend(Eqn(op.prim, op.params, ins, outs, op.staged, info) for op, ins, outs, info in self.ops[len(eqns):])
        return eqns

    @property
    def akeys(self) -> list[tuple]:
        """Per value number, its aval key."""
        return [akey(a) for a in self.avals]

    def eqn_key(self, i: int) -> tuple:
        """Operation ``i``'s part of the structure key: primitive, inputs, output avals, params."""
        op, ins, outs, _ = self.ops[i]
        return (op.prim, ins, tuple([akey(self.avals[v]) for v in outs]), op.pkey)

    # -- values
    def tracer(self, vid: int) -> Any:
        return _Tracer(self.trace, self.avals[vid], vid)

    def _input(self, kind: str, aval: Any, value: Any, detail: tuple | None = None) -> int:
        vid = len(self.avals)
        self.avals.append(aval)
        self.values.append(value)
        self.shown.append(kind == "lit" or (kind == "arg" and not self.guarded))
        self.kinds[vid] = kind
        self.inputs.append((vid, kind, akey(aval)) if detail is None else (vid, kind, akey(aval), detail))
        self.node = node = self.node.step((kind, aval, detail))
        F.known(self, vid, node)
        return vid

    def diff_input(self, value: Any, aval: Any = None) -> Any:
        """A tracer for a differentiated leaf (call these first, in order); ``aval``: its aval, if known."""
        return self.diff_inputs([value], [C.typeof(value) if aval is None else aval])[0]

    def diff_inputs(self, values: Sequence[Any], avals: Sequence[Any]) -> list:
        """Tracers for the differentiated leaves ``values`` of avals ``avals`` (the first inputs)."""
        return [_Tracer(self.trace, aval, vid) for vid, aval in zip(_diff_inputs(self, values, avals), avals)]

    def arg_input(self, value: Any) -> Any:
        """A tracer for an array argument handed to the forward as a recorded value (guarded recordings)."""
        vid = self._input("arg", C.typeof(value), value)
        self.args.append(value)
        self.arg_objects.append(value)
        return self.tracer(vid)

    def ref(self, x: Any) -> int:
        """The value number of ``x``: a tracer of this tape, or a constant made an input on first use."""
        if type(x) is _Tracer and x._trace is self.trace:
            return x.vid
        vid = _constant(self, x)
        if self.log is not None:
            self.log.append(("r", x, vid))
        return vid

    def ref_literal(self, key: tuple, x: Any) -> int:
        """:meth:`ref` of a scalar literal whose ``(value key, aval)`` is ``key`` (known to the caller)."""
        vid = self._by_literal.get(key)
        if vid is None:  # first use on this tape (what _constant does for a literal, its key known)
            vid = self._by_literal[key] = self._input("lit", key[1], x, key[0])
        if self.log is not None:
            self.log.append(("r", x, vid))
        return vid

    def known(self, vid: int) -> Any:
        """The value if already known and shown to JAX, else None (JAX asks this opportunistically).

        JAX is shown a value computed for Python, a literal, an array the forward closes over; never a
        differentiated input (``jax.grad`` shows none either), and no argument of a guarded tape (as
        ``jit`` shows none): :attr:`shown`."""
        if not self.shown[vid]:
            return None
        self.reads.add(vid)
        self.read_count += 1
        return self.values[vid]

    def force(self, vid: int, how: str = "value", look: bool = True) -> Any:
        """The concrete value of ``vid``, computing what it depends on that has not run yet.

        ``how``: what Python makes of it (``bool``, ``int``, ``float``, ``complex``, the whole ``value``).
        ``look``: Python itself asked (a :class:`Look` is kept), not a host callback's argument.
        """
        value, plan = self.values[vid], None
        read = value
        if value is None:
            plan = self._plan(vid)
            value, read = _computed(self, plan)
            self.values[vid] = value
            self.shown[vid] = True
            F.known(self, vid, self.node)
        if look:  # Python reads the whole value from the device's memory: it may go on into JAX
            read = value if how == "value" else read
            self.looks.append(Look(len(self.ops), F.look_source(self.node, plan),
                                   read if getattr(read, "size", 2) == 1 else None, vid, how, plan))
        return read if look else value

    def _plan(self, vid: int) -> F.Plan:
        """The compiled program computing ``vid`` from the known values, once per point of the trie."""
        self.node = node = self.node.step(("force", vid))
        plan = node.plan
        if plan is None:
            plan = node.plan = F.plan(self, vid)
            F.place_ahead(plan, self.known_at)
        return plan

    # -- recording (called by the trace)
    def record(self, op: O.Op, ins: tuple, info: Any = None) -> tuple:
        """Write one operation down; its output numbers. Its source info is the trie node's, taken (``info``,
        else the current one) the first time the recording gets there."""
        avals = self.avals
        first = len(avals)
        one = op.out_aval
        if one is not None:
            outs = (first,)
            avals.append(one)
            self.values.append(None)
            self.shown.append(False)
        else:
            n = len(op.out_avals)
            outs = tuple(range(first, first + n))
            avals.extend(op.out_avals)
            self.values.extend([None] * n)
            self.shown.extend([False] * n)
        edge = (op.edge, ins)
        node = self.node.children.get(edge) or self.node.step(edge)
        self.node = node
        where = node.info
        if where is None:  # first seen here: where in the user's code (kept for later steps)
            where = node.info = C.source_info() if info is None else info
        self.ops.append((op, ins, outs, where))
        if self.log is not None:
            self.log.append(("e", op, ins, outs))
        if self.eager:
            _run(self, len(self.ops) - 1)
        return outs

    def primitive(self, prim: Any, args: Sequence[Any], params: dict) -> list:
        callback = _CALLBACK.get(prim)
        if callback is None:
            callback = _CALLBACK[prim] = C.is_callback_primitive(prim)
        if callback:
            return _callback(self, prim, args, params)
        trace, avals, ref = self.trace, self.avals, self.ref
        ins = tuple([x.vid if type(x) is _Tracer and x._trace is trace else ref(x) for x in args])
        op = _op(prim, ins, avals, params)
        if op.special:
            ins = _special(self, op, ins)
        return [_Tracer(trace, avals[v], v) for v in self.record(op, ins)]

    def staged(self, args: Sequence[Any], stage: Any, rules: dict) -> list:
        ins = tuple(self.ref(a) for a in args)
        prim, params, consts, out_avals, effects = stage([self.avals[v] for v in ins])
        if effects:
            raise C.Unrecordable(f"{prim} has side effects ({', '.join(map(str, effects))})")
        ins = (*(self.ref(c) for c in consts), *ins)
        op = O.Op(prim, params, tuple(out_avals), _staged_params_key(params, rules), True, (), by_content=True)
        return [self.tracer(v) for v in self.record(op, ins)]

    #: An array operator, method or property of a recorded value (``x * 2``, ``x.mean()``): :func:`.ops.call`.
    call = O.call

    def stage_value(self, val: Any) -> Any:
        return self.tracer(self.ref(val))

    #: The value number of a forward output (a tracer, or a constant made an input).
    output = ref


def _diff_inputs(tape: Tape, values: Sequence[Any], avals: Sequence[Any]) -> range:
    """The value numbers of differentiated leaves made inputs of ``tape`` together, in one step of the trie
    (the inputs :meth:`Tape._input` would make one by one)."""
    first, n = len(tape.avals), len(values)
    vids = range(first, first + n)
    tape.avals.extend(avals)
    tape.values.extend(values)
    tape.shown.extend([False] * n)
    for vid, aval in zip(vids, avals):
        tape.kinds[vid] = "diff"
        tape.inputs.append((vid, "diff", akey(aval)))
    tape.node = node = tape.node.step(("diff", tuple(avals)))
    F.known_all(tape, vids, node)
    return vids


def _special(tape: Tape, op: O.Op, ins: tuple) -> tuple:
    """The inputs of an operation with effects (refused) or arrays its ``jit`` region closes over (made inputs,
    as every array the forward closes over is: :mod:`.primitives`), those first."""
    if op.effects:
        raise C.Unrecordable(f"{op.prim} has side effects ({', '.join(map(str, op.effects))})")
    return (*map(tape.ref, op.consts), *ins)


def _callback(tape: Tape, prim: Any, args: Sequence[Any], params: dict) -> list:
    """Run a host callback now, on concrete arguments; its outputs become inputs of the step."""
    tape.callbacks += 1
    vals = [tape.force(a.vid, look=False) if type(a) is C.RecordingTracer and a._trace is tape.trace else a
            for a in args]
    return [tape.tracer(tape.ref(o)) for o in C.bind_on(tape.parent, prim, vals, params)]


def _run(tape: Tape, index: int) -> None:
    """Run operation ``index`` now (eager recording): its outputs become known and shown."""
    op, ins, outs, _ = tape.ops[index]
    values = tape.values
    results = C.bind_on(tape.parent, op.prim, [values[v] for v in ins], op.params, op.staged)
    for v, o in zip(outs, results):
        values[v] = o
        tape.shown[v] = True


def _computed(tape: Tape, plan: F.Plan) -> tuple[Any, Any]:
    """``(value, what Python reads)`` of ``plan``: its run started ahead, else the step started ahead's output
    (read from its copy in host memory where the step returns one: :meth:`~.ahead.Started.look`), else run now."""
    started = tape.started.pop(plan, None) if tape.started else None
    if started is not None:
        return started[0], started[0]
    found = tape.ahead.look(plan, tape.args) if tape.ahead is not None else None
    if found is None:
        value = plan.run(tape.values, tape.parent)
        return value, value
    return found


def _constant(tape: Tape, x: Any) -> int:
    """A value the forward used that is no recorded value: a literal, or an array it closes over."""
    if isinstance(x, C.Tracer):
        raise C.Unrecordable(f"a {type(x).__name__} from another transformation reached the forward")
    found = tape._by_id.get(id(x))  # arg_objects keeps x alive, so its id is not reused
    if found is not None and (found[1] is None or _unchanged(found[1], x)):
        return found[0]
    lit = literal_value_key(x)
    if lit is not None:
        aval = C.typeof(x)
        if isinstance(x, np.ndarray):  # keyed by its value; a copy kept, so that only its owners keep it alive
            tape.held.append(owner(x))
            if tape.guarded:
                tape.held.extend(handed_to_jax())
            x = x.copy()
        key = (lit, aval)
        vid = tape._by_literal.get(key)
        if vid is None:
            vid = tape._by_literal[key] = tape._input("lit", aval, x, lit)
        return vid
    # NumPy is mutable: copy it now (on a CPU ``device_put`` may alias the buffer it is given, or read it later).
    value = jax.device_put(np.array(x, copy=True)) if isinstance(x, np.ndarray) else x
    # Where it lives keys the step, as the call's own arrays' placement does: an executable runs where it was compiled.
    where = place_of(value)
    vid = tape._input("arg", C.typeof(value), value, None if where is None else ("on", where))
    # A NumPy array written in place later in the forward is another constant from then on.
    tape._by_id[id(x)] = (vid, (x.dtype, x.shape, x.tobytes()) if isinstance(x, np.ndarray) else None)
    tape.constants.append(vid)
    tape.args.append(value)
    tape.arg_objects.append(x)
    return vid


def _unchanged(copied: tuple, x: np.ndarray) -> bool:
    """Whether the NumPy array ``x`` still holds what was copied of it (dtype, shape, bytes)."""
    dtype, shape, data = copied
    return x.dtype == dtype and x.shape == shape and x.tobytes() == data


class Program(NamedTuple):
    """What a compiled step needs of a tape: its operations and inputs, none of one step's arrays."""

    eqns: list
    inputs: list
    literals: dict
    num_values: int


def freeze(tape: Tape) -> Program:
    """The :class:`Program` of a finished tape (literal values kept: they are part of its key)."""
    literals = {e[0]: tape.values[e[0]] for e in tape.inputs if e[1] == "lit"}
    return Program(list(tape.eqns), list(tape.inputs), literals, len(tape.avals))


def structure(tape: Tape, outputs: Sequence[int]) -> Structure:
    """The :class:`Structure` of a finished tape whose step returns the values ``outputs``: the trie node's,
    or built (and interned) when the recording ends where none ended before."""
    leaf = tape.node.step(("out", tuple(outputs)))
    found = leaf.structure
    if found is None:
        key = (tuple(tape.inputs), tuple(tape.eqn_key(i) for i in range(len(tape.ops))), tuple(outputs),
               tape.placement, tape.config)
        found = leaf.structure = interned(Structure(key, freeze(tape), vid_avals=tuple(tape.akeys),
                                                    kind="forward"))
    return found.with_looks(tuple(tape.looks)) if tape.looks else found


def replay(program: Program, diff: Sequence[Any], args: Sequence[Any]) -> list:
    """Every value of ``program``, recomputed from new differentiated leaves and arguments in the current trace.

    Literals keep the recorded values (they are part of the structure).
    """
    env: list = [None] * program.num_values
    diff_it, arg_it = iter(diff), iter(args)
    for entry in program.inputs:
        vid, kind = entry[0], entry[1]
        env[vid] = next(diff_it) if kind == "diff" else next(arg_it) if kind == "arg" else program.literals[vid]
    for e in program.eqns:
        outs = C.bind_on(None, e.prim, [env[v] for v in e.ins], e.params, e.staged, e.source_info)
        for v, o in zip(e.outs, outs):
            env[v] = o
    return env
