"""Byte counts as text: the one formatter every message, table and picture uses.

Sizes print in the largest binary unit that keeps the number at least 1, with
one decimal (``"1.5 KiB"``), whole bytes below a KiB; :func:`byte_scale` gives
that unit for a plot's axis. Nothing here imports JAX.

Example:
    >>> format_bytes(512), format_bytes(1536), format_bytes(3 * 2**30), format_bytes(None)
    ('512 B', '1.5 KiB', '3.0 GiB', '?')
"""

from __future__ import annotations

#: The binary units, largest first: ``(name, bytes per unit)``.
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_scale(n: float) -> tuple[int, str]:
    """The largest binary unit not above ``n``: ``(bytes per unit, name)``.

    Example:
        >>> byte_scale(5000), byte_scale(12)
        ((1024, 'KiB'), (1, 'B'))
    """
    for unit, size in UNITS:
        if n >= size:
            return size, unit
    return 1, "B"


def format_bytes(n: float | None) -> str:
    """``n`` bytes in the largest binary unit that keeps the number at least 1 (``"?"`` for None).

    Example:
        >>> format_bytes(100), format_bytes(65536), format_bytes(-2048)
        ('100 B', '64.0 KiB', '-2.0 KiB')
    """
    if n is None:
        return "?"
    size, unit = byte_scale(abs(n))
    return f"{int(n)} B" if unit == "B" else f"{n / size:.1f} {unit}"
