"""Executables the byte-budget search compiled to measure plans, held briefly so the runtime can run one.

Measuring a plan compiles its fused step. Where that compile used the backend's own
options, its executable is the one the runtime would compile for the chosen plan, so
:func:`keep` holds it and :func:`take` hands it, once, to a compile of the same
program (text, consts and literals), input types, compiler options and donation,
under the same default device and matmul precision. One compiled with cheaper options
(on CPU) is held as *provisional*: :func:`take_provisional` hands it to a runtime that
runs it while its own compile finishes. The search :func:`release`\\ s the plans it did
not choose; at most :data:`LIMIT` executables are held, the oldest dropped first.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C

#: At most this many measurement executables are held (a search's chosen plan, and a few more where
#: searches overlap or one's executable is never asked for).
LIMIT = 4


@dataclasses.dataclass(frozen=True)
class _Held:
    closed: Any  # the measured program, for its consts and literals
    digest: str  # sha256 of its text
    key: tuple  # input types, compiler options, donation, context
    exe: Any
    provisional: bool = False  # compiled with cheaper options than the runtime's (its peak the same or above)


@dataclasses.dataclass(frozen=True)
class HeldCounts:
    """What the store did in this process.

    Attributes:
      kept: executables handed to :func:`keep`.
      taken: executables :func:`take` handed out (each a compile the runtime did not repeat).
      dropped: executables released by their search or pushed out by newer ones.
      held: executables held at the call.
    """

    kept: int
    taken: int
    dropped: int
    held: int


_HELD: collections.OrderedDict[int, _Held] = collections.OrderedDict()  # by id of the measured program
_COUNTS = collections.Counter()
_LOCK = threading.Lock()


def _key(avals: Sequence[Any], options: dict[str, Any], donated: Sequence[int]) -> tuple:
    types = tuple((tuple(a.shape), str(a.dtype), bool(getattr(a, "weak_type", False)), getattr(a, "sharding", None))
                  for a in avals)
    context = (str(jax.config.jax_default_device), str(jax.config.jax_default_matmul_precision))
    return types, str(sorted(options.items())), tuple(sorted(donated)), context


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def keep(closed: Any, avals: Sequence[Any], options: dict[str, Any], exe: Any, *, donated: Sequence[int] = (),
         text: str | None = None, provisional: bool = False) -> None:
    """Hold ``exe``, compiled from ``closed`` on ``avals`` with XLA ``options`` and ``donated`` inputs
    (``text``: ``str(closed)``, where the caller has it), dropping the oldest beyond :data:`LIMIT`. With
    ``provisional``, ``exe`` was compiled with cheaper options and stands for a compile with ``options``:
    only :func:`take_provisional` hands it out."""
    held = _Held(closed, _digest(str(closed) if text is None else text), _key(avals, options, donated), exe,
                 provisional)
    with _LOCK:
        _HELD[id(closed)] = held
        _COUNTS["kept"] += 1
        while len(_HELD) > LIMIT:
            _HELD.popitem(last=False)
            _COUNTS["dropped"] += 1


def take(closed: Any, avals: Sequence[Any], options: dict[str, Any], donated: Sequence[int] = ()) -> Any | None:
    """The executable held for the same program as ``closed`` on ``avals`` with these XLA ``options`` and
    ``donated`` inputs, no longer held; None where there is none (its text is read only where the rest matches)."""
    return _match(closed, avals, options, donated, take=True)


def take_provisional(closed: Any, avals: Sequence[Any], options: dict[str, Any], donated: Sequence[int] = ()
                     ) -> Any | None:
    """As :func:`take`, the provisional executable held for these arguments (compiled with cheaper options: its
    code is slower, its peak near the runtime's), no longer held; None where there is none."""
    return _match(closed, avals, options, donated, take=True, provisional=True)


def holds(closed: Any, avals: Sequence[Any], options: dict[str, Any], donated: Sequence[int] = ()) -> bool:
    """Whether :func:`take` would hand out an executable for these arguments now (nothing is taken)."""
    return _match(closed, avals, options, donated, take=False) is not None


def _match(closed: Any, avals: Sequence[Any], options: dict[str, Any], donated: Sequence[int], take: bool,
           provisional: bool = False) -> Any:
    """The held executable of the same program, provisional or not (dropped from the held ones with ``take``),
    or None."""
    key = _key(avals, options, donated)
    n_out = len(C.jaxpr_of(closed).outvars)
    with _LOCK:
        maybe = [k for k, h in _HELD.items() if h.key == key and h.provisional == provisional
                 and len(C.jaxpr_of(h.closed).outvars) == n_out]
    if not maybe:
        return None
    digest = _digest(str(closed))
    with _LOCK:
        for k in maybe:
            h = _HELD.get(k)
            if h is not None and h.digest == digest and _same_values(h.closed, closed):
                if take:
                    del _HELD[k]
                    _COUNTS["taken"] += 1
                return h.exe
    return None


def release(closeds: Iterable[Any]) -> None:
    """Stop holding the executables measured from ``closeds`` (a search's plans it did not choose)."""
    with _LOCK:
        for closed in closeds:
            if _HELD.pop(id(closed), None) is not None:
                _COUNTS["dropped"] += 1


def clear() -> None:
    """Stop holding every executable."""
    with _LOCK:
        _COUNTS["dropped"] += len(_HELD)
        _HELD.clear()


def counts() -> HeldCounts:
    """The :class:`HeldCounts` of this process."""
    with _LOCK:
        return HeldCounts(_COUNTS["kept"], _COUNTS["taken"], _COUNTS["dropped"], len(_HELD))


def _values(closed: Any) -> list:
    """The consts of ``closed``, then per eqn (depth first) its literals and the consts of its sub-jaxprs: what
    a program's text does not show in full."""
    out = list(C.consts_of(closed))
    for eqn in C.iter_eqns(closed):
        out.extend(v.val for v in eqn.invars if C.is_literal(v))
        for sub in C.eqn_subjaxprs(eqn):
            out.extend(C.consts_of(sub))
    return out


def _same_values(a: Any, b: Any) -> bool:
    """Whether two programs of one text hold the same values, bit for bit (the same objects, mostly)."""
    xs, ys = _values(a), _values(b)
    return len(xs) == len(ys) and all(_same_value(x, y) for x, y in zip(xs, ys))


def _same_value(x: Any, y: Any) -> bool:
    if x is y:
        return True
    try:
        u, v = np.asarray(x), np.asarray(y)
    except Exception:  # noqa: BLE001 - a value numpy cannot read (a typed key): not known to be the same
        return False
    return u.dtype == v.dtype and u.shape == v.shape and u.tobytes() == v.tobytes()
