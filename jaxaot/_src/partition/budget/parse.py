"""What a ``memory_budget`` means: a fraction of the planner's range, or the step's peak device bytes.

Every entry point reads ``memory_budget`` with :func:`parse_memory_budget`, so one
value means one thing everywhere: a float in ``[0, 1]`` (or the ints 0 and 1) is a
fraction of the min-cut's range of saved bytes; other ints, whole floats above 1
and strings with a unit (``"1.4GB"``, ``"512MiB"``) are bytes of the step's
compiled peak per device. Anything else raises a typed error saying what was
wrong (``1.5`` asks whether ``"1.5GB"`` was meant).

Example:
    >>> from jaxaot._src.partition.budget import parse_memory_budget
    >>> parse_memory_budget(0.5), parse_memory_budget("1.5GB"), parse_memory_budget("512MiB").nbytes
    (MemoryBudget(fraction=0.5), MemoryBudget(nbytes=1500000000), 536870912)
    >>> parse_memory_budget(1.4e9).nbytes, parse_memory_budget("1e3").nbytes, parse_memory_budget(4096).nbytes
    (1400000000, 1000, 4096)
    >>> parse_memory_budget(1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    jaxaot.errors.InvalidValueError: memory_budget=1.5 is above 1, so it is not a fraction, ... Did you mean '1.5GB'? ...
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import numbers
import re

from jaxaot.errors import InvalidInputError, InvalidValueError

#: Bytes per unit (decimal units are powers of 1000, binary ones of 1024; case-insensitive).
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNIT_NAMES = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"

_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?"
_TEXT = re.compile(rf"^\s*({_NUMBER})\s*([a-z]*)\s*$", re.IGNORECASE)

_KINDS = ("a fraction in [0, 1] (0.5), bytes as an int (4096) or a whole float (1.4e9), or a string with a "
          "unit ('1.4GB', '512MiB')")


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """A parsed ``memory_budget``: exactly one of ``fraction`` (in ``[0, 1]``) and ``nbytes`` (positive) is set."""

    fraction: float | None = None
    nbytes: int | None = None

    @property
    def in_bytes(self) -> bool:
        return self.nbytes is not None

    @property
    def value(self) -> float | int:
        """The fraction, or the bytes."""
        return self.fraction if self.nbytes is None else self.nbytes

    def __repr__(self) -> str:
        if self.nbytes is None:
            return f"MemoryBudget(fraction={self.fraction!r})"
        return f"MemoryBudget(nbytes={self.nbytes})"


def parse_memory_budget(value: object) -> MemoryBudget:
    """``value`` as a :class:`MemoryBudget` (see the module docstring for what each kind of value means).

    Raises:
      InvalidValueError: a negative, NaN or infinite number; a float above 1, or a number of ``B``, with a
        fractional part; zero bytes or less than a byte; a string that is neither a number nor a number and a
        unit (``B``, ``kB``, ``MB``, ``GB``, ``TB``, ``KiB``, ``MiB``, ``GiB``, ``TiB``).
      InvalidInputError: neither a real number nor a string (a bool, None, bytes, an array).
    """
    if isinstance(value, MemoryBudget):
        return value
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(f"memory_budget must be {_KINDS}, got {type(value).__name__}: {value!r}.")
    return _parse_number(value, repr(value))


def _parse_number(value: numbers.Real, shown: str) -> MemoryBudget:
    if isinstance(value, numbers.Integral):
        n = int(value)
        if n < 0:
            raise _negative(shown)
        return MemoryBudget(fraction=float(n)) if n <= 1 else MemoryBudget(nbytes=n)
    x = float(value) + 0.0  # -0.0 is the fraction 0
    if not math.isfinite(x):
        raise InvalidValueError(f"memory_budget={shown} is not a finite number: pass {_KINDS}.")
    if x < 0:
        raise _negative(shown)
    if x <= 1.0:
        return MemoryBudget(fraction=x)
    if not x.is_integer():
        if x < 1 + 1e-6:  # 1 plus rounding error, as a sum of fractions gives: the whole step
            meant = "the fraction 1.0 (a sum of fractions rounded above it: clip it, e.g. min(x, 1.0))"
        elif x < 1024:
            meant = f"'{x:g}GB'"
        else:
            meant = f"{math.floor(x)} (a whole number of bytes, e.g. int(...))"
        raise InvalidValueError(
            f"memory_budget={shown} is above 1, so it is not a fraction, and it is not a whole number of bytes. "
            f"Did you mean {meant}? A fraction lies in [0, 1]; bytes are an int, a whole float such as 1.4e9, "
            f"or a string with a unit ('1.4GB', '512MiB').")
    return MemoryBudget(nbytes=int(x))


def _negative(shown: str) -> InvalidValueError:
    return InvalidValueError(f"memory_budget={shown} is negative: pass {_KINDS}.")


def _parse_text(text: str) -> MemoryBudget:
    m = _TEXT.match(text)
    shown = repr(text)
    if m is None and text.strip().lstrip("+-").lower() in ("nan", "inf", "infinity"):
        return _parse_number(float(text), shown)  # as the float would be
    if m is None:
        raise InvalidValueError(
            f"memory_budget {shown} is not a number, nor a number and a unit: write bytes such as '1.4GB', "
            f"'512MiB' or '800kB' (units {_UNIT_NAMES}, case-insensitive), or a fraction such as '0.5'.")
    number, unit = m.group(1), m.group(2)
    if not unit:  # a plain number means what the number means
        is_int = not any(c in number for c in ".eE")
        return _parse_number(int(number) if is_int else float(number), shown)
    scale = UNITS.get(unit.lower())
    if scale is None:
        hint = f" ({unit.upper()}B or {unit.upper()}iB?)" if unit.lower() in ("k", "m", "g", "t") else ""
        raise InvalidValueError(
            f"memory_budget {shown} has an unknown unit {unit!r}{hint}: the units are {_UNIT_NAMES} "
            f"(case-insensitive).")
    nbytes = float(number) * scale
    if nbytes < 0:
        raise _negative(shown)
    if scale == 1 and math.isfinite(nbytes) and not nbytes.is_integer():
        raise InvalidValueError(
            f"memory_budget {shown} is not a whole number of bytes. Did you mean '{number}GB' or '{number}MB'? "
            f"Bytes are whole ('4096B'); larger units may carry a fraction ('1.5GB').")
    if not math.isfinite(nbytes):
        raise InvalidValueError(f"memory_budget {shown} is more bytes than a float holds: pass {_KINDS}.")
    if nbytes < 1:
        raise InvalidValueError(
            f"memory_budget {shown} is {nbytes:g} bytes: a byte budget must be at least 1 byte (for the fraction "
            f"0, recompute everything, pass 0.0).")
    return MemoryBudget(nbytes=round(fractions.Fraction(number) * scale))  # exact: '2.01kB' is 2010 bytes
