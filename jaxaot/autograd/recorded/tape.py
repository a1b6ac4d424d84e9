"""One step's forward, written down as it runs: the tape a compiled step replays.

Under :class:`~jaxaot._compat.recording.RecordingTrace`, every operation of
the forward reaches a :class:`Tape` instead of being dispatched. The tape
numbers values in order of creation (inputs, then each operation's outputs as
they come) and keeps, per operation, its primitive, params and the numbers of
its inputs. Python sees tracers with shapes and dtypes.

Values are computed only when needed, in one of two modes:

* **lazy** (the default): nothing runs while recording. When Python asks for a
  value (``bool``, ``float``, ``int``, printing, ``np.asarray``, a host
  callback's arguments), the operations it depends on and whose values are not
  known yet run eagerly, one by one, and their outputs become known. A
  forward that never looks at a value runs no operation at all before the
  compiled step;
* **eager**: each operation runs as soon as it is recorded, as plain JAX would.
  Every value is known, so JAX specialises code on values exactly as it does
  eagerly (boolean-mask indexing, ``jnp.arange(n)`` on a traced ``n``).

What is recorded and how:

* a plain primitive (``jit`` regions included, as one operation holding their
  jaxpr; loops and conds likewise) as itself;
* a ``custom_jvp``/``custom_vjp`` call (``jax.nn.relu``, :func:`~jaxaot.grad_hook`,
  :func:`~jaxaot.aot_function` regions) staged by JAX into its single equation,
  its custom rule kept (the rule's identity goes into the key);
* a host callback (``jax.debug.print``, ``pure_callback``) runs at once on
  concrete arguments and is not recorded: its outputs become inputs of the step;
* inputs: the differentiated leaves, then every other array the forward uses
  (batch, closed-over arrays; NumPy arrays are copied to the device), and
  Python or NumPy scalars as literals (their value is part of the key).

:func:`structure` builds the :class:`~jaxaot.autograd.recorded.structure.Structure` of a
finished tape, keyed incrementally during recording; :func:`replay` re-applies
the operations in any trace (the compiled step traces it under
``jax.value_and_grad``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from jaxaot import _compat as C
from jaxaot.autograd.recorded.structure import Structure, aval_key, param_key

_SIMPLE = (int, str, bool, type(None), float)
_Tracer = C.RecordingTracer


class Look(NamedTuple):
    """A value Python looked at while the forward was recorded (``if loss > 0``, ``int(n)``)."""

    after: int         #: how many operations were recorded before it
    source_info: Any   #: where (JAX's source info; ``C.recorded_source`` writes it as ``file:line (function)``)
    value: Any         #: the value, when it is a scalar (else None)


class Eqn(NamedTuple):
    """One recorded operation (``staged``: ``params`` are an equation's, from ``C.stage_call``)."""

    prim: Any
    params: dict
    ins: tuple
    outs: tuple
    staged: bool
    source_info: Any


def _literal_value_key(x: Any) -> tuple | None:
    """The value part of a scalar literal's key, or None when ``x`` is no scalar literal."""
    if isinstance(x, bool):
        return ("b", bool(x))
    if isinstance(x, int):
        return ("i", int(x))
    if isinstance(x, float):
        return ("f", float(x).hex())
    if isinstance(x, complex):
        return ("c", x.real.hex(), x.imag.hex())
    if isinstance(x, (np.generic, np.ndarray)) and np.size(x) == 1:
        a = np.asarray(x)
        return ("a", str(a.dtype), a.shape, a.tobytes())
    return None


#: (primitive, input avals, params items) -> (output avals, effects, params key), for params that
#: hash (jaxprs by identity): the same ``jit`` region binds the same param objects every step, so
#: one lookup replaces its abstract evaluation and the walk of its jaxpr.
_MEMO: dict[tuple, tuple] = {}
_MEMO_MAX = 4096


def _params_key(params: dict) -> tuple:
    return tuple((k, v if type(v) in _SIMPLE else param_key(v)) for k, v in params.items())


def _abstract(prim: Any, avals: list, params: dict) -> tuple:
    """``(output avals, effects, params key)`` of one primitive application."""
    try:
        memo = (prim, *avals, *params.items())
        hit = _MEMO.get(memo)
    except TypeError:  # an unhashable param
        return (*C.abstract_eval(prim, avals, params), _params_key(params))
    if hit is None:
        hit = (*C.abstract_eval(prim, avals, params), _params_key(params))
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[memo] = hit
    return hit


def _staged_params_key(params: dict, rules: dict) -> tuple:
    """A staged equation's params without its rule thunks (new per call), plus the rules' identities."""
    kept = tuple((k, param_key(v)) for k, v in params.items() if not C.is_rule_param(v))
    return kept + tuple(sorted(rules.items()))


class Tape:
    """The recorder behind a :class:`~jaxaot._compat.recording.RecordingTrace` (one per step).

    Attributes:
      eager: run each operation as it is recorded (else only on demand).
      values: per value number, its concrete value, or None while unknown.
      avals: per value number, its aval.
      eqns: the recorded operations, in order.
      inputs: ``(value number, kind, aval key[, literal value])`` per input,
        ``kind`` one of ``diff``, ``arg`` (a runtime argument), ``lit``.
      args: the runtime values of the ``arg`` inputs, in order.
      looks: per value Python looked at (``bool``, ``int``, ``float``, printing), a :class:`Look`:
        where, after how many operations, and the value when it is a scalar. Not part of the
        structure; recompile reasons use them to say which Python branch went the other way.
    """

    def __init__(self, eager: bool = False) -> None:
        self.eager = eager
        self.parent = C.current_trace()
        self.trace = C.RecordingTrace(self)
        self.values: list = []
        self.avals: list = []
        self.akeys: list = []
        self.producer: list[int] = []
        self.eqns: list[Eqn] = []
        self.eqn_keys: list[tuple] = []
        self.inputs: list[tuple] = []
        self.args: list = []
        self._by_id: dict[int, int] = {}
        self._by_literal: dict[tuple, int] = {}
        self._keep: list = []
        self.looks: list[Look] = []

    # -- values
    def _new(self, aval: Any, value: Any, producer: int) -> int:
        vid = len(self.avals)
        self.avals.append(aval)
        self.akeys.append(aval_key(aval))
        self.values.append(value)
        self.producer.append(producer)
        return vid

    def tracer(self, vid: int) -> Any:
        return C.RecordingTracer(self.trace, self.avals[vid], vid)

    def diff_input(self, value: Any) -> Any:
        """A tracer for a differentiated leaf (call these first, in order)."""
        vid = self._new(C.typeof(value), value, -1)
        self.inputs.append((vid, "diff", self.akeys[vid]))
        return self.tracer(vid)

    def ref(self, x: Any) -> int:
        """The value number of ``x``: a tracer of this tape, or a constant made an input on first use."""
        if type(x) is _Tracer and x._trace is self.trace:
            return x.vid
        if isinstance(x, C.Tracer):
            raise C.Unrecordable(f"a {type(x).__name__} from another transformation reached the forward")
        vid = self._by_id.get(id(x))
        if vid is not None:
            return vid
        lit = _literal_value_key(x)
        if lit is not None:
            aval = C.typeof(x)
            key = (lit, aval_key(aval))
            vid = self._by_literal.get(key)
            if vid is None:
                vid = self._by_literal[key] = self._new(aval, x, -1)
                self.inputs.append((vid, "lit", self.akeys[vid], lit))
            return vid
        value = jax.device_put(x) if isinstance(x, np.ndarray) else x  # NumPy is mutable: copy it now
        vid = self._new(C.typeof(value), value, -1)
        self._by_id[id(x)] = vid
        self._keep.append(x)
        self.inputs.append((vid, "arg", self.akeys[vid]))
        self.args.append(value)
        return vid

    def known(self, vid: int) -> Any:
        """The value if already known, else None (JAX asks this opportunistically)."""
        return self.values[vid]

    def force(self, vid: int, look: bool = True) -> Any:
        """The concrete value of ``vid``, running what it depends on that has not run yet.

        ``look``: Python itself asked (a :class:`Look` is kept), not a host callback's argument.
        """
        value = self.values[vid]
        if value is None:
            value = self._compute(vid)
        if look:
            self.looks.append(Look(len(self.eqns), C.source_info(), value if getattr(value, "size", 2) == 1 else None))
        return value

    def _compute(self, vid: int) -> Any:
        """Run the operations ``vid`` depends on that have not run yet; its value."""
        needed, stack = set(), [self.producer[vid]]
        while stack:
            i = stack.pop()
            if i in needed:
                continue
            needed.add(i)
            stack.extend(self.producer[v] for v in self.eqns[i].ins if self.values[v] is None)
        self._run(sorted(needed))
        return self.values[vid]

    def _run(self, indices: Sequence[int]) -> None:
        values = self.values
        for i in indices:
            e = self.eqns[i]
            outs = C.bind_on(self.parent, e.prim, [values[v] for v in e.ins], e.params, e.staged)
            for v, o in zip(e.outs, outs):
                values[v] = o

    # -- recording (called by the trace)
    def _record(self, prim: Any, params: dict, ins: tuple, out_avals: Sequence[Any], staged: bool,
                pkey: tuple) -> list:
        index = len(self.eqns)
        outs = tuple(self._new(a, None, index) for a in out_avals)
        self.eqns.append(Eqn(prim, params, ins, outs, staged, C.source_info()))
        self.eqn_keys.append((prim, ins, tuple(self.akeys[v] for v in outs), pkey))
        if self.eager:
            self._run((index,))
        return [self.tracer(v) for v in outs]

    def primitive(self, prim: Any, args: Sequence[Any], params: dict) -> list:
        if C.is_callback_primitive(prim):
            return self._callback(prim, args, params)
        ins = tuple(self.ref(a) for a in args)
        out_avals, effects, pkey = _abstract(prim, [self.avals[v] for v in ins], params)
        if effects:
            raise C.Unrecordable(f"{prim} has side effects ({', '.join(map(str, effects))})")
        return self._record(prim, params, ins, out_avals, False, pkey)

    def staged(self, args: Sequence[Any], stage: Any, rules: dict) -> list:
        ins = tuple(self.ref(a) for a in args)
        prim, params, consts, out_avals, effects = stage([self.avals[v] for v in ins])
        if effects:
            raise C.Unrecordable(f"{prim} has side effects ({', '.join(map(str, effects))})")
        ins = (*(self.ref(c) for c in consts), *ins)
        return self._record(prim, params, ins, out_avals, True, _staged_params_key(params, rules))

    def stage_value(self, val: Any) -> Any:
        return self.tracer(self.ref(val))

    def _callback(self, prim: Any, args: Sequence[Any], params: dict) -> list:
        """Run a host callback now, on concrete arguments; its outputs become inputs of the step."""
        vals = [self.force(a.vid, look=False) if type(a) is C.RecordingTracer and a._trace is self.trace else a
                for a in args]
        outs = C.bind_on(self.parent, prim, vals, params)
        return [self.tracer(self.ref(o)) for o in outs]

    def output(self, x: Any) -> int:
        """The value number of a forward output (a tracer, or a constant made an input)."""
        return self.ref(x)


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


def structure(tape: Tape, outputs: Sequence[int], program: Program) -> Structure:
    """The :class:`Structure` of a finished tape whose step returns the values ``outputs``."""
    key = (tuple(tape.inputs), tuple(tape.eqn_keys), tuple(outputs))
    return Structure(key, program, vid_avals=tuple(tape.akeys), kind="forward", looks=tuple(tape.looks))


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
