"""The structure of a captured backward: what decides whether a compiled executable fits it.

Two backward jaxprs have the same :class:`Structure` when they have the same
inputs (shapes, dtypes, weak types), the same equations in the same order
(primitive, params, literal values, output avals) and the same wiring (which
value feeds which equation). Object identity plays no part: each step's
backward is a fresh jaxpr with fresh residual arrays, and the same program
shape must map to the same executable.

This is the role PyTorch's compiled autograd gives to the autograd graph's
node signatures; in JAX the natural unit is the jaxpr equation. The key is a
plain nested tuple, built in one pass over the equations (no printing, no
hashing of array contents), so Python's dict does the lookup; equal hashes
are confirmed by full tuple equality, so a collision can cost a lookup but
never a wrong executable.

Costs and limits:

* Literal values are part of the key. A Python float computed from data and
  used in the forward (``x * float(loss)``) becomes a literal of the
  linearized program, so such code compiles once per distinct value. Keep
  such values as arrays.
* Params that hold jaxprs (loop bodies, calls) are keyed by their own
  structure, memoized per jaxpr object. Params that hold Python callables
  (host callbacks) are keyed by the callable itself.
* :func:`explain` turns two structures into the reason for a recompile: the
  first input or equation that differs, old against new, with the user source
  line of the forward operation it transposes when JAX recorded one.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Sequence

from jaxaot import _compat as C
from jaxaot._pytrees import format_aval

#: id(sub-jaxpr) -> (the jaxpr, its key): sub-jaxprs recur across steps (loop bodies are cached by JAX).
_SUB_KEYS: "collections.OrderedDict[int, tuple[Any, tuple]]" = collections.OrderedDict()
_SUB_MAX = 512
_SUB_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Structure:
    """A backward jaxpr's key, plus what :func:`explain` needs to say how two keys differ.

    Attributes:
      key: the hashable key (inputs, equations, outputs).
      jaxpr: the jaxpr it was computed from (for source lines in reasons).
    """

    key: tuple
    jaxpr: Any

    @property
    def inputs(self) -> tuple:
        return self.key[0]

    @property
    def eqns(self) -> tuple:
        return self.key[1]


def _aval_key(aval: Any) -> tuple:
    return (tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False)))


def _literal_key(lit: Any) -> tuple:
    val = lit.val
    if hasattr(val, "shape"):  # a 0-d array: its item and dtype
        val = (val.item(), str(val.dtype)) if getattr(val, "size", 2) == 1 else ("array", repr(val))
    return ("lit", _aval_key(lit.aval), val)


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


def _sub_key(jaxpr: Any) -> tuple:
    with _SUB_LOCK:
        hit = _SUB_KEYS.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            _SUB_KEYS.move_to_end(id(jaxpr))
            return hit[1]
    consts = C.consts_of(jaxpr)
    key = (tuple(_aval_key(C.shaped_abstractify(c)) for c in consts), jaxpr_key(C.jaxpr_of(jaxpr)))
    with _SUB_LOCK:
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


def _eqn_text(eqn_key: tuple, inputs: Sequence[tuple], eqns: Sequence[tuple]) -> str:
    prim, ins, outs, _ = eqn_key

    def in_text(r: Any) -> str:
        if isinstance(r, tuple):
            val = r[2][0] if isinstance(r[2], tuple) else r[2]
            return f"{val!r}:{_aval_text(r[1])}"
        return _aval_text(_var_aval(r, inputs, eqns))

    return f"{prim}({', '.join(in_text(r) for r in ins)}) -> {', '.join(_aval_text(o) for o in outs)}"


def _var_aval(ref: int, inputs: Sequence[tuple], eqns: Sequence[tuple]) -> tuple:
    if ref < len(inputs):
        return inputs[ref]
    n = len(inputs)
    for _, _, outs, _ in eqns:  # refs count only the kept outputs; DropVars are rare in backward programs
        if ref < n + len(outs):
            return outs[ref - n]
        n += len(outs)
    return ((), "?", False)


def explain(old: Structure, new: Structure) -> str:
    """Why ``new`` did not match ``old``: the inputs and the first equation that differ, old vs new."""
    parts = []
    if len(old.inputs) != len(new.inputs):
        parts.append(f"the backward takes {len(new.inputs)} residuals, was {len(old.inputs)}")
    elif old.inputs != new.inputs:
        i = next(i for i, (a, b) in enumerate(zip(old.inputs, new.inputs)) if a != b)
        parts.append(f"residual {i} is {_aval_text(new.inputs[i])}, was {_aval_text(old.inputs[i])}")
    for i, (a, b) in enumerate(zip(old.eqns, new.eqns)):
        if a != b:
            was, now = _eqn_text(a, old.inputs, old.eqns), _eqn_text(b, new.inputs, new.eqns)
            what = ("params changed" if a[:3] == b[:3] else "inputs come from other values" if was == now
                    else "changed")
            parts.append(f"backward equation {i} {what}{_source(new, i)}: was {was}, now {now}")
            break
    else:
        if len(old.eqns) != len(new.eqns):
            n = min(len(old.eqns), len(new.eqns))
            longer = new if len(new.eqns) > n else old
            parts.append(f"the backward has {len(new.eqns)} equations, was {len(old.eqns)} "
                         f"(first extra one: {longer.eqns[n][0]}{_source(longer, n)})")
    if len(old.eqns) != len(new.eqns) and not any(p.startswith("the backward has") for p in parts):
        parts.append(f"{len(new.eqns)} equations, was {len(old.eqns)}")
    return "; ".join(parts) or "the backward's outputs changed"


def _source(structure: Structure, index: int) -> str:
    try:
        eqn = C.jaxpr_of(structure.jaxpr).eqns[index]
    except (AttributeError, IndexError):
        return ""
    src = C.eqn_source(eqn)
    return "" if not src or src == "<unknown>" else f" at {src}"
