"""Stage 1: trace a user function to its primal jaxpr and its joint jaxpr.

The joint jaxpr is ``(primals..., cotangents...) -> (outputs..., input_grads...)``.
It is built by tracing ``jax.vjp`` of the function, so every primitive that JAX
can differentiate works, and the forward half is exactly the computation JAX's
own linearization keeps. Calls (``jax.jit`` inside the function, closed calls)
are inlined so later stages see one flat program.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> joint = jaxaot.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
    >>> joint.num_primals, joint.num_cotangents, joint.num_grads
    (1, 1, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxaot import _compat as C
from jaxaot.errors import InvalidInputError, InvalidOutputError, NoDifferentiationRuleError, ReverseModeBoundError

Decompositions = Mapping[Any, Callable[..., Any]]


# --------------------------------------------------------------------------- leaves
_SCALAR_TYPES = (bool, int, float, complex, np.generic)


def is_array_leaf(x: Any) -> bool:
    """What jaxaot accepts as a pytree leaf: arrays, tracers and numeric scalars."""
    return isinstance(x, (jax.Array, np.ndarray, C.Tracer, jax.ShapeDtypeStruct, *_SCALAR_TYPES))


def describe_path(prefix: str, path: Sequence[Any]) -> str:
    """``prefix`` + the key path; prefix ``"input"`` names an ``(args, kwargs)`` pair's
    leaves ``arg[0]['w']`` / ``kwarg['scale']``."""
    path = tuple(path)
    if prefix == "input" and path:
        head = getattr(path[0], "idx", None)
        return ("arg" if head == 0 else "kwarg") + jax.tree_util.keystr(path[1:])
    return prefix + jax.tree_util.keystr(path)


def flatten_checked(tree: Any, prefix: str, error: type[Exception] = InvalidInputError):
    """Flatten ``tree``; raise ``error`` naming the first leaf that is not an array."""
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves_with_path:
        if not is_array_leaf(leaf):
            raise error(
                f"{describe_path(prefix, path)} is a {type(leaf).__name__}, not an array or "
                "scalar. jaxaot traces pytrees of arrays: pass it as a static argument "
                "(static_argnums), close over it, or convert it with jnp.asarray."
            )
    return [leaf for _, leaf in leaves_with_path], treedef


def leaf_paths(treedef: Any, prefix: str = "") -> list[str]:
    """Printable paths of the leaves of ``treedef`` (``arg[0]['w']`` style)."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    return [describe_path(prefix, p) for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]


def abstractify(x: Any) -> jax.ShapeDtypeStruct:
    """The aval-like description of a leaf: shape, dtype, weak type, sharding."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    aval = jax.typeof(x) if hasattr(jax, "typeof") else jax.api_util.shaped_abstractify(x)
    sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) and not C.is_tracer(x) else None
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type)


# --------------------------------------------------------------------------- JointGraph
@dataclasses.dataclass(frozen=True)
class JointGraph:
    """A function's primal program and its joint forward+backward program.

    Attributes:
      jaxpr: closed jaxpr ``(primals..., cotangents...) -> (outputs..., grads...)``.
        There is one cotangent per output in ``needs_cotangent`` and one grad per
        input in ``differentiable``, in flat order.
      primal: closed jaxpr ``(primals...) -> (outputs...)``, the inference program.
      in_tree / out_tree: pytree structures of the flat inputs and outputs.
      in_avals / out_avals: ``jax.ShapeDtypeStruct`` per flat input / output.
      differentiable: per flat input, whether it gets a gradient (inexact dtype).
      needs_cotangent: per flat output, whether it takes a cotangent (inexact dtype).
      is_backward: per eqn of ``jaxpr``, whether it depends on any cotangent.
      output_is_input: per flat output, the flat input it literally is, else None.
      num_aux: how many trailing outputs are not the function's but the runtime's
        (trip counts of while loops whose stack the runtime sizes); they are
        integers, so they take no cotangent. ``out_tree`` describes the others.
      rebuild: ``rebuild(primal) -> JointGraph`` builds the joint graph of another
        primal program of the same signature with the same options (decompositions,
        differentiated inputs, runtime aux outputs): for passes that rewrite the
        primal, such as the min-cut's scan rematerialization.
    """

    jaxpr: Any
    primal: Any
    in_tree: Any
    out_tree: Any
    in_avals: tuple
    out_avals: tuple
    differentiable: tuple[bool, ...]
    needs_cotangent: tuple[bool, ...]
    is_backward: tuple[bool, ...]
    output_is_input: tuple[int | None, ...]
    num_aux: int = 0
    rebuild: Callable[[Any], "JointGraph"] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def num_primals(self) -> int:
        return len(self.in_avals)

    @property
    def num_outputs(self) -> int:
        return len(self.out_avals)

    @property
    def num_cotangents(self) -> int:
        return sum(self.needs_cotangent)

    @property
    def num_grads(self) -> int:
        return sum(self.differentiable)

    @property
    def grad_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.differentiable) if d)

    @property
    def cotangent_outputs(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.needs_cotangent) if n)

    @property
    def eqns(self) -> list:
        return list(C.jaxpr_of(self.jaxpr).eqns)

    def __str__(self) -> str:
        return str(self.jaxpr)


# --------------------------------------------------------------------------- inlining
def inline_eval(closed: Any, args: Sequence[Any], decompositions: Decompositions | None) -> list:
    """Evaluate ``closed`` in the current trace, inlining calls and applying decompositions."""
    jaxpr = C.jaxpr_of(closed)
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if C.is_literal(v) else env[v]

    for v, x in zip(jaxpr.constvars, C.consts_of(closed)):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive in C.INLINABLE_CALLS and not eqn.effects:
            body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            outs = inline_eval(body, invals, decompositions)
        elif decompositions and eqn.primitive in decompositions:
            outs = decompositions[eqn.primitive](*invals, **eqn.params)
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
        elif decompositions and _decomposes_inside(eqn, decompositions):
            # Loop and cond bodies get the decompositions too, so that the
            # partitioner sees the same operations in a scanned layer as in an
            # unrolled one.
            params = C.map_subjaxprs(eqn, lambda body: _decompose_body(body, decompositions))
            outs = C.bind_eqn(eqn, invals, params)
        else:
            outs = C.bind_eqn(eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            if not C.is_drop_var(v):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _has_decomposed(eqns: Any, decompositions: Decompositions) -> bool:
    """Whether ``eqns``, or a body inside them, hold a primitive that ``decompositions`` replaces."""
    return any(e.primitive in decompositions or _decomposes_inside(e, decompositions) for e in eqns)


def _decomposes_inside(eqn: Any, decompositions: Decompositions) -> bool:
    """Whether a body of ``eqn`` (not a custom-derivative call's: its rules stay) holds a decomposed primitive."""
    if "custom" in eqn.primitive.name:
        return False
    return any(_has_decomposed(C.jaxpr_of(body).eqns, decompositions) for body in C.eqn_subjaxprs(eqn))


def _decompose_body(body: Any, decompositions: Decompositions) -> Any:
    if not _has_decomposed(C.jaxpr_of(body).eqns, decompositions):
        return body  # e.g. the cond branch without the primitive
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in C.in_avals_of(body)]
    return jax.make_jaxpr(lambda *a: inline_eval(body, a, decompositions))(*avals)


def _needs_retrace(closed: Any, decompositions: Decompositions | None) -> bool:
    eqns = C.jaxpr_of(closed).eqns
    return any(e.primitive in C.INLINABLE_CALLS for e in eqns) or bool(
        decompositions and _has_decomposed(eqns, decompositions))


def flatten_program(closed: Any, in_avals: Sequence[Any], decompositions: Decompositions | None = None) -> Any:
    """``closed`` with its calls inlined and ``decompositions`` applied."""
    while _needs_retrace(closed, decompositions):
        closed = jax.make_jaxpr(lambda *a, c=closed: inline_eval(c, a, decompositions))(*in_avals)
        decompositions = None  # decomposed ops must not be decomposed again
    return closed


# --------------------------------------------------------------------------- tracing
def _check_outputs(outs: Any) -> tuple[list, Any]:
    leaves, tree = flatten_checked(outs, "output", InvalidOutputError)
    return [jax.numpy.asarray(x) if isinstance(x, (*_SCALAR_TYPES, np.ndarray)) else x for x in leaves], tree


def trace_primal(flat_fn: Callable[..., Any], in_avals: Sequence[Any], decompositions: Decompositions | None = None):
    """Trace ``flat_fn(*leaves) -> pytree`` to a flat primal jaxpr and its output tree."""
    out_tree_box: list = []

    def wrapped(*leaves):
        outs, tree = _check_outputs(flat_fn(*leaves))
        out_tree_box.append(tree)
        return outs

    closed = jax.make_jaxpr(wrapped)(*in_avals)
    return flatten_program(closed, in_avals, decompositions), out_tree_box[0]


def _missing_rule_error(primal: Any, err: Exception) -> Exception:
    for eqn in _all_eqns(C.jaxpr_of(primal)):
        if not C.has_jvp_rule(eqn.primitive):
            return NoDifferentiationRuleError(
                f"primitive '{eqn.primitive}' at {C.eqn_source(eqn)} has no differentiation "
                "rule, so jaxaot cannot build its backward. Register one (jax.interpreters.ad."
                "primitive_jvps), wrap the code in jax.custom_vjp, or stop gradients through "
                f"it with jax.lax.stop_gradient. (JAX said: {err})"
            )
    return NoDifferentiationRuleError(str(err))


def _all_eqns(jaxpr: Any):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in C.eqn_subjaxprs(eqn):
            yield from _all_eqns(C.jaxpr_of(sub))


_BACKWARD_SCOPE = "jaxaot_backward"


def _backward_mask(jaxpr: Any, num_primals: int) -> tuple[bool, ...]:
    tainted = set(jaxpr.invars[num_primals:])
    mask = []
    for eqn in jaxpr.eqns:
        bwd = any((not C.is_literal(v)) and v in tainted for v in eqn.invars) or (
            bool(eqn.effects) and _BACKWARD_SCOPE in C.eqn_name_stack(eqn)
        )
        if bwd:
            tainted.update(eqn.outvars)
        mask.append(bwd)
    return tuple(mask)


def build_joint(
    primal: Any,
    in_tree: Any,
    out_tree: Any,
    in_avals: Sequence[Any],
    decompositions: Decompositions | None = None,
    differentiated: Sequence[bool] | None = None,
    aux_outputs: Callable[[], Any] | None = None,
) -> JointGraph:
    """Build the :class:`JointGraph` of a flat primal jaxpr.

    ``differentiated`` restricts which inputs get gradients (default: every
    input of inexact dtype), as ``jax.grad``'s ``argnums`` does.
    ``aux_outputs`` is a context-manager factory yielding a list; values the
    differentiation appends to it (integer scalars of the forward trace) become
    extra trailing outputs, counted in ``num_aux``.
    """
    in_avals = tuple(in_avals)
    out_avals = tuple(
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in primal.out_avals
    )
    diff_in = tuple(C.is_inexact(a.dtype) for a in in_avals)
    if differentiated is not None:
        diff_in = tuple(d and m for d, m in zip(diff_in, differentiated))
    diff_out = tuple(C.is_inexact(a.dtype) for a in out_avals)
    din = [i for i, d in enumerate(diff_in) if d]
    dout = [i for i, d in enumerate(diff_out) if d]
    n_out = len(out_avals)

    def joint_fn(primals, cts):
        def f_diff(*diff_vals):
            full = list(primals)
            for i, v in zip(din, diff_vals):
                full[i] = v
            outs = C.eval_closed(primal, *full)
            return [outs[i] for i in dout], outs

        with aux_outputs() if aux_outputs else contextlib.nullcontext([]) as aux:
            _, vjp_fn, outs = jax.vjp(f_diff, *[primals[i] for i in din], has_aux=True)
            _check_aux_at_top_level(aux)
            # The scope marks effects of the backward that read no cotangent (a callback in
            # a custom_vjp bwd, say), so the partition keeps them in the backward.
            with jax.named_scope(_BACKWARD_SCOPE):
                grads = vjp_fn(list(cts))
        return list(outs) + list(aux), list(grads)

    ct_avals = [jax.ShapeDtypeStruct(out_avals[i].shape, out_avals[i].dtype) for i in dout]
    try:
        joint = jax.make_jaxpr(joint_fn)(list(in_avals), ct_avals)
    except NotImplementedError as err:
        raise _missing_rule_error(primal, err) from err
    joint = flatten_program(joint, [*in_avals, *ct_avals], decompositions)
    jaxpr = C.jaxpr_of(joint)
    num_aux = len(jaxpr.outvars) - n_out - len(din)
    if num_aux:
        aux_avals = joint.out_avals[n_out : n_out + num_aux]
        out_avals += tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in aux_avals)
        diff_out += (False,) * num_aux
        n_out += num_aux
    positions = {v: i for i, v in enumerate(jaxpr.invars[: len(in_avals)])}
    output_is_input = tuple(
        None if C.is_literal(v) else positions.get(v) for v in jaxpr.outvars[:n_out]
    )
    return JointGraph(
        jaxpr=joint,
        primal=primal,
        in_tree=in_tree,
        out_tree=out_tree,
        in_avals=in_avals,
        out_avals=out_avals,
        differentiable=diff_in,
        needs_cotangent=diff_out,
        is_backward=_backward_mask(jaxpr, len(in_avals)),
        output_is_input=output_is_input,
        num_aux=num_aux,
        rebuild=functools.partial(_rebuild, in_tree, out_tree, in_avals, decompositions, differentiated, aux_outputs),
    )


def _check_aux_at_top_level(aux: Sequence[Any]) -> None:
    here = C.current_trace()
    if any(C.trace_of(t) is not None and C.trace_of(t) is not here for t in aux):
        # A loop inside a lax.scan / cond / jax.checkpoint body reported a trip count
        # of that body: it cannot become an output of this program.
        raise ReverseModeBoundError(
            "a jaxaot.while_loop without max_steps or checkpoints is reverse-differentiated inside "
            "the body of another transformation (lax.scan, lax.cond, jax.checkpoint, a loop): the "
            "aot_function runtime sizes the stack only of loops at the top level of the function. "
            "Pass max_steps=N or checkpoints=k to this while_loop."
        )


def _rebuild(in_tree, out_tree, in_avals, decompositions, differentiated, aux_outputs, primal) -> JointGraph:
    return build_joint(primal, in_tree, out_tree, in_avals, decompositions, differentiated, aux_outputs)


def trace_joint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JointGraph:
    """Trace ``fn(*args, **kwargs)`` to its :class:`JointGraph`.

    Inputs are the flattened ``(args, kwargs)`` pytree; leaves must be arrays or
    numeric scalars. Inexact inputs get gradients; integer/bool inputs do not
    (JAX would give them ``float0``). Inexact outputs take a cotangent.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> g = jaxaot.trace_joint(lambda w, x: jnp.tanh(x @ w), jnp.ones((3, 2)), jnp.ones((4, 3)))
        >>> g.differentiable, g.needs_cotangent
        ((True, True), (True,))
    """
    if not callable(fn):
        raise InvalidInputError(f"trace_joint expects a callable, got {type(fn).__name__}.")
    leaves, in_tree = flatten_checked((args, kwargs), "input")
    in_avals = [abstractify(x) for x in leaves]

    def flat_fn(*flat):
        a, k = jax.tree_util.tree_unflatten(in_tree, flat)
        return fn(*a, **k)

    primal, out_tree = trace_primal(flat_fn, in_avals)
    return build_joint(primal, in_tree, out_tree, in_avals)
