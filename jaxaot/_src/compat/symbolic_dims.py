"""Symbolic dimensions (``jax.export`` shape polymorphism): their values and their scope's constraints."""

from __future__ import annotations

from typing import Any, Sequence

import jax


def dim_value(d: Any, symbol_value: int) -> int:
    """``d`` as an int; a symbolic dimension (``16*b``) is evaluated with every symbol at ``symbol_value``."""
    if not jax.export.is_symbolic_dim(d):
        return int(d)
    return int(d._evaluate({name: symbol_value for name in d._get_vars()}))


def dim_constraints(shapes: Sequence[Sequence[Any]]) -> tuple[str, ...]:
    """The constraints (``"b >= 4"``, as written) of the symbolic scope of the dims in ``shapes``, in order."""
    out: dict[str, None] = {}
    for d in (d for shape in shapes for d in shape if jax.export.is_symbolic_dim(d)):
        out.update((c.debug_str, None) for c in getattr(d.scope, "_explicit_constraints", ()))
    return tuple(out)


__all__ = ["dim_constraints", "dim_value"]
