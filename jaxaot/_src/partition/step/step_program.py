"""A partition's training step as one program: forward and backward in one jaxpr that keeps the plan.

:func:`step_program` builds ``forward``, then the residuals through an
``optimization_barrier`` (as ``jax.checkpoint`` lowers, so XLA cannot merge the
backward's recomputation with the forward and keep what the plan chose not to
save), then ``backward`` with unit cotangents: one launch, and XLA fuses across
the boundary. Its options (``barrier``, pinned ``layouts``, ``order``, ``slices``,
``rederive``) are the variants the runtime's fused step chooses among; a byte
budget's search measures the same program.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> f = jaxaot.aot_function(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2))
    >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    >>> _ = jaxaot.value_and_grad(f)(w, x)
    >>> [name for name in f.cache_info().entries[0].executables]
    ['fused[0]']
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot.errors import InvalidValueError
from jaxaot._src.partition.costs import materializes_operands
from jaxaot._src.partition.step.ordering import eval_backward
from jaxaot._src.partition.step.rederive import rederive_backward
from jaxaot._src.partition.step.residual_slices import residual_readers, slice_residual_reads


def recomputation_inputs(backward: Any, num_cotangents: int) -> set[int]:
    """Positions (among the residuals) of the backward's residual inputs that its recomputed eqns read.

    An eqn is recomputation when no cotangent reaches it (a call or loop counts
    as one eqn). Costs one pass over the backward's top-level eqns.
    """
    jaxpr = C.jaxpr_of(backward)
    reached = set(map(id, jaxpr.invars[:num_cotangents]))
    position = {id(v): i for i, v in enumerate(jaxpr.invars[num_cotangents:])}
    read: set[int] = set()
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not C.is_literal(v)]
        if any(id(v) in reached for v in ins):
            reached.update(id(v) for v in eqn.outvars)
        else:
            read.update(position[id(v)] for v in ins if id(v) in position)
    return read


def library_kernel_residuals(part: Any, num_cotangents: int) -> set[int]:
    """Positions (among the residuals) of those a library kernel (a cuDNN convolution,
    :func:`jaxaot._src.partition.materializes_operands`) reads or writes, in the forward or the
    backward (top-level eqns). The backend picks such a kernel's operand layouts (NHWC for cuDNN);
    pinning them row-major adds a transpose on each side (``docs/concepts/fused_step.md``, "Residual
    layouts").
    """
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    touched = {id(v) for j in (fwd, bwd) for e in j.eqns if materializes_operands(e)
               for v in (*e.invars, *e.outvars) if not C.is_literal(v)}
    residual_vars = bwd.invars[num_cotangents:]
    produced = [fwd.invars[i] for i in part.saved_inputs] + [fwd.outvars[i] for i in part.saved_outputs]
    return {i for i, (a, b) in enumerate(zip(produced, residual_vars)) if id(a) in touched or id(b) in touched}


def read_orders(backward: Any, num_cotangents: int) -> dict[int, tuple[int, ...]]:
    """``{position among the residuals: major-to-minor order}`` for the residuals that the backward
    reads only through transposes of one permutation (and does not return): stored in that order,
    each transpose reads them row-major (a bitcast). Top-level eqns; the others are absent.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.partition.step import read_orders
        >>> bwd = jax.make_jaxpr(lambda g, s, w: (g * s.T, w @ g))(jnp.ones((3, 2)), jnp.ones((2, 3)),
        ...                                                         jnp.ones((3, 3)))
        >>> read_orders(bwd, 1)  # s is read only as s.T; w by a matmul
        {0: (1, 0)}
    """
    out = {}
    for i, eqns in enumerate(residual_readers(backward, num_cotangents)):
        perms = {tuple(e.params["permutation"]) if e is not None and e.primitive.name == "transpose" else None
                 for e in eqns}
        if len(perms) == 1 and None not in perms:
            out[i] = perms.pop()
    return out


#: The values of :func:`step_program`'s options ``barrier``, ``layouts`` and ``order``.
BARRIERS, LAYOUTS, ORDERS = ("all", "recomputed", "none"), ("auto", "pinned"), ("xla", "consume_first")
#: Backends whose layout assignment can differ from row-major inside one program (CPU's does not), where
#: ``layouts`` matters.
LAYOUT_CHOICE_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})


def layout_choice_platforms() -> frozenset[str]:
    """:data:`LAYOUT_CHOICE_PLATFORMS`, read when asked: the one place every layer reads it from, so that a test
    standing the CPU in for an accelerator changes it here alone."""
    return LAYOUT_CHOICE_PLATFORMS


def pinned_layouts(part: Any, num_cotangents: int) -> dict[int, tuple[int, ...] | None]:
    """``{position among the residuals: major-to-minor order}`` of the residuals ``layouts="pinned"``
    pins: every one but those a library kernel reads or writes (:func:`library_kernel_residuals`),
    row-major (None) unless the backward reads a forward value only transposed (:func:`read_orders`).
    Inputs arrive row-major and stay alive: another order would be a second, transposed copy."""
    library = library_kernel_residuals(part, num_cotangents)
    orders = read_orders(part.backward, num_cotangents)
    n_in, n = len(part.saved_inputs), len(part.saved_inputs) + len(part.saved_outputs)
    return {i: orders.get(i) if i >= n_in else None for i in range(n) if i not in library}


def barred_residuals(part: Any, barrier: str) -> set[int]:
    """Positions (among the residuals of the partition ``part``) that ``barrier`` passes through
    ``optimization_barrier``: none when nothing is recomputed or ``barrier="none"`` (XLA may then
    optimize across, as in ``jit(value_and_grad)``), those the recomputation reads for
    ``"recomputed"``, every one for ``"all"``."""
    if not part.recomputed or barrier == "none":
        return set()
    if barrier == "recomputed":
        return recomputation_inputs(part.backward, len(part.cotangent_outputs))
    return set(range(len(part.saved_inputs) + len(part.saved_outputs)))


def step_program(part: Any, in_avals: Sequence[Any], out_avals: Sequence[Any], *, computed_outputs: Sequence[int],
                 value_leaf: int = 0, grad_pins: Sequence[Any] | None = None,
                 out_pins: Sequence[Any] | None = None, barrier: str = "all",
                 layouts: str = "auto", order: str = "xla", slices: bool = True, rederive: bool = False) -> Any:
    """The closed jaxpr ``inputs -> (outputs..., grads...)`` of one step of the partition ``part``.

    ``in_avals``: the inputs'; ``out_avals``: the joint graph's outputs' (the cotangents' types);
    ``computed_outputs``: the outputs the step returns (the others are inputs returned unchanged);
    ``grad_pins``: per gradient, a sharding it is constrained to, or None; ``out_pins``: the same per computed
    output (``aot_function``'s ``out_shardings``);
    ``value_leaf`` the output whose cotangent is 1 (the loss); ``barrier``
    which residuals pass through ``optimization_barrier``: ``"all"``,
    ``"recomputed"`` (those the recomputation reads) or ``"none"`` (XLA may
    then merge recomputed eqns with the forward's, saving more than the plan);
    ``layouts``: ``"auto"`` lets XLA choose the residuals' layouts,
    ``"pinned"`` pins them (:func:`pinned_layouts`): to the layout they have between two
    executables (row-major), or, where the backward reads a forward value only through one
    transpose, to that transpose's order;
    ``order``: ``"xla"`` leaves the backward's order to XLA, ``"consume_first"`` makes every
    recomputed matmul operand be used before its residuals are read again
    (:mod:`jaxaot._src.partition.step.ordering`); ``slices``: residuals behind the barrier that the backward
    only slices pass it as their slices (:mod:`jaxaot._src.partition.step.residual_slices`); ``rederive``: the
    backward derives again the residuals it can through an order-free reduction, and they are not
    passed (:mod:`jaxaot._src.partition.step.rederive`).
    """
    cts = [(i, out_avals[i]) for i in part.cotangent_outputs]
    pins = list(grad_pins) if grad_pins is not None else [None] * len(C.jaxpr_of(part.backward).outvars)
    n_res = len(part.saved_inputs) + len(part.saved_outputs)
    lean = rederive_backward(part, len(cts)) if rederive else None
    passed = lean.kept if lean is not None else tuple(range(n_res))
    barred = barred_residuals(part, barrier)
    behind = {j for j, k in enumerate(passed) if k in barred}

    for name, value, allowed in (("barrier", barrier, BARRIERS), ("layouts", layouts, LAYOUTS),
                                 ("order", order, ORDERS)):
        if value not in allowed:
            raise InvalidValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}.")
    layout_of = pinned_layouts(part, len(cts)) if layouts == "pinned" else {}
    backward = lean.backward if lean is not None else part.backward
    sliced = slice_residual_reads(backward, len(cts), behind) if slices and behind else None
    backward = sliced.backward if sliced is not None else backward

    def step(*leaves: Any) -> list:
        fwd = C.eval_closed(part.forward, *leaves)
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd[i] for i in part.saved_outputs]
        residuals = [C.pin_layout(r, layout_of[i]) if i in layout_of else r for i, r in enumerate(residuals)]
        residuals = [residuals[k] for k in passed]
        owner = list(range(len(residuals)))
        if sliced is not None:
            residuals, owner = sliced.expand(residuals)
        kept = [r for r, i in zip(residuals, owner) if i in behind]
        kept = iter(jax.lax.optimization_barrier(kept) if kept else [])
        residuals = [next(kept) if i in behind else r for r, i in zip(residuals, owner)]
        unit = [jax.numpy.full(a.shape, 1 if i == value_leaf else 0, a.dtype) for i, a in cts]
        if order == "consume_first" and part.recomputed:
            grads = eval_backward(backward, len(cts), *unit, *residuals)
        else:
            grads = C.eval_closed(backward, *unit, *residuals)
        grads = [g if s is None else C.pin_sharding(g, s) for g, s in zip(grads, pins)]
        outs = [fwd[i] for i in computed_outputs]
        if out_pins is not None:
            outs = [o if s is None else C.pin_sharding(o, s) for o, s in zip(outs, out_pins)]
        return outs + grads

    return jax.make_jaxpr(step)(*in_avals)
