"""The structure of a recorded forward or a captured backward: what decides whether an executable fits it.

Two programs have the same :class:`Structure` when they have the same
inputs (shapes, dtypes, weak types), the same equations in the same order
(primitive, params, literal values, output avals) and the same wiring (which
value feeds which equation). Object identity plays no part: each step's
program is recorded afresh with fresh arrays, and the same program shape must
map to the same executable. The same key serves the forward tapes of
:mod:`.tape` (``kind="forward"``: inputs numbered among all values, as they
were met) and the backward jaxprs of :mod:`.capture` (``kind="backward"``).

This is the role PyTorch's compiled autograd gives to the autograd graph's
node signatures; in JAX the natural unit is the jaxpr equation. The key is a
plain nested tuple, built in one pass over the equations (no printing, no
hashing of array contents), so Python's dict does the lookup; equal hashes
are confirmed by full tuple equality, so a collision can cost a lookup but
never a wrong executable.

Costs and limits:

* Literal values are part of the key. A Python float computed from data and
  used in the forward (``x * float(loss)``) becomes a literal of the
  recorded program, so such code compiles once per distinct value. Keep
  such values as arrays.
* Params that hold jaxprs (loop bodies, calls, ``jit`` regions) are keyed by
  their own structure, memoized per jaxpr object and interned, so equal
  sub-structures compare by identity and hash once. Params that hold Python
  callables (host callbacks) are keyed by the callable itself.
* :func:`explain` turns two structures into the reason for a recompile: the
  first input or equation that differs, old against new, with the user source
  line of the forward operation it transposes when JAX recorded one.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Sequence

import numpy as np

from jaxaot import _compat as C
from jaxaot._pytrees import format_aval

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
    """

    key: tuple
    jaxpr: Any
    vid_avals: tuple | None = None
    kind: str = "backward"

    @property
    def inputs(self) -> tuple:
        return self.key[0]

    @property
    def eqns(self) -> tuple:
        return self.key[1]


def aval_key(aval: Any) -> tuple:
    """``(shape, dtype, weak_type)`` of an aval."""
    return (tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False)))


_aval_key = aval_key


class _Interned:
    """A sub-jaxpr's key, interned: equal keys are one object, hashed once."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return self is other or (isinstance(other, _Interned) and self._hash == other._hash and self.key == other.key)


#: sub-jaxpr key -> its interned object (bounded: a dropped one is only a slower comparison).
_INTERNED: dict[tuple, _Interned] = {}


def _literal_key(lit: Any) -> tuple:
    val = lit.val
    if hasattr(val, "shape"):  # a 0-d array: its item and dtype
        val = (val.item(), str(val.dtype)) if getattr(val, "size", 2) == 1 else ("array", repr(val))
    return ("lit", _aval_key(lit.aval), val)


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
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__qualname__, repr(value))
    return value


def _sub_key(jaxpr: Any) -> _Interned:
    with _SUB_LOCK:
        hit = _SUB_KEYS.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            _SUB_KEYS.move_to_end(id(jaxpr))
            return hit[1]
    consts = C.consts_of(jaxpr)
    full = (tuple(_aval_key(C.shaped_abstractify(c)) for c in consts), jaxpr_key(C.jaxpr_of(jaxpr)))
    with _SUB_LOCK:
        key = _INTERNED.get(full)
        if key is None:
            if len(_INTERNED) >= 4 * _SUB_MAX:
                _INTERNED.clear()
            key = _INTERNED[full] = _Interned(full)
        _SUB_KEYS[id(jaxpr)] = (jaxpr, key)
        while len(_SUB_KEYS) > _SUB_MAX:
            _SUB_KEYS.popitem(last=False)
    return key


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
        params = tuple((k, _param_key(p)) for k, p in sorted(eqn.params.items())) if eqn.params else ()
        eqns.append((str(eqn.primitive), ins, tuple(outs), params))
    return (tuple(inputs), tuple(eqns), tuple(ref(v) for v in jaxpr.outvars))


def structure_of(closed: Any) -> Structure:
    """The :class:`Structure` of a closed jaxpr whose consts were hoisted to inputs."""
    return Structure(jaxpr_key(C.jaxpr_of(closed)), closed)


# --------------------------------------------------------------------------- reasons
def _aval_text(key: tuple) -> str:
    shape, dtype, weak = key
    return format_aval(_Aval(shape, dtype)) + ("{weak}" if weak else "")


@dataclasses.dataclass(frozen=True)
class _Aval:
    shape: tuple
    dtype: Any


def _eqn_text(eqn_key: tuple, structure: Structure) -> str:
    prim, ins, outs, _ = eqn_key

    def in_text(r: Any) -> str:
        if isinstance(r, tuple):
            val = r[2][0] if isinstance(r[2], tuple) else r[2]
            return f"{val!r}:{_aval_text(r[1])}"
        return _aval_text(_var_aval(r, structure))

    return f"{prim}({', '.join(in_text(r) for r in ins)}) -> {', '.join(_aval_text(o) for o in outs)}"


def _var_aval(ref: int, structure: Structure) -> tuple:
    if structure.vid_avals is not None:
        return structure.vid_avals[ref] if ref < len(structure.vid_avals) else ((), "?", False)
    inputs = structure.inputs
    if ref < len(inputs):
        return inputs[ref]
    n = len(inputs)
    for _, _, outs, _ in structure.eqns:  # refs count only the kept outputs; DropVars are rare in backward programs
        if ref < n + len(outs):
            return outs[ref - n]
        n += len(outs)
    return ((), "?", False)


def _literal_text(lit: tuple) -> str:
    kind, *value = lit
    if kind == "f":
        return repr(float.fromhex(value[0]))
    if kind == "c":
        return repr(complex(float.fromhex(value[0]), float.fromhex(value[1])))
    if kind == "a":
        return repr(np.frombuffer(value[2], dtype=value[0]).reshape(value[1]).item())
    return repr(value[0])


def _input_text(entry: tuple) -> str:
    """A backward input is an aval key; a tape input is ``(number, kind, aval key[, literal])``."""
    if entry and isinstance(entry[0], int):
        text = _aval_text(entry[2])
        if entry[1] == "lit":
            return f"the literal {_literal_text(entry[3])}:{text}"
        return f"{'differentiated ' if entry[1] == 'diff' else ''}{text}"
    return _aval_text(entry)


def explain(old: Structure, new: Structure) -> str:
    """Why ``new`` did not match ``old``: the inputs and the first equation that differ, old vs new."""
    program, inputs = ("forward", "input") if new.kind == "forward" else ("backward", "residual")
    parts = []
    if len(old.inputs) != len(new.inputs):
        parts.append(f"the {program} takes {len(new.inputs)} {inputs}s, was {len(old.inputs)}")
    elif old.inputs != new.inputs:
        i = next(i for i, (a, b) in enumerate(zip(old.inputs, new.inputs)) if a != b)
        parts.append(f"{inputs} {i} is {_input_text(new.inputs[i])}, was {_input_text(old.inputs[i])}")
    for i, (a, b) in enumerate(zip(old.eqns, new.eqns)):
        if a != b:
            was, now = _eqn_text(a, old), _eqn_text(b, new)
            what = ("params changed" if a[:3] == b[:3] else "inputs come from other values" if was == now
                    else "changed")
            parts.append(f"{program} equation {i} {what}{_source(new, i)}: was {was}, now {now}")
            break
    else:
        if len(old.eqns) != len(new.eqns):
            n = min(len(old.eqns), len(new.eqns))
            longer = new if len(new.eqns) > n else old
            parts.append(f"the {program} has {len(new.eqns)} equations, was {len(old.eqns)} "
                         f"(first extra one: {longer.eqns[n][0]}{_source(longer, n)})")
    if len(old.eqns) != len(new.eqns) and not any(p.startswith(f"the {program} has") for p in parts):
        parts.append(f"{len(new.eqns)} equations, was {len(old.eqns)}")
    return "; ".join(parts) or f"the {program}'s outputs changed"


def _source(structure: Structure, index: int) -> str:
    try:
        eqn = C.jaxpr_of(structure.jaxpr).eqns[index]
    except (AttributeError, IndexError):
        return ""
    src = C.recorded_source(eqn.source_info) if structure.kind == "forward" else C.eqn_source(eqn)
    return "" if not src or src == "<unknown>" else f" at {src}"
