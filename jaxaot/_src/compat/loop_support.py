"""JAX internals for the while-loop primitives (:mod:`jaxaot._src.loops`).

Part of :mod:`jaxaot._src.compat`, which re-exports every name here. Names are looked up
with getattr where JAX has moved them between versions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any, Iterator, Sequence

import jax
from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

from jaxaot._src.compat.core import close, consts_of, jaxpr_of

# The loops' own frames, and those of this glue to JAX's internals, are no user's: an equation a jaxaot loop makes
# points at the user's call, as one lax.scan makes does, in source info, residual tables and pictures.
for _sub in ("loops", "compat"):
    _siu.register_exclusion(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _sub) + os.sep)

# ---------------- while-loop primitive support
# Everything jaxaot._src.loops needs from JAX's internals.
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
# swaps ``jaxaot.loops.while_loop`` into them (``jaxaot.loops.patch_while_loop``) gets no recursion.
from jax._src.lax.control_flow import loops as _lax_loops  # noqa: E402

#: JAX's ``while`` primitive, which every ``lax.while_loop`` (public or internal, ``fori_loop`` with
#: dynamic bounds included) binds.
lax_while_p = _lax_loops.while_p
_JAX_BIND = type(lax_while_p).bind  # the class's bind, whatever an instance attribute says
_BYPASS = threading.local()


@contextlib.contextmanager
def jaxaot_own_loops() -> Iterator[None]:
    """jaxaot's own ``while`` binds (its lowerings run ``lax.while_loop``): never rewritten."""
    depth = getattr(_BYPASS, "depth", 0)
    _BYPASS.depth = depth + 1
    try:
        yield
    finally:
        _BYPASS.depth = depth


def in_jaxaot_own_loop() -> bool:
    return getattr(_BYPASS, "depth", 0) > 0


def lax_while_loop(*args: Any, **kwargs: Any) -> Any:
    with jaxaot_own_loops():
        return _lax_loops.while_loop(*args, **kwargs)


def lax_fori_loop(*args: Any, **kwargs: Any) -> Any:
    with jaxaot_own_loops():
        return _lax_loops.fori_loop(*args, **kwargs)


def in_kernel_trace() -> bool:
    """Whether a Pallas kernel (or its index maps) is being traced on this thread: its loops are the kernel's,
    lowered by Pallas, which knows JAX's ``while`` alone (Pallas is looked at only once something imported it)."""
    pallas = sys.modules.get("jax._src.pallas.core")
    env = getattr(pallas, "_pallas_tracing_env", None)
    return getattr(env, "grid_context", None) is not None


def intercept_while_binds(hook: Any) -> None:
    """Route every bind of JAX's ``while`` primitive through ``hook(bind, *args, **params)``, where
    ``bind`` is JAX's own (idempotent: a second call replaces the hook)."""
    def bind(*args: Any, **params: Any) -> Any:
        if in_jaxaot_own_loop() or in_kernel_trace():
            return _JAX_BIND(lax_while_p, *args, **params)
        return hook(functools.partial(_JAX_BIND, lax_while_p), *args, **params)

    lax_while_p.bind = bind


def while_parts(params: dict) -> tuple[int, Any, int, Any]:
    """``(cond_nconsts, cond_jaxpr, body_nconsts, body_jaxpr)`` of a ``while`` eqn's params."""
    return params["cond_nconsts"], params["cond_jaxpr"], params["body_nconsts"], params["body_jaxpr"]


# The jit-cache key of programs traced under ``patch_while_loop``: a config state JAX includes in
# every jit and tracing cache key, so no cache serves a program traced under other loop options.
from jax._src import config as _config  # noqa: E402


def _keying_state(name: str, help_text: str) -> Any:
    """JAX's config state ``name``, made once per process (an import retried after a failed one finds it)."""
    state = _config.config_states.get(name)  # a State's truth value raises: compare with None
    if state is None:
        state = _config.State(name, "", help_text, include_in_jit_key=True, include_in_trace_context=True)
    return state


_LOOP_OPTIONS = _keying_state("jaxaot_loop_options",
                              "The while-loop options of jaxaot.loops.patch_while_loop (part of every jit key).")


def loop_options_scope(key: str) -> Any:
    """A context in which the jit and tracing caches are keyed by ``key`` too."""
    return _LOOP_OPTIONS(key)


# The jit-cache key of the jaxaot settings that shape traced or lowered programs (``Setting.traced``:
# the loops' schedules and lowerings), kept equal to their values in force, so a program traced under
# other values is traced again rather than served from a cache.
from jaxaot._src.config import SETTINGS as _SETTINGS, Config as _Config, config as _jaxaot_config  # noqa: E402

_TRACED_SETTINGS = _keying_state("jaxaot_traced_settings",
                                 "The jaxaot settings that shape traced programs (part of every jit key).")


def _key_traced_settings(settings: _Config) -> None:
    key = repr(tuple(getattr(settings, s.name) for s in _SETTINGS.values() if s.traced))
    if _TRACED_SETTINGS.value != key:
        _TRACED_SETTINGS._set(key)


_jaxaot_config.watch(_key_traced_settings)


def replace_eqns(jaxpr: Any, eqns: Sequence[Any]) -> Any:
    """An open jaxpr with the same binders and other ``eqns``."""
    return jaxpr.replace(eqns=list(eqns))


def custom_rule_params(prim: Any, params: dict, rewrite: Any) -> dict | None:
    """The params of a ``custom_jvp_call`` / ``custom_vjp_call`` eqn whose JVP / forward rule thunks pass
    the jaxprs they make through ``rewrite(jaxpr, consts) -> (jaxpr, consts)`` (open jaxprs); None for
    another primitive, or a version whose thunks are unknown here. The ``custom_vjp`` backward rule is a
    Python function, not a jaxpr, and is kept."""
    from jax._src import linear_util as _lu
    from jaxaot._src.compat.core import custom_jvp_call_p, custom_vjp_call_p

    new = dict(params)
    if prim is custom_jvp_call_p and "jvp_jaxpr_fun" in params:
        old = params["jvp_jaxpr_fun"]

        def jvp_thunk(*zeros):
            jaxpr, consts, out_zeros = old.call_wrapped(*zeros)
            return (*rewrite(jaxpr, consts), out_zeros)

        new["jvp_jaxpr_fun"] = _lu.wrap_init(jvp_thunk, debug_info=old.debug_info)
        return new
    if prim is custom_vjp_call_p and "fwd_jaxpr_thunk" in params:
        old = params["fwd_jaxpr_thunk"]

        def fwd_thunk(*zeros):
            return rewrite(*old.call_wrapped(*zeros))

        new["fwd_jaxpr_thunk"] = _lu.wrap_init(fwd_thunk, debug_info=old.debug_info)
        return new
    return None


# re-exported: a cache keyed weakly by its first argument
from jax._src.util import weakref_lru_cache  # noqa: E402,F401


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


def saved_by_policy(saveable: Any, eqn: Any) -> bool:
    """Whether the ``jax.checkpoint`` policy ``saveable`` saves ``eqn``'s outputs instead of recomputing
    them, as JAX asks it of an eqn whose inputs are all known (an offload counts as recomputing)."""
    case = _pe.ensure_enum(saveable(eqn.primitive, *[x.aval for x in eqn.invars], **eqn.params))
    return isinstance(case, _pe.SaveableType)


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


def tracing_into(trace: Any) -> Any:
    """A context in which binds (and jnp ops) on ``trace``'s tracers go to ``trace``: a partial-eval rule
    that builds its result from other loops, each split by its own rule."""
    return _core.set_current_trace(trace)


def is_known_pval(tracer: Any) -> bool:
    return tracer.pval.is_known()


def known_value(tracer: Any) -> Any:
    """The known value of a partial-eval tracer (a rule may also return known values as they are)."""
    return tracer.pval.get_known() if isinstance(tracer, _pe.JaxprTracer) else tracer


def is_jaxpr_var(x: Any) -> bool:
    return isinstance(x, _core.Var) and not isinstance(x, _core.DropVar)


#: What the while-loop primitives (:mod:`jaxaot._src.loops`) and the tracing stage use (``C.<name>``).
__all__ = [
    "ShapedArray", "UndefinedPrimal", "Zero", "backward_pass_closed", "batched_outputs",
    "custom_partial_eval_rules", "dce_closed", "dce_rules", "effects_of", "fancy_primitive_batchers", "has_effects",
    "hoist_consts", "in_avals_of", "instantiate_zeros", "is_jaxpr_var", "is_known_pval", "is_undefined_primal",
    "join_effects", "jvp_jaxpr", "known_value", "lax_fori_loop", "lax_while_loop", "lower_fun", "merge_lists",
    "custom_rule_params", "in_jaxaot_own_loop", "in_kernel_trace", "intercept_while_binds", "jaxaot_own_loops",
    "lax_while_p",
    "loop_options_scope", "replace_eqns", "saved_by_policy", "tracing_into", "weakref_lru_cache", "while_parts",
    "new_eqn", "new_loop_primitive", "out_avals_of", "partial_eval_jaxpr_custom_rules",
    "partial_eval_jaxpr_nounits", "primitive_jvps", "primitive_transposes", "register_lowering", "split_list",
    "stage_unknown_eqn", "vmap_like",
]
