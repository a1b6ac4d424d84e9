"""JAX internals for the stages: jaxprs, eqns, executables, tracers, dtypes (part of :mod:`jaxaot._src.compat`).

Every use of ``jax._src``, ``jax.extend`` or ``jax.interpreters`` lives here, so a
JAX upgrade (0.10 -> 0.11 merged ``Jaxpr`` and ``ClosedJaxpr``, for instance) is a
change to this file alone. The rest of jaxaot talks to jaxprs only through the
small functions below.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import source_info_util as _siu
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir  # noqa: F401  (re-exported)
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax import lax as _lax_internal

Var = _core.Var
Literal = _core.Literal
DropVar = _core.DropVar
JaxprEqn = _core.JaxprEqn
Primitive = _core.Primitive
Tracer = _core.Tracer
ClosedJaxpr = _core.ClosedJaxpr
from jax._src.array import ArrayImpl  # noqa: E402  (the concrete jax.Array class)
Jaxpr = _core.Jaxpr

try:  # the jit primitive was renamed pjit_p -> jit_p
    from jax._src.pjit import jit_p as _jit_p
except ImportError:  # pragma: no cover - older jax
    from jax._src.pjit import pjit_p as _jit_p
jit_p = _jit_p
closed_call_p = _core.closed_call_p

from jax._src import config as _config  # noqa: E402

#: ``trace_context()``: the configuration JAX's own tracing caches are keyed by (x64, matmul precision, dtype and
#: rank promotion, the mesh in context, ...), hashable (JAX's own function: it is read on every call and every
#: recorded operation).
trace_context = _config.trace_context


def pin_sharding(x: Any, sharding: Any) -> Any:
    """``x`` placed as ``sharding`` inside a traced program: ``with_sharding_constraint``, or ``reshard`` on a mesh
    with ``Explicit`` axes where the sharding names no other (``with_sharding_constraint`` only asserts there)."""
    spec, explicit = getattr(sharding, "spec", None) or (), explicit_axes(getattr(sharding, "mesh", None))
    if explicit and {n for e in spec if e is not None for n in (e if isinstance(e, tuple) else (e,))} <= explicit:
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def explicit_axes(mesh: Any) -> frozenset:
    """The names of ``mesh``'s ``Explicit`` axes (none for None, or a JAX without axis types)."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    types = zip(getattr(mesh, "axis_names", ()) or (), getattr(mesh, "axis_types", ()) or ())
    return frozenset(n for n, t in types if explicit is not None and t == explicit)


def jit_disabled() -> bool:
    """Whether ``jax.disable_jit()`` is in effect: ``jit`` then runs a function's Python op by op."""
    return bool(_config.disable_jit.value)


def config_changes(old: tuple, new: tuple) -> list[str]:
    """The names of the settings in which two :func:`trace_context` values differ (``"jax_enable_x64"``), or
    their positions where this JAX does not name them."""
    try:
        names = tuple(_config.trace_context_names())
    except Exception:  # noqa: BLE001 - a JAX without the names
        names = ()
    if len(names) != len(old) or len(old) != len(new):
        names = tuple(f"setting {i}" for i in range(max(len(old), len(new))))
    return [n for n, a, b in zip(names, old, new) if a is not b and a != b]


from jax._src import custom_derivatives as _cd  # noqa: E402

custom_jvp_call_p = _cd.custom_jvp_call_p
custom_vjp_call_p = _cd.custom_vjp_call_p

#: Primitives whose body is a plain call that can be inlined into the caller.
INLINABLE_CALLS = frozenset(p for p in (jit_p, closed_call_p) if p is not None)


# --------------------------------------------------------------------------- jaxprs
def jaxpr_of(closed: Any) -> Any:
    """The open jaxpr inside a closed one (identity where the two are merged)."""
    return getattr(closed, "jaxpr", closed)


def consts_of(closed: Any) -> list:
    return list(getattr(closed, "consts", ()))


def make_closed_jaxpr(
    constvars: Sequence[Any],
    invars: Sequence[Any],
    outvars: Sequence[Any],
    eqns: Sequence[Any],
    consts: Sequence[Any],
) -> Any:
    """Build a closed jaxpr from parts; the effects are those of ``eqns``."""
    effects = _core.join_effects(*(e.effects for e in eqns)) if eqns else _core.no_effects
    # Input effects refer to invars by position; the programs jaxaot builds never
    # thread refs through their signature, so keeping the plain effects is enough.
    effects = frozenset(e for e in effects if not isinstance(e, _effects.JaxprInputEffect))
    debug = _core.DebugInfo("jaxaot", "<jaxaot program>", None, None)
    jaxpr = _core.Jaxpr(list(constvars), list(invars), list(outvars), list(eqns), effects, debug)
    return _core.ClosedJaxpr(jaxpr, list(consts))


def close(jaxpr: Any, consts: Sequence[Any] = ()) -> Any:
    return _core.ClosedJaxpr(jaxpr, list(consts))


def eval_closed(closed: Any, *args: Any) -> list:
    """Evaluate a closed jaxpr on arrays or tracers (inlines it into any trace)."""
    return _core.eval_jaxpr(jaxpr_of(closed), consts_of(closed), *args)


def check_jaxpr(closed: Any) -> None:
    _core.check_jaxpr(jaxpr_of(closed))


def is_literal(x: Any) -> bool:
    return isinstance(x, _core.Literal)


def is_drop_var(x: Any) -> bool:
    return isinstance(x, _core.DropVar)


def literal(val: Any, aval: Any) -> Any:
    return _core.Literal(val, aval)


def bind_eqn(eqn: Any, invals: Sequence[Any], params: dict | None = None, traceback: Any = None) -> list:
    """Re-bind one eqn on new inputs in the current trace, keeping its source info (its ``traceback`` replaced
    where given). ``params``, when given, replace the eqn's own (rewritten loop bodies, say)."""
    bind_params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
    name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
    with _siu.user_context(traceback or eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def eqn_source(eqn: Any) -> str:
    """``file:line (function)`` of the user code that produced ``eqn``."""
    try:
        return _siu.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - source info is best effort
        return "<unknown>"


def scan_counts(params: dict) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a scan eqn's params.

    jax 0.11 replaced the two counts with flat-tree params ``ft_in``/``ft_out``.
    """
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry = params["ft_in"].unpack()[:2]
    return len(consts), len(carry)


def eqn_name_stack(eqn: Any) -> str:
    """The eqn's name stack (``jax.named_scope`` nesting) as text."""
    return str(eqn.source_info.name_stack)


def outside_name_scopes() -> Any:
    """A context whose eqns carry no ``jax.named_scope`` name (a backward check that belongs to the forward)."""
    return _siu.reset_name_stack()


def eqn_subjaxprs(eqn: Any) -> list:
    """Closed jaxprs held in an eqn's params (bodies of calls, loops, conds)."""
    return list(_core.jaxprs_in_params(eqn.params))


def iter_eqns(closed: Any, *, depth: int = 0, with_depth: bool = False):
    """Every eqn of a (closed) jaxpr, then of the jaxprs in its params, depth first.

    The one recursive walker of jaxaot. ``with_depth`` yields ``(eqn, depth)``
    pairs, depth 0 being the top-level program.
    """
    for eqn in jaxpr_of(closed).eqns:
        yield (eqn, depth) if with_depth else eqn
        for sub in _core.jaxprs_in_params(eqn.params):
            yield from iter_eqns(sub, depth=depth + 1, with_depth=with_depth)


def map_subjaxprs(eqn: Any, fn: Any) -> dict:
    """``eqn.params`` with every closed jaxpr in them (loop and cond bodies) replaced by ``fn(jaxpr)``.

    Values that hold a jaxpr only indirectly (thunks, rule callables) are kept.
    """
    def one(v):
        if isinstance(v, _core.ClosedJaxpr):
            return fn(v)
        if isinstance(v, tuple) and v and all(isinstance(x, _core.ClosedJaxpr) for x in v):
            return tuple(fn(x) for x in v)
        return v

    return {k: one(v) for k, v in eqn.params.items()}


def has_jvp_rule(prim: Any) -> bool:
    return (
        prim in _ad.primitive_jvps
        or prim in getattr(_ad, "primitive_linearizations", {})
        or prim in INLINABLE_CALLS
        or getattr(prim, "call_primitive", False)
        or getattr(prim, "map_primitive", False)
    )


def is_host_callback(eqn: Any) -> bool:
    """Whether ``eqn`` runs Python on the host (``jax.debug.print`` / ``callback``, io/pure callbacks)."""
    name = str(eqn.primitive)
    return "callback" in name or name == "debug_print"


def is_effectful(eqn: Any) -> bool:
    return bool(eqn.effects)


# --------------------------------------------------------------------------- compiled executables
from jax.experimental import serialize_executable as _serialize_executable  # noqa: E402


def serialize_executable(compiled: Any) -> tuple[bytes, Any, Any]:
    """``(bytes, in_tree, out_tree)`` of a ``jax.stages.Compiled`` (raises where the backend cannot)."""
    return _serialize_executable.serialize(compiled)


def deserialize_executable(blob: bytes, in_tree: Any, out_tree: Any, device_ids: Any = None) -> Any:
    """The ``jax.stages.Compiled`` that :func:`serialize_executable` wrote, loaded onto the default backend.

    ``device_ids``: the devices it runs on, in order (default: every device of the backend).
    """
    devices = None
    if device_ids is not None:
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in device_ids]
    return _serialize_executable.deserialize_and_load(blob, in_tree, out_tree, execution_devices=devices)


def executable_device_ids(exe: Any) -> list[int]:
    """The ids of the devices a ``jax.stages.Compiled`` runs on, in its device-assignment order: every process's
    under ``jax.distributed`` (its shardings' assignment, the program's; a process's own devices are a part)."""
    for sharding in jax.tree_util.tree_leaves((exe.input_shardings, exe.output_shardings)):
        if getattr(sharding, "_device_assignment", None):
            return [d.id for d in sharding._device_assignment]
    return [d.id for d in exe.runtime_executable().local_devices()]


# --------------------------------------------------------------------------- tracers
def is_tracer(x: Any) -> bool:
    return isinstance(x, _core.Tracer)


def current_trace() -> Any:
    """The trace JAX is tracing into right now (an eval trace when not tracing)."""
    return _core.trace_ctx.trace


#: Transformations that run their operations through the trace beneath them (``jax.jvp``, ``jax.grad``, ``vmap``).
_PASSING_TRACES = tuple(t for t in (getattr(_ad, "JVPTrace", None), getattr(_ad, "LinearizeTrace", None),
                                    getattr(_batching, "BatchTrace", None)) if t is not None)


def stages_operations() -> bool:
    """Whether an operation bound now is staged into a program (``jit``, ``make_jaxpr``, a loop's body) at some
    level of the transformations in effect, rather than run: ``jax.grad`` or ``jax.vmap`` run eagerly when no
    staging trace is beneath them."""
    trace = _core.trace_ctx.trace
    while not isinstance(trace, _core.EvalTrace):
        if not isinstance(trace, _PASSING_TRACES):
            return True
        trace = trace.parent_trace
    return False


def trace_of(x: Any) -> Any:
    """The trace a tracer belongs to; None for a concrete value."""
    return x._trace if isinstance(x, _core.Tracer) else None


def is_forward_mode_tracer(x: Any) -> bool:
    """True for the tracers of ``jax.jvp``, not ``jax.grad``'s linearize (``jax.custom_vjp`` refuses forward mode)."""
    return isinstance(x, _ad.JVPTracer)


def is_batch_tracer(x: Any) -> bool:
    """True for the tracers of ``jax.vmap``."""
    return isinstance(x, _batching.BatchTracer)


def reverse_mode_mask(leaves: Sequence[Any]) -> tuple[bool, ...]:
    """Which ``leaves`` the reverse-mode transformation tracing now differentiates: under ``jax.grad`` or
    ``jax.vjp`` (inside ``jit`` too), its own tracers, not values of the traces beneath it (the data a
    ``jit(value_and_grad(f))`` step is given); under any other trace, every tracer (the safe answer)."""
    trace = _core.trace_ctx.trace
    linearize = getattr(_ad, "LinearizeTrace", None)
    if linearize is not None and type(trace) is linearize:
        return tuple(type(x) is _ad.LinearizeTracer and x._trace is trace for x in leaves)
    return tuple(isinstance(x, _core.Tracer) for x in leaves)


def is_differentiated(x: Any) -> bool:
    """Whether ``x`` is a tracer of ``jax.jvp``, ``jax.grad`` or ``jax.vjp``: a value being differentiated."""
    return isinstance(x, (_ad.JVPTracer, _ad.LinearizeTracer))


def concrete_primal(x: Any) -> Any:
    """The concrete array under an eager ``jax.grad``/``jax.vjp``/``jax.jvp`` tracer, else None.

    Eager differentiation traces with the values at hand: the runtime reads
    their shardings, since the executables will run on them.
    """
    while isinstance(x, (_ad.JVPTracer, _ad.LinearizeTracer)):
        x = x.primal
    return x if isinstance(x, jax.Array) and not isinstance(x, Tracer) else None


def shaped_abstractify(x: Any) -> Any:
    """The aval of an array-like or ``jax.ShapeDtypeStruct``."""
    return _core.shaped_abstractify(x)


def single_device_of(sharding: Any) -> Any:
    """The device of a single-device sharding, else None (fast: no set built)."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return getattr(sharding, "_device", None) or next(iter(sharding.device_set))
    return None


# --------------------------------------------------------------------------- dtypes
float0 = jax.dtypes.float0


def is_inexact(dtype: Any) -> bool:
    return bool(jax.dtypes.issubdtype(dtype, np.inexact))


def typed_as(x: Any, aval: Any) -> Any:
    """``x`` with the weak type of ``aval`` (its dtype already ``aval``'s): a rule whose loops keep strong types
    hands back what JAX would (a gradient of a Python float is weakly typed)."""
    if not getattr(aval, "weak_type", False):
        return x
    return _lax_internal._convert_element_type(x, aval.dtype, weak_type=True)


def zeros_float0(shape: Sequence[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=float0)


# ---------------------------------------------------------------- min-cut support
def eqn_user_context(eqn: Any) -> Any:
    """A context in which new eqns get ``eqn``'s source info (user file:line, name stack)."""
    name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
    return _siu.user_context(eqn.source_info.traceback, name_stack=name_stack)




# --------------------------------------------------------------------------- debug_nans
#: What a compiled executable raises under ``jax.debug_nans``/``debug_infs`` when an
#: output is NaN/Inf; ``jax.jit`` catches it and re-runs op by op to name the culprit.
InternalFloatingPointError = getattr(__import__("jax._src.api_util", fromlist=["x"]), "InternalFloatingPointError",
                                     FloatingPointError)


# ---------------------------------------------------------------- checkpoint policies
# jaxaot._src.partition.mincut.policy reads jax.checkpoint's own rules (partial_eval_jaxpr_custom_rules above).
from jax._src import ad_checkpoint as _ad_checkpoint  # noqa: E402


def saved_residuals(fn: Any, *args: Any, **kwargs: Any) -> list:
    """``(aval, description)`` per value ``jax.vjp(fn, *args)`` saves, as ``print_saved_residuals`` lists them."""
    return list(_ad_checkpoint.saved_residuals(fn, *args, **kwargs))


from jax.experimental import layout as _layout  # noqa: E402


def pin_layout(x: Any, major_to_minor: tuple[int, ...] | None = None) -> Any:
    """``x`` constrained to the layout with dimensions ``major_to_minor`` (default: row-major)
    inside a jitted program.

    A value that crosses an executable boundary is row-major; inside one program
    XLA may choose another layout for it (and transpose around it).
    """
    if getattr(x, "ndim", 0) < 2:
        return x
    order = tuple(range(x.ndim)) if major_to_minor is None else tuple(major_to_minor)
    return _layout.with_layout_constraint(x, _layout.Layout(major_to_minor=order))


from jax._src import dispatch as _dispatch  # noqa: E402

#: The ``jax.monitoring`` duration events of one ``jax.jit`` compile, by stage: the trace to a jaxpr,
#: the lowering to MLIR, XLA's compile (each event's ``fun_name`` keyword names the function).
JIT_COMPILE_EVENTS = {
    "trace": getattr(_dispatch, "JAXPR_TRACE_EVENT", "/jax/core/compile/jaxpr_trace_duration"),
    "lower": getattr(_dispatch, "JAXPR_TO_MLIR_MODULE_EVENT", "/jax/core/compile/jaxpr_to_mlir_module_duration"),
    "compile": getattr(_dispatch, "BACKEND_COMPILE_EVENT", "/jax/core/compile/backend_compile_duration"),
}


_TO_NUMPY = getattr(ArrayImpl, "_single_device_array_to_np_array_did_copy", None)


def host_value(x: Any) -> np.ndarray:
    """``np.asarray(x)`` of a device array, fetched by JAX's own direct path when the array is whole on each
    of its devices (what ``np.asarray`` does, less the Python around it: a replayed step reads its
    looked-at values so)."""
    if (_TO_NUMPY is not None and type(x) is ArrayImpl and x._npy_value is None and x.is_fully_replicated
            and x.sharding.has_addressable_devices):
        out = _TO_NUMPY(x)  # (the array, whether it was copied)
        return out[0] if type(out) is tuple else out
    return np.asarray(x)


#: What the rest of jaxaot uses (``C.<name>``); ``Primitive``, ``check_jaxpr`` and
#: ``saved_residuals`` serve the tests.
__all__ = [
    "is_differentiated", "outside_name_scopes", "typed_as", "ArrayImpl", "ClosedJaxpr", "INLINABLE_CALLS",
    "InternalFloatingPointError", "JIT_COMPILE_EVENTS", "Jaxpr", "Primitive", "Tracer", "bind_eqn", "check_jaxpr", "close", "concrete_primal", "consts_of", "current_trace", "deserialize_executable",
    "eqn_name_stack", "eqn_source", "eqn_subjaxprs", "eqn_user_context", "eval_closed",
    "executable_device_ids", "float0", "has_jvp_rule", "host_value", "is_batch_tracer", "is_drop_var", "is_effectful",
    "is_forward_mode_tracer", "is_host_callback", "is_inexact", "is_literal", "is_tracer", "iter_eqns", "jaxpr_of",
    "make_closed_jaxpr", "map_subjaxprs", "pin_layout", "saved_residuals", "scan_counts", "serialize_executable", "shaped_abstractify",
    "reverse_mode_mask", "single_device_of", "stages_operations", "trace_context", "trace_of", "zeros_float0",
    "config_changes", "jit_disabled", "pin_sharding", "explicit_axes",
]
