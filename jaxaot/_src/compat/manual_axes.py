"""Meshes in abstract inputs: ``shard_map``'s manual axes a value varies over, and the mesh of devices in context.

Inside ``jax.shard_map`` (``check_vma=True``) each value's type says which manual axes it varies over: a
replicated parameter varies over none, a sharded batch over the batch axis. A program traced from inputs of
another variance does not replay there (``w * x`` with ``w`` replicated needs a ``pvary`` the trace did not
insert). :func:`abstract_input` keeps an aval's variance in the ``jax.ShapeDtypeStruct`` a program is traced
from, so the trace inserts what JAX would; outside ``shard_map`` it is the plain struct.

On a mesh with ``Explicit`` axes the type holds the sharding instead (``float32[8@x,4]``): a program traced from
a replicated struct does not take sharded values. :func:`abstract_input` keeps that sharding too, and
:func:`vary_like` shards a buffer of rows as its rows are. :func:`eval_closed_varying` runs a jaxpr on inputs that
vary over more axes than it was traced for. :func:`device_context` is ``jax.set_mesh``'s devices.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import jax
from jax._src import config as _config
from jax._src import core as _core
from jax._src import mesh as _mesh_lib

__all__ = ["abstract_input", "all_manual", "device_context", "eval_closed_varying", "in_manual_context", "on_one_mesh",
           "reshaped_aval", "varying_cast_axes", "vary_like", "vary_over"]

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
        sharding = _explicit_sharding(aval) if sharding is None else sharding
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


def _explicit_sharding(aval: Any) -> Any:
    """``aval``'s sharding where its mesh has an ``Explicit`` axis (the sharding is then part of its type), else
    None."""
    sharding = getattr(aval, "sharding", None)
    explicit = getattr(jax.sharding.AxisType, "Explicit", None)
    types = getattr(getattr(sharding, "mesh", None), "axis_types", None) or ()
    return sharding if explicit is not None and explicit in types else None


def reshaped_aval(aval: Any, shape: tuple[int, ...]) -> Any:
    """``aval`` with ``shape``: leading axes added to it (a stack of rows of ``aval``) or dropped (a row of a stack),
    its variance kept and its sharding spec shifted alike, the added axes unsharded."""
    sharding = _explicit_sharding(aval)
    if sharding is None:
        return aval.update(shape=tuple(shape))
    spec = (*sharding.spec, *(None,) * (len(aval.shape) - len(sharding.spec)))
    extra = len(shape) - len(aval.shape)
    spec = (None,) * extra + spec if extra >= 0 else spec[-extra:]
    return aval.update(shape=tuple(shape), sharding=sharding.update(spec=jax.sharding.PartitionSpec(*spec)))


def on_one_mesh(*xs: Any) -> tuple[Any, ...]:
    """``xs`` typed on one mesh, for an op that demands equal shardings (``dynamic_update_slice``): under a context
    mesh with ``Explicit`` axes, a constant made from NumPy is typed on the empty mesh while values computed there
    are typed on the context mesh. Each value on the empty mesh is moved onto the context mesh, its spec kept."""
    context = jax.sharding.get_abstract_mesh()
    explicit = getattr(jax.sharding.AxisType, "Explicit", None)
    if explicit is None or explicit not in (getattr(context, "axis_types", None) or ()):
        return xs
    return tuple(jax.sharding.reshard(x, jax.typeof(x).sharding.spec) if jax.typeof(x).sharding.mesh.empty else x
                 for x in xs)


def vary_like(x: Any, aval: Any) -> Any:
    """``x`` (a buffer of rows of ``aval`` made invariant and unsharded, ``jnp.zeros``) typed as its rows are, so
    that a loop carry of rows of ``aval`` keeps one type: varying over the manual axes ``aval`` varies over inside
    ``shard_map``, and sharded as ``aval`` along its ``Explicit`` axes (the leading axes unsharded); ``x`` itself
    elsewhere."""
    sharding = _explicit_sharding(aval)
    if sharding is not None:
        lead = (None,) * (jax.numpy.ndim(x) - len(aval.shape))
        spec = jax.sharding.PartitionSpec(*lead, *sharding.spec, *(None,) * (len(aval.shape) - len(sharding.spec)))
        if jax.typeof(x).sharding.spec != spec:  # on aval's own mesh: no context mesh needed (jax.set_mesh)
            x = jax.sharding.reshard(x, sharding.update(spec=spec))
    variance = _variance(aval)
    axes = tuple(sorted(getattr(variance, "varying", variance) or ())) if variance is not None else ()
    if not axes:
        return x
    have = _variance(jax.typeof(x))
    missing = tuple(a for a in axes if a not in set(getattr(have, "varying", have) or ()))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def varying_cast_axes(eqn: Any) -> tuple[str, ...]:
    """The manual axes an eqn casting its operand from invariant to varying adds (``pvary``, or ``pcast`` to
    varying), else ``()``: the cast ``shard_map`` inserts where a replicated value meets a sharded one."""
    name, params = eqn.primitive.name, eqn.params
    if name == "pcast" and str(params.get("to", "")).lower().split(".")[-1] != "varying":
        return ()
    if name not in ("pvary", "pcast"):
        return ()
    axes = params.get("axes", params.get("axis_name", ()))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def vary_over(x: Any, axes: tuple[str, ...]) -> Any:
    """``x`` cast to vary over the manual ``axes`` it does not vary over yet (``jax.lax.pcast`` to varying)."""
    have = _variance(jax.typeof(x))
    missing = tuple(a for a in axes if a not in set(getattr(have, "varying", have) or ()))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _varying_axes(x: Any) -> frozenset:
    """The manual axes a value (or an aval) varies over."""
    have = _variance(x if isinstance(x, _core.AbstractValue) else jax.typeof(x))
    return frozenset(getattr(have, "varying", have) or ())


def eval_closed_varying(closed: Any, *args: Any) -> list:
    """Evaluate a closed jaxpr on inputs that may vary over more manual axes than it was traced for (inside
    ``shard_map``: a carry that a per-lane select made varying). An eqn whose operands vary as traced is bound as
    it is. Otherwise a cast to varying (``pvary``) adds only the axes its operand does not vary over yet, a ``jit``
    call is inlined and a ``lax.cond`` retraced, their jaxprs evaluated alike, and another eqn's operands are cast
    to vary over all the axes one of them varies over (what ``jax.numpy`` inserts when it traces). Other
    higher-order eqns (scans, loops, custom derivatives) are bound as they are, and refuse such operands."""
    jaxpr = getattr(closed, "jaxpr", closed)
    env: dict = dict(zip(jaxpr.constvars, getattr(closed, "consts", ())))
    env.update(zip(jaxpr.invars, args))

    def read(v: Any) -> Any:
        return v.val if isinstance(v, _core.Literal) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = None
        if any(_varying_axes(x) != _varying_axes(v.aval) for x, v in zip(invals, eqn.invars)):
            axes = varying_cast_axes(eqn)
            name, params = eqn.primitive.name, eqn.params
            if axes and len(invals) == 1:
                outs = [vary_over(invals[0], axes)]
            elif name in ("jit", "pjit") and isinstance(params.get("jaxpr"), _core.ClosedJaxpr):
                outs = eval_closed_varying(params["jaxpr"], *invals)
            elif name == "cond" and "branches" in params:
                branches = [lambda *a, b=b: eval_closed_varying(b, *a) for b in params["branches"]]
                outs = list(jax.lax.switch(invals[0], branches, *invals[1:]))
            elif not any(isinstance(p, (_core.Jaxpr, _core.ClosedJaxpr)) or (isinstance(p, (tuple, list)) and any(
                    isinstance(q, (_core.Jaxpr, _core.ClosedJaxpr)) for q in p)) for p in params.values()):
                union = tuple(sorted(frozenset().union(*(_varying_axes(x) for x in invals))))
                invals = [vary_over(x, union) for x in invals]
        if outs is None:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
        env.update((v, x) for v, x in zip(eqn.outvars, outs) if not isinstance(v, _core.DropVar))
    return [read(v) for v in jaxpr.outvars]


def device_context() -> Any:
    """The mesh of devices ``jax.set_mesh`` entered, or None: in ``jit``'s cache key, not in ``trace_context()``
    (two meshes of one shape on other devices have one abstract mesh)."""
    mesh = _concrete_mesh() if _concrete_mesh is not None else getattr(_config, "device_context", _NONE).value
    return None if mesh is None or getattr(mesh, "empty", False) else mesh


_concrete_mesh = getattr(_mesh_lib, "get_concrete_mesh", None)
_NONE = types.SimpleNamespace(value=None)
