"""The one place where jaxaot touches JAX internals.

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
from jax._src.interpreters import batching as _batching  # noqa: F401  (re-exported)
from jax._src.interpreters import mlir as _mlir  # noqa: F401  (re-exported)
from jax._src.interpreters import partial_eval as _pe

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


def bind_eqn(eqn: Any, invals: Sequence[Any], params: dict | None = None) -> list:
    """Re-bind one eqn on new inputs in the current trace, keeping its source info.

    ``params``, when given, replace the eqn's own (rewritten loop bodies, say).
    """
    bind_params = eqn.primitive.get_bind_params(eqn.params if params is None else params)
    name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
    with _siu.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
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
    """The ids of the devices a ``jax.stages.Compiled`` runs on, in its device-assignment order."""
    return [d.id for d in exe.runtime_executable().local_devices()]


# --------------------------------------------------------------------------- tracers
def is_tracer(x: Any) -> bool:
    return isinstance(x, _core.Tracer)


def current_trace() -> Any:
    """The trace JAX is tracing into right now (an eval trace when not tracing)."""
    return _core.trace_ctx.trace


def trace_of(x: Any) -> Any:
    """The trace a tracer belongs to; None for a concrete value."""
    return x._trace if isinstance(x, _core.Tracer) else None


def is_forward_mode_tracer(x: Any) -> bool:
    """True for the tracers of ``jax.jvp`` (not those of ``jax.grad``'s linearize).

    ``jax.custom_vjp`` refuses forward mode, so the runtime inlines the program
    instead when it sees one of these.
    """
    return isinstance(x, _ad.JVPTracer)


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


# --------------------------------------------------------------------------- symbolic dims
def dim_value(d: Any, symbol_value: int) -> int:
    """``d`` as an int; a symbolic dimension (``16*b``) is evaluated with every symbol at ``symbol_value``."""
    if not jax.export.is_symbolic_dim(d):
        return int(d)
    return int(d._evaluate({name: symbol_value for name in d._get_vars()}))


# --------------------------------------------------------------------------- dtypes
float0 = jax.dtypes.float0


def is_inexact(dtype: Any) -> bool:
    return bool(jax.dtypes.issubdtype(dtype, np.inexact))


def zeros_float0(shape: Sequence[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=float0)


# ---------------------------------------------------------------- min-cut support
def eqn_user_context(eqn: Any) -> Any:
    """A context in which new eqns get ``eqn``'s source info (user file:line, name stack)."""
    name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
    return _siu.user_context(eqn.source_info.traceback, name_stack=name_stack)


# ---------------- while-loop primitive support
# Everything jaxaot.loops needs from JAX's internals.
# Names are looked up with getattr where JAX has moved them between versions.
from jax._src import ad_util as _ad_util  # noqa: E402
from jax._src import dispatch as _dispatch  # noqa: E402
from jax._src.util import merge_lists, split_list  # noqa: E402,F401  (re-exported)

Zero = _ad_util.Zero
UndefinedPrimal = _ad.UndefinedPrimal
ShapedArray = _core.ShapedArray
is_undefined_primal = _ad.is_undefined_primal
instantiate_zeros = _ad.instantiate_zeros
primitive_jvps = _ad.primitive_jvps
primitive_transposes = _ad.primitive_transposes
custom_partial_eval_rules = _pe.custom_partial_eval_rules
partial_eval_jaxpr_custom_rules = _pe.partial_eval_jaxpr_custom_rules
dce_rules = _pe.dce_rules
primitive_batchers = _batching.primitive_batchers
#: Batching rules called as ``rule(axis_data, args, dims, **params)`` (they see the axis name).
fancy_primitive_batchers = _batching.fancy_primitive_batchers

# JAX's own loops, bound once at import: jaxaot never reads the public
# ``jax.lax.while_loop`` / ``fori_loop`` attributes at run time, so a user who
# swaps ``jaxaot.while_loop`` into them (``jaxaot.patch_while_loop``) gets no recursion.
from jax._src.lax.control_flow import loops as _lax_loops  # noqa: E402

lax_while_loop = _lax_loops.while_loop
lax_fori_loop = _lax_loops.fori_loop


def vmap_like(fn: Any, axis_data: Any, in_axes: Any, out_axes: Any = 0) -> Any:
    """``jax.vmap(fn)`` over the axis a batching rule was called for: same size, and
    the same name, so ``lax.axis_index`` and collectives in ``fn`` see that axis."""
    name = getattr(axis_data, "name", None)
    if name is _core.no_axis_name:
        name = None
    return jax.vmap(fn, in_axes=in_axes, out_axes=out_axes, axis_name=name,
                    axis_size=getattr(axis_data, "size", None),
                    spmd_axis_name=getattr(axis_data, "spmd_name", None))


def batched_outputs(closed: Any, axis_data: Any, in_batched: Sequence[bool]) -> list[bool]:
    """Which outputs of ``closed`` vmap batches when ``in_batched`` inputs are (named
    axes included: ``lax.axis_index`` batches an output no batched input reaches)."""
    return list(_batching.batch_jaxpr(closed, axis_data, list(in_batched), False)[1])


register_lowering = _mlir.register_lowering
lower_fun = _mlir.lower_fun
JaxprTracer = _pe.JaxprTracer
PartialVal = _pe.PartialVal


def new_loop_primitive(name: str) -> Any:
    """A multiple-results primitive whose impl compiles its MLIR lowering."""
    prim = _core.Primitive(name)
    prim.multiple_results = True
    prim.def_impl(lambda *args, **params: _dispatch.apply_primitive(prim, *args, **params))
    return prim


def in_avals_of(closed: Any) -> list:
    return list(closed.in_avals)


def out_avals_of(closed: Any) -> list:
    return list(closed.out_avals)


def effects_of(closed: Any) -> Any:
    return closed.effects


def join_effects(*effs: Any) -> Any:
    return _core.join_effects(*effs)


def hoist_consts(closed: Any) -> tuple[Any, list]:
    """``closed`` with its consts turned into leading inputs, and those consts.

    This is closure conversion: tracers a traced function closed over become
    ordinary operands of the primitive that uses the jaxpr.
    """
    consts = consts_of(closed)
    jaxpr = _pe.convert_constvars_jaxpr(jaxpr_of(closed))
    return close(jaxpr, []), consts


def jvp_jaxpr(closed: Any, nonzeros: Sequence[bool], instantiate: Sequence[bool]) -> tuple[Any, list]:
    """``(jaxpr, nonzeros_out)``: binders ``[primals, nz tangents] -> [primals, nz tangents]``."""
    return _ad.jvp_jaxpr(closed, list(nonzeros), list(instantiate))


def partial_eval_jaxpr_nounits(closed: Any, unknowns: Sequence[bool], instantiate: Any):
    """``(known, unknown, out_unknowns, residual_avals)`` split by data dependence."""
    return _pe.partial_eval_jaxpr_nounits(closed, list(unknowns), instantiate)


def dce_closed(closed: Any, used_outputs: Sequence[bool], instantiate: Any = False) -> tuple[Any, list]:
    """Dead-code-eliminate a closed jaxpr: ``(new closed jaxpr, used_inputs)``."""
    jaxpr, used = _pe.dce_jaxpr(jaxpr_of(closed), list(used_outputs), instantiate)
    return close(jaxpr, consts_of(closed)), list(used)


def has_effects(eqn: Any) -> bool:
    return _pe.has_effects(eqn)


def backward_pass_closed(closed: Any, primals_in: Sequence[Any], cts_in: Sequence[Any]) -> list:
    """Transpose a linear closed jaxpr: cotangents for every input (Zero if none)."""
    return list(_ad.backward_pass(jaxpr_of(closed), False, consts_of(closed), list(primals_in), list(cts_in)))


def new_eqn(invars: Sequence[Any], outvars: Sequence[Any], prim: Any, params: dict, effs: Any, like: Any) -> Any:
    """A new jaxpr eqn with the source info and context of the eqn ``like``."""
    return _core.new_jaxpr_eqn(list(invars), list(outvars), prim, params, effs, like.source_info, like.ctx)


def stage_unknown_eqn(trace: Any, prim: Any, in_tracers: Sequence[Any], out_avals: Sequence[Any],
                      params: dict, effs: Any) -> list:
    """Record ``prim(*in_tracers)`` as an unknown eqn of a partial-eval trace."""
    in_tracers = [trace.instantiate_const(trace.to_jaxpr_tracer(t)) for t in in_tracers]
    out_tracers = [_pe.JaxprTracer(trace, _pe.PartialVal.unknown(a), None) for a in out_avals]
    name_stack = _siu.current_name_stack()[len(trace.name_stack):]
    source = _siu.current().replace(name_stack=name_stack)
    eqn = _pe.new_eqn_recipe(trace, in_tracers, out_tracers, prim, params, effs, source)
    for t in out_tracers:
        t.recipe = eqn
    return out_tracers


def is_known_pval(tracer: Any) -> bool:
    return tracer.pval.is_known()


def known_value(tracer: Any) -> Any:
    return tracer.pval.get_known()


def is_jaxpr_var(x: Any) -> bool:
    return isinstance(x, _core.Var) and not isinstance(x, _core.DropVar)


# --------------------------------------------------------------------------- debug_nans
#: What a compiled executable raises under ``jax.debug_nans``/``debug_infs`` when an
#: output is NaN/Inf; ``jax.jit`` catches it and re-runs op by op to name the culprit.
InternalFloatingPointError = getattr(__import__("jax._src.api_util", fromlist=["x"]), "InternalFloatingPointError",
                                     FloatingPointError)


# ---------------------------------------------------------------- checkpoint policies
# jaxaot.partition.policy reads jax.checkpoint's own rules (partial_eval_jaxpr_custom_rules above).
from jax._src import ad_checkpoint as _ad_checkpoint  # noqa: E402


def saved_residuals(fn: Any, *args: Any, **kwargs: Any) -> list:
    """``(aval, description)`` per value ``jax.vjp(fn, *args)`` saves, as ``print_saved_residuals`` lists them."""
    return list(_ad_checkpoint.saved_residuals(fn, *args, **kwargs))
