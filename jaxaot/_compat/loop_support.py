"""JAX internals for the while-loop primitives (:mod:`jaxaot.loops`).

Part of :mod:`jaxaot._compat`, which re-exports every name here. Names are looked up
with getattr where JAX has moved them between versions.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

from jaxaot._compat.core import close, consts_of, jaxpr_of

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


#: What the while-loop primitives (:mod:`jaxaot.loops`) and the tracing stage use (``C.<name>``).
__all__ = [
    "ShapedArray", "UndefinedPrimal", "Zero", "backward_pass_closed", "batched_outputs",
    "custom_partial_eval_rules", "dce_closed", "dce_rules", "effects_of", "fancy_primitive_batchers", "has_effects",
    "hoist_consts", "in_avals_of", "instantiate_zeros", "is_jaxpr_var", "is_known_pval", "is_undefined_primal",
    "join_effects", "jvp_jaxpr", "known_value", "lax_fori_loop", "lax_while_loop", "lower_fun", "merge_lists",
    "new_eqn", "new_loop_primitive", "out_avals_of", "partial_eval_jaxpr_custom_rules",
    "partial_eval_jaxpr_nounits", "primitive_jvps", "primitive_transposes", "register_lowering", "split_list",
    "stage_unknown_eqn", "vmap_like",
]
