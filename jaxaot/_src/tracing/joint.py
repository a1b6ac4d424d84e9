"""Stage 1: trace a user function to its primal jaxpr and its joint jaxpr.

The joint jaxpr is ``(primals..., cotangents...) -> (outputs..., input_grads...)``.
It is built by tracing ``jax.vjp`` of the function, so every primitive that JAX
can differentiate works, and the forward half is exactly the computation JAX's
own linearization keeps. Calls (``jax.jit`` inside the function, closed calls)
are inlined so later stages see one flat program.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> joint = jaxaot.partition.trace_joint(lambda x: jnp.sin(x).sum(), jnp.ones(3))
    >>> joint.num_primals, joint.num_cotangents, joint.num_grads
    (1, 1, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.loops import note_remedy
from jaxaot._src.pytrees import abstractify, flatten_checked
from jaxaot._src.tracing.primal import Decompositions, flatten_program, trace_primal
from jaxaot.errors import InvalidInputError, NoDifferentiationRuleError, ReverseModeBoundError



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
      recipe: the arguments it was built from (a ``JointRecipe``; None when built by hand).
      rebuild: ``rebuild(primal) -> JointGraph`` builds the joint graph of another
        primal program of the same signature with the same options (decompositions,
        differentiated inputs, runtime aux outputs): for passes that rewrite the
        primal, such as the min-cut's scan rematerialization. None when built by hand.
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
    recipe: "JointRecipe | None" = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def rebuild(self) -> Callable[[Any], "JointGraph"] | None:
        return None if self.recipe is None else self.recipe.rebuild

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


#: JAX's message for a primitive without a JVP rule; other ``NotImplementedError``s (a user's rule that raises,
#: ``scatter_mul`` of repeated indices) pass through as JAX raised them.
_NO_RULE = re.compile(r"Differentiation rule for '([^']+)' not implemented")


#: What JAX says of a function without a reverse-mode derivative: a loop with a traced trip count, a callback, a
#: primitive without a JVP or transpose rule, a kernel whose JVP cannot be linearized (a Pallas call), an FFI call
#: (jaxaot's :class:`NoDifferentiationRuleError` too).
_NO_DERIVATIVE = re.compile(r"Reverse-mode differentiation does not work|callbacks do not support JVP|"
                            r"(Differentiation|Transpose) rule .*not implemented|"
                            r"Linearization failed to produce known values|The FFI call to .* cannot be differentiated",
                            re.IGNORECASE)


def lacks_derivative(err: BaseException) -> bool:
    """Whether the joint trace failed for want of a reverse-mode derivative (not for an error of the function's
    own code, or of its custom rules, which propagate)."""
    return isinstance(err, NoDifferentiationRuleError) or bool(_NO_DERIVATIVE.search(str(err)))


def _missing_rule_error(primal: Any, err: Exception) -> Exception | None:
    """The error naming the primitive JAX found without a differentiation rule, and where the function uses it;
    None where JAX's ``NotImplementedError`` says something else."""
    found = _NO_RULE.search(str(err))
    if found is None:
        return None
    eqn = next((e for e in C.iter_eqns(primal) if str(e.primitive) == found.group(1)), None)
    where = f" at {C.eqn_source(eqn)}" if eqn is not None else ""
    return NoDifferentiationRuleError(
        f"primitive '{found.group(1)}'{where} has no differentiation "
        "rule, so jaxaot cannot build its backward. Register one (jax.interpreters.ad."
        "primitive_jvps), wrap the code in jax.custom_vjp, or stop gradients through "
        f"it with jax.lax.stop_gradient. (JAX said: {err})"
    )


def _note_kernels(primal: Any, err: BaseException) -> None:
    """Add to JAX's "Linearization failed" (kept as it is, a ``ValueError``, as ``jax.grad`` raises it) the kernels
    of the function that have no reverse-mode derivative (a Pallas call), where it uses them, and what to do."""
    if "Linearization failed" not in str(err):
        return
    kernels = [f"{e.primitive} at {C.eqn_source(e)}" for e in C.iter_eqns(primal) if "pallas" in str(e.primitive)]
    if kernels:
        err.add_note(f"jaxaot: {', '.join(kernels)} has no reverse-mode derivative. Give the kernel a "
                     "jax.custom_vjp, or stop gradients through it (jax.lax.stop_gradient on its inputs, or leave "
                     "them out of argnums).")


_BACKWARD_SCOPE = "jaxaot_backward"


def in_backward_scope(eqn: Any) -> bool:
    """Whether ``eqn`` was traced inside the joint graph's backward (its name stack holds the backward's scope).

    The joint graph traces JAX's VJP under one ``jax.named_scope``; an eqn of the
    backward that no cotangent reaches (an effect, a constant) is told apart by it.
    """
    return _BACKWARD_SCOPE in C.eqn_name_stack(eqn)


def _backward_mask(jaxpr: Any, num_primals: int) -> tuple[bool, ...]:
    tainted = set(jaxpr.invars[num_primals:])
    mask = []
    for eqn in jaxpr.eqns:
        bwd = any((not C.is_literal(v)) and v in tainted for v in eqn.invars) or (
            bool(eqn.effects) and in_backward_scope(eqn)
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
    out_avals = tuple(C.abstract_input(a) for a in primal.out_avals)  # varying manual axes kept (shard_map)
    diff_in = tuple(C.is_inexact(a.dtype) for a in in_avals)
    if differentiated is not None:
        diff_in = tuple(d and m for d, m in zip(diff_in, differentiated))
    diff_out = tuple(C.is_inexact(a.dtype) for a in out_avals)
    din = [i for i, d in enumerate(diff_in) if d]
    dout = [i for i, d in enumerate(diff_out) if d]
    n_out = len(out_avals)

    def joint_fn(primals, cts):
        with aux_outputs() if aux_outputs else contextlib.nullcontext([]) as aux:
            _, vjp_fn, outs = jax.vjp(_diff_fn(primal, primals, din, dout), *[primals[i] for i in din], has_aux=True)
            _check_aux_at_top_level(aux)
            reported = len(aux)
            # The scope marks effects of the backward that read no cotangent (a callback in
            # a custom_vjp bwd, say), so the partition keeps them in the backward.
            with jax.named_scope(_BACKWARD_SCOPE):
                grads = vjp_fn(list(cts))
            if len(aux) != reported:  # a loop linearized only in the backward: inside another loop's body
                raise _nested_unbounded_error()
        return list(outs) + list(aux), list(grads)

    ct_avals = [C.abstract_input(primal.out_avals[i], weak_type=False) for i in dout]
    try:
        joint = jax.make_jaxpr(joint_fn)(list(in_avals), ct_avals)
    except NotImplementedError as err:
        missing = _missing_rule_error(primal, err)
        if missing is None:
            raise
        raise missing from err
    except ValueError as err:
        note_remedy(err)
        _note_kernels(primal, err)
        raise
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
        recipe=JointRecipe(primal, in_tree, out_tree, in_avals, decompositions,
                           None if differentiated is None else tuple(differentiated), aux_outputs),
    )


def _check_aux_at_top_level(aux: Sequence[Any]) -> None:
    here = C.current_trace()
    if any(C.trace_of(t) is not None and C.trace_of(t) is not here for t in aux):
        # A loop inside a lax.scan / cond / jax.checkpoint body reported a trip count
        # of that body: it cannot become an output of this program.
        raise _nested_unbounded_error()


def _nested_unbounded_error() -> ReverseModeBoundError:
    return ReverseModeBoundError(
        "a jaxaot.loops.while_loop without max_steps or checkpoints is reverse-differentiated inside "
        "the body of another transformation (lax.scan, lax.cond, jax.checkpoint, a loop): the "
        "aot_function runtime sizes the stack only of loops at the top level of the function. "
        "Pass max_steps=N or checkpoints=k to this while_loop."
    )


def _diff_fn(primal: Any, primals: Sequence[Any], din: Sequence[int], dout: Sequence[int]) -> Callable[..., Any]:
    """``primal`` as a function of its inputs at ``din`` (the others fixed at ``primals``), returning its outputs at
    ``dout`` and, as aux, all of them."""
    def f_diff(*diff_vals):
        full = list(primals)
        for i, v in zip(din, diff_vals):
            full[i] = v
        outs = C.eval_closed(primal, *full)
        return [outs[i] for i in dout], outs

    return f_diff


def grad_avals(recipe: "JointRecipe", din: Sequence[int], dout: Sequence[int], ct_avals: Sequence[Any]) -> list:
    """The avals (weak types included) of the gradients ``jax.vjp`` of the primal program gives its inputs at
    ``din`` for cotangents of ``ct_avals`` on its outputs at ``dout``, evaluated abstractly: what ``jax.grad`` hands
    back, which a backward traced for strong cotangents cannot say (a ``where``'s transpose fills with zeros typed
    as its cotangent)."""
    def grads(primals, cts):
        with recipe.aux_outputs() if recipe.aux_outputs else contextlib.nullcontext([]):
            _, vjp_fn, _ = jax.vjp(_diff_fn(recipe.primal, primals, din, dout), *[primals[i] for i in din],
                                   has_aux=True)
            return vjp_fn(list(cts))

    return list(jax.eval_shape(grads, list(recipe.in_avals), list(ct_avals)))


@dataclasses.dataclass(frozen=True)
class JointRecipe:
    """What a joint graph is a function of: :func:`build_joint`'s arguments, not yet built.

    The compile cache keys a partition by it, so a warm start finds its entry
    without building the joint graph, and a cached scan rewrite is replayed with
    ``rebuild`` straight from the primal program. ``aux_outputs`` must be keyable
    (a function or a ``functools.partial`` of one) for the partition to be cached.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> primal = jax.make_jaxpr(lambda x: jnp.sin(x).sum())(jnp.ones(3))
        >>> recipe = JointRecipe(primal, None, None, (jax.ShapeDtypeStruct((3,), jnp.float32),))
        >>> recipe.build().num_grads
        1
    """

    primal: Any
    in_tree: Any
    out_tree: Any
    in_avals: tuple
    decompositions: Decompositions | None = None
    differentiated: tuple[bool, ...] | None = None
    aux_outputs: Callable[[], Any] | None = None

    def build(self) -> JointGraph:
        """The joint graph (traced now)."""
        return build_joint(self.primal, self.in_tree, self.out_tree, self.in_avals, self.decompositions,
                           self.differentiated, self.aux_outputs)

    def rebuild(self, primal: Any) -> JointGraph:
        """The joint graph of ``primal``, a program of the same signature, with the same options."""
        return dataclasses.replace(self, primal=primal).build()

    @classmethod
    def of(cls, joint: JointGraph) -> "JointRecipe":
        """``joint``'s recipe; for a joint graph built by hand, its primal with every differentiable input."""
        if joint.recipe is not None:
            return joint.recipe
        return cls(joint.primal, joint.in_tree, joint.out_tree, tuple(joint.in_avals),
                   differentiated=tuple(joint.differentiable))


def trace_joint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JointGraph:
    """Trace ``fn(*args, **kwargs)`` to its :class:`JointGraph`.

    Inputs are the flattened ``(args, kwargs)`` pytree; leaves must be arrays or
    numeric scalars. Inexact inputs get gradients; integer/bool inputs do not
    (JAX would give them ``float0``). Inexact outputs take a cotangent.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> g = jaxaot.partition.trace_joint(lambda w, x: jnp.tanh(x @ w), jnp.ones((3, 2)), jnp.ones((4, 3)))
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
