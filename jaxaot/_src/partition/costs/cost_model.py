"""What the min-cut partitioner may recompute, and what recomputing costs.

Every forward eqn is one :class:`Recompute` class: ``CHEAP`` (fusible: elementwise,
reshapes, gathers, cheap reductions, counter-based RNG), ``EXPENSIVE`` (matmuls,
convolutions, large reductions, loops, anything unknown; recomputed only below
``memory_budget=1``) or ``NEVER`` (effects, callbacks, custom calls, collectives:
repeating them is observable). Primitives are matched by name, so newer JAX's are
classed too; :func:`classify` says how a graph's eqns are classed. Symbolic
dimensions are costed at :data:`jaxaot._src.pytrees.SYMBOLIC_DIM_SIZE`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.costs import cost_model
    >>> eqn = jax.make_jaxpr(jnp.sin)(1.0).jaxpr.eqns[0]
    >>> cost_model.classify(eqn)
    <Recompute.CHEAP: 'cheap'>
"""

from __future__ import annotations

import enum
import math
from typing import Any


from jaxaot._src import compat as C
from jaxaot._src.pytrees import concrete_shape


class Recompute(enum.Enum):
    CHEAP = "cheap"
    EXPENSIVE = "expensive"
    NEVER = "never"


_ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e
    bitcast_convert_type cbrt ceil clamp clz complex conj convert_element_type copy cos cosh
    digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac imag
    integer_pow is_finite le lgamma log log1p logistic lt max min mul mulhi ne neg nextafter not
    one_minus_square or polygamma population_count pow real reduce_precision regularized_incomplete_beta
    rem round rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square
    sub tan tanh xor zeta""".split()
)
# Data movement and constants: no arithmetic, fuse as index computations.
_LAYOUT = frozenset(
    """broadcast_in_dim broadcast_to concatenate dynamic_slice empty empty2 expand_dims gather
    iota name pad reshape rev sharding_constraint slice split squeeze stop_gradient tile transpose zeros_like
    random_wrap random_unwrap random_seed random_fold_in random_split random_clone
    random_bits threefry2x32 threefry4x32 philox2x32 philox4x32 iota_2x32_shape""".split()
)
_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax argmin".split()
)
_NEVER = frozenset(
    """debug_callback debug_print io_callback pure_callback ffi_call custom_call cudnn_fusion
    optimization_barrier device_put rng_uniform create_token after_all get swap addupdate
    new_ref empty_ref free_ref run_state""".split()
)
#: Primitives that communicate between devices (inside ``shard_map`` or a named-axis ``vmap``).
COLLECTIVES = frozenset(
    """psum psum_invariant pmax pmin pmean all_gather all_gather_invariant reduce_scatter psum_scatter
    ppermute pshuffle all_to_all ragged_all_to_all pbroadcast psend precv""".split()
)
_TRANSPARENT_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "jit", "pjit", "closed_call"})
# Name fragments of loops, whatever module defines them (jaxaot.loops.while_loop, lax.scan...).
_LOOP_FRAGMENTS = ("while", "scan", "loop", "fori")

#: Primitives whose operands XLA reads from memory: it fuses no producer into
#: them (a cuDNN convolution reads a materialized input; matmuls are left out
#: because XLA's GPU emitters do fuse elementwise producers into GEMM fusions).
_MATERIALIZING = frozenset({"conv_general_dilated"})

#: A reduction whose output is under this fraction of its input reads far more
#: than it saves: recomputing it is a full extra pass, so it is EXPENSIVE.
LARGE_REDUCTION_RATIO = 4

# Rough per-element FLOPs of transcendental functions (the rest count 1).
_TRANSCENDENTAL = frozenset(
    "exp exp2 expm1 log log1p tanh logistic sin cos tan erf erfc erf_inv pow lgamma digamma".split()
)


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    return int(math.prod(concrete_shape(shape))) if shape is not None else 0


def is_loop(name: str) -> bool:
    return any(frag in name for frag in _LOOP_FRAGMENTS)


def is_alias(eqn: Any) -> bool:
    """True for identities that only label a value (``checkpoint_name``)."""
    return eqn.primitive.name == "name" and len(eqn.invars) == 1


def communicates(eqn: Any) -> bool:
    """Whether ``eqn`` is a collective, or a call, loop or ``shard_map`` whose body runs one."""
    if eqn.primitive.name in COLLECTIVES:
        return True
    return any(communicates(e) for body in C.eqn_subjaxprs(eqn) for e in C.jaxpr_of(body).eqns)


def classify(eqn: Any) -> Recompute:
    """The :class:`Recompute` class of one eqn."""
    name = eqn.primitive.name
    if C.is_effectful(eqn) or name in _NEVER or "callback" in name or communicates(eqn):
        return Recompute.NEVER
    if name in _ELEMENTWISE or name in _LAYOUT:
        return Recompute.CHEAP
    if name in _TRANSPARENT_CALLS:
        # custom_jvp/custom_vjp rules only matter to differentiation; re-running
        # the call runs its primal body, as cheap as that body (jax.nn.relu is one).
        bodies = C.eqn_subjaxprs(eqn)
        cheap = bodies and all(classify(e) is Recompute.CHEAP for b in bodies for e in C.jaxpr_of(b).eqns)
        return Recompute.CHEAP if cheap else Recompute.EXPENSIVE
    if name in _REDUCTIONS:
        out = sum(_size(v.aval) for v in eqn.outvars)
        inp = sum(_size(v.aval) for v in eqn.invars)
        return Recompute.EXPENSIVE if out * LARGE_REDUCTION_RATIO < inp else Recompute.CHEAP
    return Recompute.EXPENSIVE


def materializes_operands(eqn: Any) -> bool:
    """True when ``eqn`` reads its operands from memory (no producer fuses into it).

    A value read by such an eqn in the forward *and* in the backward is written
    to memory by the forward anyway: saving it adds no traffic, while
    recomputing it costs the backward a whole extra kernel. The min-cut
    partitioner saves such values (:func:`jaxaot._src.partition.mincut.saved_values.build_flow_graph`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.partition.costs import cost_model
        >>> conv = lambda x, w: jax.lax.conv(x, w, (1, 1), "SAME")
        >>> eqn = jax.make_jaxpr(conv)(jnp.ones((1, 2, 4, 4)), jnp.ones((2, 2, 3, 3))).jaxpr.eqns[0]
        >>> cost_model.materializes_operands(eqn)
        True
    """
    return eqn.primitive.name in _MATERIALIZING


def flops(eqn: Any) -> float:
    """Estimated FLOPs to run ``eqn`` once (what recomputing it costs).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.partition.costs import cost_model
        >>> eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((2, 3)), jnp.ones((3, 4))).jaxpr.eqns[0]
        >>> cost_model.flops(eqn)
        48.0
    """
    name = eqn.primitive.name
    out = sum(_size(v.aval) for v in eqn.outvars)
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        shape = concrete_shape(eqn.invars[0].aval.shape)
        return 2.0 * out * math.prod(shape[d] for d in lhs_contract)
    if name == "conv_general_dilated":
        rhs = concrete_shape(eqn.invars[1].aval.shape)
        spec = eqn.params["dimension_numbers"]
        out_feature_dim = spec.rhs_spec[0] if spec is not None else 0
        per_output = math.prod(rhs) // max(rhs[out_feature_dim], 1)
        return 2.0 * out * per_output
    subs = C.eqn_subjaxprs(eqn)
    if subs:
        body = [sum(flops(e) for e in C.jaxpr_of(s).eqns) for s in subs]
        trips = eqn.params.get("length", 1) if name == "scan" else 1
        # cond runs one branch; loops and calls run their bodies (a while loop's
        # trip count is unknown: count one trip, a lower bound).
        return float(trips * (max(body) if name == "cond" else sum(body)))
    inp = sum(_size(v.aval) for v in eqn.invars if not C.is_literal(v))
    if name in _REDUCTIONS or name.startswith("cum") or name.startswith("reduce_window"):
        return float(inp)
    if name in _TRANSCENDENTAL:
        return 10.0 * out
    if name in _LAYOUT:
        return 0.0 if name in ("iota", "broadcast_in_dim", "reshape", "squeeze", "expand_dims") else float(out)
    return float(max(out, 1))
