"""What a ``memory_budget`` means: a fraction of the planner's range, or the step's peak device bytes.

``memory_budget`` takes two kinds of value:

* a number in ``[0, 1]``: a *fraction*, interpolating the min-cut's saved bytes
  between recomputing every expensive eqn (0) and none (1)
  (:mod:`jaxaot.partition.mincut.saved_values`);
* a number above 1, or a string with a unit (``"1.4GB"``, ``"512MiB"``,
  ``"800 kB"``): *bytes*, the training step's compiled peak device memory per
  device, which the planner then fits (:mod:`jaxaot.partition.budget.search`).

:func:`parse_memory_budget` reads either, and refuses what means neither:
negative numbers, NaN, infinities, booleans, zero bytes, unknown units.

Example:
    >>> from jaxaot.partition.budget import parse_memory_budget
    >>> parse_memory_budget(0.5), parse_memory_budget("1.5GB"), parse_memory_budget("512MiB").nbytes
    (MemoryBudget(fraction=0.5), MemoryBudget(nbytes=1500000000), 536870912)
    >>> parse_memory_budget(1.4e9).nbytes
    1400000000
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re

from jaxaot.errors import InvalidInputError, InvalidValueError

#: Bytes per unit (decimal units are powers of 1000, binary ones of 1024; case-insensitive).
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

_TEXT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e([+-]?[0-9]+))?\s*([a-z]+)\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """A parsed ``memory_budget``: exactly one of ``fraction`` (in ``[0, 1]``) and ``nbytes`` (positive) is set."""

    fraction: float | None = None
    nbytes: int | None = None

    @property
    def in_bytes(self) -> bool:
        return self.nbytes is not None

    def __repr__(self) -> str:
        if self.nbytes is None:
            return f"MemoryBudget(fraction={self.fraction!r})"
        return f"MemoryBudget(nbytes={self.nbytes})"


def parse_memory_budget(value: object) -> MemoryBudget:
    """``value`` as a :class:`MemoryBudget` (see the module docstring).

    Raises:
      InvalidValueError: a negative, NaN or infinite number, zero bytes, or a string that is not
        a number and a unit (``B``, ``kB``, ``MB``, ``GB``, ``TB``, ``KiB``, ``MiB``, ``GiB``, ``TiB``).
      InvalidInputError: neither a real number nor a string.
    """
    if isinstance(value, MemoryBudget):
        return value
    if isinstance(value, str):
        return MemoryBudget(nbytes=_parse_text(value))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(
            f"memory_budget must be a number (a fraction in [0, 1], or bytes above 1) or a string such as "
            f"'1.4GB' or '512MiB', got {type(value).__name__}: {value!r}.")
    x = float(value)
    if math.isnan(x) or math.isinf(x) or x < 0:
        raise InvalidValueError(
            f"memory_budget must be a fraction in [0, 1] or a positive number of bytes, got {value!r}.")
    if x <= 1.0:
        return MemoryBudget(fraction=x)
    return MemoryBudget(nbytes=int(x))


def _parse_text(text: str) -> int:
    m = _TEXT.match(text)
    unit = UNITS.get(m.group(3).lower()) if m else None
    if unit is None:
        raise InvalidValueError(
            f"memory_budget {text!r} is not a number and a unit: write bytes such as '1.4GB', '512MiB' or "
            f"'800kB' (units {', '.join(sorted(UNITS, key=UNITS.get))}), or pass a number.")
    nbytes = float(m.group(1)) * 10 ** int(m.group(2) or 0) * unit
    if not math.isfinite(nbytes) or nbytes < 1:
        raise InvalidValueError(f"memory_budget {text!r} is {nbytes:g} bytes: a byte budget must be at least 1 byte.")
    return int(nbytes)


def format_bytes(n: float | None) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1, for messages.

    Example:
        >>> from jaxaot.partition.budget import format_bytes
        >>> format_bytes(1536), format_bytes(3 * 2**30), format_bytes(12)
        ('1.50 KiB', '3.00 GiB', '12 B')
    """
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover
