"""``lax.while_loop`` in traced programs replaced by jaxaot's loop: :func:`differentiable`.

Libraries reach JAX's ``while`` primitive however they spell their loops, often
from inside a ``jax.jit`` cached before, so the rewrite works on the traced program:
:func:`differentiable` replaces every ``while`` eqn, inside nested jaxprs too
(:func:`rewrite_jaxpr`), by a :data:`~jaxaot._src.loops.common.while_loop_p` with the
given :class:`LoopOptions`. A ``while`` inside a primitive with rules of its own (a
Pallas kernel, ``custom_vmap``) is a :class:`~jaxaot.errors.LoopRewriteError`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def library_sqrt(a):  # third-party code, already jitted
    ...     return jax.jit(lambda a: jax.lax.while_loop(lambda x: abs(x * x - a) > 1e-5,
    ...                                                  lambda x: 0.5 * (x + a / x), a))(a)
    >>> round(float(jax.grad(differentiable(library_sqrt, max_steps=64))(4.0)), 3)
    0.25
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot.errors import LoopFunctionError, LoopRewriteError
from jaxaot._src.loops.common import Loop, check_options, trace_flat, while_loop_p
from jaxaot._src.loops.offline import check_body
from jaxaot._src.loops.rules import gate, lane_select


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How the rewritten loops store their iterations for reverse mode (``jaxaot.loops.while_loop``'s options)."""

    max_steps: int | None = None
    checkpoints: int | None = None
    checkpoint_memory: str = "device"

    def check(self, who: str) -> "LoopOptions":
        """Raise :class:`~jaxaot.errors.InvalidLoopOptionError` for a bad option (``who`` names the caller)."""
        check_options(self.max_steps, self.checkpoints, self.checkpoint_memory, who=who)
        if self.max_steps is not None and self.checkpoints is not None:
            check_body(who, self.max_steps, self.checkpoints, self.checkpoint_memory, effects=None)
        return self

    def key(self) -> str:
        return f"max_steps={self.max_steps},checkpoints={self.checkpoints},memory={self.checkpoint_memory}"


# --------------------------------------------------------------------------- one while
def _batched_pred_loop(cond: Any, body: Any, nc: int, nb: int) -> tuple[Callable, Callable]:
    """``(cond, body)`` of a ``while`` whose condition vmap batched (a predicate per lane): run while
    any lane runs, keep a finished lane's carry and cut its derivative."""
    def new_cond(*a):
        return [jnp.any(C.eval_closed(cond, *a[:nc], *a[nc + nb:])[0])]

    def new_body(*a):
        carry = a[nc + nb:]
        live = C.eval_closed(cond, *a[:nc], *carry)[0]
        out = C.eval_closed(body, *a[nc:nc + nb], *[gate(live, x) for x in carry])
        return [lane_select(live, new, old) for new, old in zip(out, carry)]

    return new_cond, new_body


def while_loop_params(params: dict, options: LoopOptions, where: str = "") -> dict:
    """The :data:`~jaxaot._src.loops.common.while_loop_p` params of a ``while`` eqn's ``params`` (its operands,
    ``cond consts + body consts + carry``, stay as they are), nested loops rewritten too."""
    nc, cond, nb, body = C.while_parts(params)
    cond, body = rewrite_jaxpr(cond, options), rewrite_jaxpr(body, options)
    avals = [*C.in_avals_of(cond)[:nc], *C.in_avals_of(body)]
    pred = C.out_avals_of(cond)[0]
    if pred.shape:  # a per-lane predicate: every carry is batched along its leading axis
        if any(tuple(a.shape[:pred.ndim]) != tuple(pred.shape) for a in C.out_avals_of(body)):
            raise LoopRewriteError(f"a vmapped while_loop{where} has a carry without the predicate's batch axis "
                                   f"{pred.shape}: it cannot become jaxaot's loop.")
        new_cond, new_body = _batched_pred_loop(cond, body, nc, nb)
    else:
        def new_cond(*a):
            return C.eval_closed(cond, *a[:nc], *a[nc + nb:])

        def new_body(*a):
            return C.eval_closed(body, *a[nc:])
    loop = Loop(while_loop_p, trace_flat(new_body, avals), trace_flat(new_cond, avals), nc + nb,
                len(C.out_avals_of(body)), max_steps=options.max_steps, checkpoints=options.checkpoints,
                checkpoint_memory=options.checkpoint_memory)
    if options.max_steps is not None and options.checkpoints is not None:
        check_body(f"the while_loop{where}", options.max_steps, options.checkpoints, options.checkpoint_memory,
                   loop.effects())
    return loop.params()


# --------------------------------------------------------------------------- jaxprs
def _rewrite_value(value: Any, options: LoopOptions) -> Any:
    """A param value with the jaxprs in it rewritten (closed, open, or tuples of them)."""
    if isinstance(value, C.ClosedJaxpr):
        return rewrite_jaxpr(value, options)
    if isinstance(value, C.Jaxpr):
        return _rewrite_open(value, options)
    if isinstance(value, tuple) and value and any(isinstance(v, (C.ClosedJaxpr, C.Jaxpr)) for v in value):
        items = [_rewrite_value(v, options) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _rewrite_open_with_consts(jaxpr: Any, consts: Sequence[Any], options: LoopOptions) -> tuple[Any, list]:
    closed = rewrite_jaxpr(C.close(jaxpr, consts), options)
    return C.jaxpr_of(closed), C.consts_of(closed)


#: The primitives whose jaxprs the rewrite enters: calls, control flow, ``jax.checkpoint``, custom derivatives
#: (primal and rule jaxprs), ``shard_map``, ``custom_linear_solve`` and jaxaot's loops. Another primitive's
#: jaxprs obey rules of their own (a Pallas kernel, ``custom_vmap``'s batching rule): a ``while`` there is
#: left alone, and :func:`check_rewritten` refuses the program.
TRANSPARENT = frozenset({
    "pjit", "jit", "closed_call", "core_call", "cond", "scan", "while", "checkpoint", "remat", "remat2",
    "custom_jvp_call", "custom_vjp_call", "shard_map", "custom_linear_solve", "while_loop", "while_loop_stack_output",
    "counted_loop",
})


def _rewrite_eqn(eqn: Any, options: LoopOptions) -> Any:
    if str(eqn.primitive) not in TRANSPARENT:
        return eqn
    if eqn.primitive is C.lax_while_p:
        params = while_loop_params(eqn.params, options, f" at {C.eqn_source(eqn)}")
        effects = Loop(while_loop_p, params["body_jaxpr"], params["cond_jaxpr"], params["num_consts"],
                       len(eqn.outvars)).effects()
        return C.new_eqn(eqn.invars, eqn.outvars, while_loop_p, params, effects, eqn)
    params = {k: _rewrite_value(v, options) for k, v in eqn.params.items()}
    custom = C.custom_rule_params(eqn.primitive, params,
                                  functools.partial(_rewrite_open_with_consts, options=options))
    params = custom if custom is not None else params
    if all(params[k] is eqn.params[k] for k in params):
        return eqn
    return eqn.replace(params=params)


def _rewrite_open(jaxpr: Any, options: LoopOptions) -> Any:
    eqns = [_rewrite_eqn(e, options) for e in jaxpr.eqns]
    return jaxpr if all(a is b for a, b in zip(eqns, jaxpr.eqns)) else C.replace_eqns(jaxpr, eqns)


@C.weakref_lru_cache
def _rewrite_closed(closed: Any, options: LoopOptions) -> Any:
    jaxpr = _rewrite_open(C.jaxpr_of(closed), options)
    return closed if jaxpr is C.jaxpr_of(closed) else C.close(jaxpr, C.consts_of(closed))


def rewrite_jaxpr(closed: Any, options: LoopOptions) -> Any:
    """``closed`` with every ``while`` eqn, at any depth, jaxaot's loop with ``options`` (memoized per
    jaxpr, so a library's cached jaxprs give the same rewritten ones, and compile caches hit)."""
    return _rewrite_closed(closed, options)


def _while_holders(closed: Any, path: tuple = ()) -> list[str]:
    """Where ``while`` eqns remain: the chain of primitives holding each, with source lines."""
    found = []
    for eqn in C.jaxpr_of(closed).eqns:
        here = (*path, f"{eqn.primitive} ({C.eqn_source(eqn)})")
        if eqn.primitive is C.lax_while_p:
            found.append(" > ".join(here))
        for sub in C.eqn_subjaxprs(eqn):
            found += _while_holders(sub, here)
    return found


def check_rewritten(closed: Any, who: str) -> None:
    """Raise :class:`~jaxaot.errors.LoopRewriteError` if a ``while`` eqn is left in ``closed``."""
    left = _while_holders(closed)
    if left:
        raise LoopRewriteError(
            f"{who}: {len(left)} lax.while_loop(s) could not be replaced by jaxaot's loop: "
            + "; ".join(left[:3]) + ". They sit in a primitive whose jaxprs the rewrite does not reach; "
            "call jaxaot.loops.while_loop there, or differentiate outside that primitive.")


# --------------------------------------------------------------------------- the transform
def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, C.Tracer)) or hasattr(x, "__jax_array__") or type(x).__module__ == "numpy"


def differentiable(fn: Callable, *, max_steps: int | None = None, checkpoints: int | None = None,
                   checkpoint_memory: str = "device") -> Callable:
    """``fn`` with every ``lax.while_loop`` it runs replaced by ``jaxaot.loops.while_loop(max_steps=...,
    checkpoints=..., checkpoint_memory=...)``, wherever and however it is called (see the module
    docstring); the forward results are ``fn``'s.

    Each call traces ``fn`` (array leaves of the arguments traced, other leaves static, as
    ``equinox.filter_jit`` splits them), rewrites the program and evaluates it in the caller's
    trace, so ``jax.grad``, ``jax.jit`` and ``jax.vmap`` compose with it in any order. Options are
    checked here (:class:`~jaxaot.errors.InvalidLoopOptionError`).
    """
    if not callable(fn):
        raise LoopFunctionError(f"differentiable: fn must be callable, got {type(fn).__name__} ({fn!r:.60}).")
    options = LoopOptions(max_steps, checkpoints, checkpoint_memory).check("differentiable")

    @functools.wraps(fn)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        return call_rewritten(fn, options, "differentiable", args, kwargs)

    return transformed


def call_rewritten(fn: Callable, options: LoopOptions, who: str, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` traced, its loops rewritten with ``options``, and evaluated here."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    traced = [_is_array(x) for x in leaves]
    box: list = []

    def flat(*dynamic):
        it = iter(dynamic)
        a, kw = jax.tree_util.tree_unflatten(treedef, [next(it) if t else x for x, t in zip(leaves, traced)])
        out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*a, **kw))
        out_traced = [_is_array(x) for x in out_leaves]
        box.append((out_tree, out_traced, out_leaves))
        return [x for x, t in zip(out_leaves, out_traced) if t]

    dynamic = [x for x, t in zip(leaves, traced) if t]
    closed = rewrite_jaxpr(jax.make_jaxpr(flat)(*dynamic), options)
    check_rewritten(closed, who)
    outs = iter(C.eval_closed(closed, *dynamic))
    out_tree, out_traced, out_leaves = box[0]
    return jax.tree_util.tree_unflatten(out_tree, [next(outs) if t else x for x, t in zip(out_leaves, out_traced)])


__all__ = ["LoopOptions", "call_rewritten", "check_rewritten", "differentiable", "rewrite_jaxpr",
           "while_loop_params"]
