"""``shard_map``'s manual axes in abstract inputs: which of them a value varies over.

Inside ``jax.shard_map`` (``check_vma=True``) each value's type says which manual axes it varies over: a
replicated parameter varies over none, a sharded batch over the batch axis. A program traced from inputs of
another variance does not replay there (``w * x`` with ``w`` replicated needs a ``pvary`` the trace did not
insert). :func:`abstract_input` keeps an aval's variance in the ``jax.ShapeDtypeStruct`` a program is traced
from, so the trace inserts what JAX would; outside ``shard_map`` it is the plain struct.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax

__all__ = ["abstract_input", "all_manual", "in_manual_context", "vary_like"]

#: The name the struct's variance takes: ``manual_axis_type`` (a ``ManualAxisType``), or ``vma`` (a set of names).
_FIELD = next((f for f in ("manual_axis_type", "vma") if f in inspect.signature(jax.ShapeDtypeStruct).parameters),
              None)


def _variance(aval: Any) -> Any:
    """``aval``'s manual-axis type where it varies over (or reduces along) a manual axis, else None."""
    mat = getattr(aval, "mat", None) or getattr(aval, "manual_axis_type", None)  # an aval's, or a struct's
    if mat is not None:
        return None if getattr(mat, "empty", True) else mat
    vma = getattr(aval, "vma", None)
    return vma if vma else None


def abstract_input(aval: Any, sharding: Any = None, weak_type: bool | None = None) -> jax.ShapeDtypeStruct:
    """The ``jax.ShapeDtypeStruct`` of ``aval`` (with ``sharding``; ``weak_type`` default ``aval``'s) to trace a
    program from, keeping the manual axes it varies over inside ``shard_map`` (module docstring)."""
    weak = getattr(aval, "weak_type", False) if weak_type is None else weak_type
    variance = _variance(aval) if _FIELD is not None else None
    if variance is None:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding, weak_type=weak)
    if _FIELD == "vma" and not isinstance(variance, (set, frozenset)):
        variance = frozenset(getattr(variance, "varying", ()))
    # The variance belongs to the manual mesh the aval's own sharding names.
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=getattr(aval, "sharding", sharding), weak_type=weak,
                                **{_FIELD: variance})


def all_manual(mesh_or_sharding: Any) -> bool:
    """Whether a mesh (or a sharding's mesh) has only manual axes: the inside of a ``shard_map`` over all of them,
    where each value is one device's and nothing is placed."""
    mesh = getattr(mesh_or_sharding, "mesh", mesh_or_sharding)
    types = getattr(mesh, "axis_types", None)
    manual = getattr(jax.sharding.AxisType, "Manual", None)
    return bool(types) and manual is not None and all(t == manual for t in types)


def in_manual_context() -> bool:
    """Whether tracing is inside a ``shard_map``: the context mesh has a manual axis (its programs are per-device
    pieces of the ``shard_map``'s, which compile only as part of it)."""
    manual = getattr(jax.sharding.AxisType, "Manual", None)
    types = getattr(jax.sharding.get_abstract_mesh(), "axis_types", None) or ()
    return manual is not None and any(t == manual for t in types)


def vary_like(x: Any, aval: Any) -> Any:
    """``x`` (a buffer made invariant, ``jnp.zeros``) varying over the manual axes ``aval`` varies over, so that a
    loop carry of rows of ``aval`` keeps one type inside ``shard_map``; ``x`` itself elsewhere."""
    variance = _variance(aval)
    axes = tuple(sorted(getattr(variance, "varying", variance) or ())) if variance is not None else ()
    if not axes:
        return x
    have = _variance(jax.typeof(x))
    missing = tuple(a for a in axes if a not in set(getattr(have, "varying", have) or ()))
    return jax.lax.pcast(x, missing, to="varying") if missing else x
