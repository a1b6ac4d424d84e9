"""Trace a user function to its flat primal jaxpr.

Calls (``jax.jit`` inside the function, closed calls) are inlined and the
user's ``decompositions`` applied, inside loop and cond bodies too, so that the
later stages see one flat program of the operations they cost.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed, out_tree = trace_primal(lambda x: jax.jit(jnp.sin)(x), [jax.ShapeDtypeStruct((3,), jnp.float32)])
    >>> [str(e.primitive) for e in closed.jaxpr.eqns]
    ['sin']
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import flatten_checked, is_python_scalar
from jaxaot._src.python_reads import is_library_file
from jaxaot.errors import InvalidOutputError

Decompositions = Mapping[Any, Callable[..., Any]]


# --------------------------------------------------------------------------- inlining
def inline_eval(closed: Any, args: Sequence[Any], decompositions: Decompositions | None, site: Any = None) -> list:
    """Evaluate ``closed`` in the current trace, inlining calls and applying decompositions. The equations of a
    library's jitted function (``jnp.where``) take the call's own source info, ``site``: JAX's cached jaxpr of
    it keeps the line of whichever code first called it."""
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
            inner = site or (eqn.source_info.traceback if is_library_file(C.call_source_file(eqn)) else None)
            outs = inline_eval(body, invals, decompositions, inner)
        elif decompositions and eqn.primitive in decompositions:
            outs = decompositions[eqn.primitive](*invals, **eqn.params)
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
        elif decompositions and _decomposes_inside(eqn, decompositions):
            # Loop and cond bodies get the decompositions too, so that the
            # partitioner sees the same operations in a scanned layer as in an
            # unrolled one.
            params = C.map_subjaxprs(eqn, lambda body: _decompose_body(body, decompositions))
            outs = C.bind_eqn(eqn, invals, params, site)
        else:
            outs = C.bind_eqn(eqn, invals, traceback=site)
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
    return [jax.numpy.asarray(x) if (is_python_scalar(x) or isinstance(x, np.ndarray)) else x for x in leaves], tree


_LEAVES = inspect.Signature([inspect.Parameter("leaves", inspect.Parameter.VAR_POSITIONAL)])


def trace_primal(flat_fn: Callable[..., Any], in_avals: Sequence[Any], decompositions: Decompositions | None = None):
    """Trace ``flat_fn(*leaves) -> pytree`` to a flat primal jaxpr and its output tree."""
    out_tree_box: list = []

    def wrapped(*leaves):
        outs, tree = _check_outputs(flat_fn(*leaves))
        out_tree_box.append(tree)
        return outs

    # JAX names the function it traces by what ``__wrapped__`` leads to (the user's, where ``flat_fn`` says),
    # and its arguments by this signature: the flat leaves, never the user's arguments miscounted.
    wrapped.__wrapped__, wrapped.__signature__ = flat_fn, _LEAVES
    closed = jax.make_jaxpr(wrapped)(*in_avals)
    return flatten_program(closed, in_avals, decompositions), out_tree_box[0]
