"""``while_loop`` you can differentiate in reverse mode, and its stacking variant.

``jaxaot.loops.while_loop`` is a drop-in for ``jax.lax.while_loop`` with the same
forward; ``max_steps`` and ``checkpoints`` only say how reverse mode stores the
carries (Note [while_loop autograd] in :mod:`jaxaot._src.loops.partial_eval`):
stack up to N iterations, keep k snapshots and recompute, or both (an offline
schedule, :mod:`jaxaot._src.loops.offline`). A loop that needs more than
``max_steps`` is a :class:`~jaxaot.errors.LoopOverflowError`, never silent; with
neither bound, reverse mode needs :func:`~jaxaot._src.loops.capacity.dynamic_capacity`.
Under ``jax.disable_jit`` the Python loop runs.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> def f(x):
    ...     return jaxaot.loops.while_loop(lambda c: c[1] < 10.0, lambda c: (c[0] + 1, c[1] * x), (0, 1.0), max_steps=64)
    >>> jax.grad(lambda x: f(x)[1])(2.0)
    Array(32., dtype=float32, weak_type=True)
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, leaf_paths
from jaxaot.errors import InvalidLoopOptionError, LoopCarryMismatchError, LoopFunctionError
from jaxaot._src.loops.common import check_options, check_positive, stack_loop, trace_flat, while_loop_p
from jaxaot._src.loops.invariant_casts import hoist_invariant_casts
from jaxaot._src.loops.offline import check_body
from jaxaot._src.loops.overflow import check_overflow, overflow_scale, poison, raise_if_overflowed

T = TypeVar("T")


# --------------------------------------------------------------------------- argument checks
def _check_callable(name: str, fn: Any) -> None:
    if not callable(fn):
        raise LoopFunctionError(f"while_loop: {name} must be callable, got {type(fn).__name__} ({fn!r:.60}).")


def _fmt(aval: Any) -> str:
    return format_aval(aval, short=False, weak=True)  # float32[3]{weak}


def _as_array(x: Any) -> Any:
    # Keeps Python scalars weakly typed, as lax.while_loop does.
    return x if isinstance(x, (jax.Array, C.Tracer)) else jnp.asarray(x)


# --------------------------------------------------------------------------- tracing
def _trace_fn(fn: Callable, treedef: Any, avals: list):
    """Trace ``fn(carry)`` on carry ``avals``: ``(closed jaxpr with consts as leading
    inputs, consts, output treedef)``."""
    box: list = []

    def flat(*leaves):
        out = fn(jax.tree_util.tree_unflatten(treedef, list(leaves)))
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        box.append(out_tree)
        return [_as_array(x) for x in out_leaves]

    closed = jax.make_jaxpr(flat)(*[C.abstract_input(a) for a in avals])  # inside shard_map, the variance kept
    jaxpr, consts = C.hoist_consts(closed)
    return jaxpr, consts, box[0]


def _check_cond(cond_jaxpr: Any, out_tree: Any) -> None:
    outs = C.out_avals_of(cond_jaxpr)
    if (not jax.tree_util.treedef_is_leaf(out_tree) or len(outs) != 1 or tuple(outs[0].shape) != ()
            or outs[0].dtype != np.bool_):  # a bare scalar, as lax.while_loop asks: not (pred,) nor {'p': pred}
        got = ", ".join(_fmt(a) for a in outs) or "nothing"
        raise LoopFunctionError(
            f"while_loop: cond_fun must return a boolean scalar, but it returned {got} "
            f"(pytree {out_tree})."
        )


def _carry_mismatch(init_tree: Any, out_tree: Any, in_avals: list, out_avals: list, paths: list[str]):
    if out_tree != init_tree:
        return LoopCarryMismatchError(
            f"while_loop: body_fun must return a carry with the structure of init_val, "
            f"but init_val is {init_tree} and body_fun returned {out_tree}."
        )
    for path, a, b in zip(paths, in_avals, out_avals):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return LoopCarryMismatchError(
                f"while_loop: body_fun changed the type of carry leaf {path}: init_val has "
                f"{_fmt(a)} but body_fun returned {_fmt(b)}. The carry must keep its shape and dtype."
            )
    return None


def _promote_weak(leaves: list, in_avals: list, out_avals: list) -> tuple[list, bool]:
    """Like lax.while_loop: a weakly typed init leaf whose dtype differs from the body's
    output takes their promoted dtype (a weak and a strong leaf of one dtype stay as they are)."""
    changed = False
    new = []
    for x, a, b in zip(leaves, in_avals, out_avals):
        if a.weak_type and a.dtype != b.dtype and tuple(a.shape) == tuple(b.shape):
            x = jax.lax.convert_element_type(x, jnp.result_type(x, b))
            changed = True
        new.append(x)
    return new, changed


def _dedup(consts: list) -> tuple[list, list[int]]:
    """Unique consts (by identity) and, per input const, its index among them."""
    seen: dict[int, int] = {}
    unique, index = [], []
    for c in consts:
        if id(c) not in seen:
            seen[id(c)] = len(unique)
            unique.append(c)
        index.append(seen[id(c)])
    return unique, index


def _trace_loop(cond_fun: Callable, body_fun: Callable, init_val: Any, stack: bool):
    """Trace both functions; returns ``(cond, body, consts, init leaves, treedef)``.

    ``cond`` maps ``(consts, carry) -> pred`` and ``body`` ``(consts, carry) -> carry``
    (``-> (carry, carry)`` when ``stack``, the second copy being the stacked output).
    """
    leaves, treedef = jax.tree_util.tree_flatten(init_val)
    leaves = [_as_array(x) for x in leaves]
    paths = leaf_paths(treedef, "init_val")
    for second_pass in (False, True):  # one more pass after promoting weakly typed init leaves, as lax
        avals = [jax.typeof(x) for x in leaves]
        cond_j, cond_c, cond_tree = _trace_fn(cond_fun, treedef, avals)
        _check_cond(cond_j, cond_tree)
        body_j, body_c, body_tree = _trace_fn(body_fun, treedef, avals)
        out_avals = C.out_avals_of(body_j)
        if body_tree != treedef:
            raise _carry_mismatch(treedef, body_tree, avals, out_avals, paths)
        if second_pass:
            break
        leaves, changed = _promote_weak(leaves, avals, out_avals)
        if not changed:
            break
    err = _carry_mismatch(treedef, body_tree, avals, out_avals, paths)
    if err is not None:
        raise err
    consts, index = _dedup([*cond_c, *body_c])
    cond_idx, body_idx = index[: len(cond_c)], index[len(cond_c):]
    const_avals = [jax.typeof(c) for c in consts]
    n = len(consts)

    def cond(*a):
        return C.eval_closed(cond_j, *[a[i] for i in cond_idx], *a[n:])

    def body(*a):
        out = C.eval_closed(body_j, *[a[i] for i in body_idx], *a[n:])
        return [*out, *out] if stack else out

    cond_j, body_j, consts = hoist_invariant_casts(trace_flat(cond, [*const_avals, *avals]),
                                                   trace_flat(body, [*const_avals, *avals]), consts)
    return cond_j, body_j, consts, leaves, treedef


def _disable_jit() -> bool:
    return bool(getattr(jax.config, "jax_disable_jit", False))


def _python_loop(cond_fun: Callable, body_fun: Callable, init_val: Any, max_rows: int | None):
    """The loop run eagerly (under ``jax.disable_jit``), rows stacked if ``max_rows``."""
    val = jax.tree_util.tree_map(_as_array, init_val)
    rows = []
    while cond_fun(val):
        if max_rows is not None and len(rows) == max_rows:
            raise_if_overflowed(True, max_rows)
        val = jax.tree_util.tree_map(_as_array, body_fun(val))
        if max_rows is not None:
            rows.append(val)
    return val, rows


def _stack_rows(rows: list, leaves: list, max_steps: int) -> list:
    """Per carry leaf, its values in ``rows`` stacked into ``max_steps`` rows (zeros after), weakly typed where the
    carry is, as the traced loop's rows are."""
    flat_rows = [jax.tree_util.tree_leaves(r) for r in rows]
    stacked = []
    for i, x in enumerate(leaves):
        buf = jnp.zeros((max_steps, *jnp.shape(x)), jnp.result_type(x))
        buf = buf.at[: len(rows)].set(jnp.stack([r[i] for r in flat_rows])) if rows else buf
        stacked.append(C.typed_as(buf, C.typeof(x)))
    return stacked


# --------------------------------------------------------------------------- public API
def while_loop(
    cond_fun: Callable[[T], Any],
    body_fun: Callable[[T], T],
    init_val: T,
    *,
    max_steps: int | None = None,
    checkpoints: int | None = None,
    checkpoint_memory: str = "device",
) -> T:
    """``lax.while_loop`` that reverse-mode differentiates.

    Runs ``while cond_fun(val): val = body_fun(val)`` and returns ``val``; arrays that
    the functions close over get gradients. ``max_steps`` / ``checkpoints`` choose
    how reverse mode stores the iterations (``docs/concepts/loops.md``, "Choosing a mode"), and
    ``checkpoint_memory="host"`` keeps the offline schedule's snapshots in host
    memory (``docs/concepts/loops.md``, "Host snapshots"); the forward result never depends on them.

    Example:
        >>> import jax, jaxaot
        >>> newton = lambda a: jaxaot.loops.while_loop(
        ...     lambda x: abs(x * x - a) > 1e-6, lambda x: 0.5 * (x + a / x), a, max_steps=50)
        >>> round(float(jax.grad(newton)(4.0)), 4)  # d sqrt(a) / da at 4
        0.25
    """
    _check_callable("cond_fun", cond_fun)
    _check_callable("body_fun", body_fun)
    check_options(max_steps, checkpoints, checkpoint_memory)
    cond, body, consts, leaves, treedef = _trace_loop(cond_fun, body_fun, init_val, stack=False)
    if max_steps is not None and checkpoints is not None:
        effects = C.join_effects(C.effects_of(cond), C.effects_of(body))
        check_body("while_loop", max_steps, checkpoints, checkpoint_memory, effects)
    if _disable_jit():
        # Reverse-differentiated, the loop overflows past max_steps as it does compiled; run forward, it runs on.
        reverse = any(C.is_differentiated(x) and not C.is_forward_mode_tracer(x) for x in (*consts, *leaves))
        try:
            return _python_loop(cond_fun, body_fun, jax.tree_util.tree_unflatten(treedef, leaves),
                                max_steps if reverse else None)[0]
        except jax.errors.ConcretizationTypeError:
            pass  # under vmap/jit transformations: fall back to the primitive
    outs = while_loop_p.bind(*consts, *leaves, cond_jaxpr=cond, body_jaxpr=body, num_consts=len(consts),
                             max_steps=max_steps, checkpoints=checkpoints, checkpoint_memory=checkpoint_memory)
    return jax.tree_util.tree_unflatten(treedef, list(outs))


def while_loop_stack_output(
    cond_fun: Callable[[T], Any],
    body_fun: Callable[[T], T],
    init_val: T,
    *,
    max_steps: int,
) -> tuple[T, jax.Array]:
    """Run the loop and stack the carry after each iteration: ``(stacked, num_steps)``.

    Each leaf of ``stacked`` has a leading axis of ``max_steps`` rows; row ``i`` is the
    carry after iteration ``i`` for ``i < num_steps``; later rows are zero (under ``vmap`` too, per lane).
    Running more than ``max_steps`` iterations raises
    :class:`~jaxaot.errors.LoopOverflowError` (under ``jit``: the inexact rows are
    NaN, and :func:`~jaxaot.loops.reraise_overflow` raises; see ``docs/concepts/loops.md``, "Overflow").

    Example:
        >>> import jaxaot
        >>> stacked, n = jaxaot.loops.while_loop_stack_output(lambda x: x < 3, lambda x: x + 1, 0, max_steps=5)
        >>> stacked.tolist(), int(n)
        ([1, 2, 3, 0, 0], 3)
    """
    _check_callable("cond_fun", cond_fun)
    _check_callable("body_fun", body_fun)
    if max_steps is None:
        raise InvalidLoopOptionError("while_loop_stack_output: max_steps is required (the number of rows).")
    check_positive("max_steps", max_steps, "while_loop_stack_output", optional=False)
    cond, body, consts, leaves, treedef = _trace_loop(cond_fun, body_fun, init_val, stack=True)
    if _disable_jit():
        try:
            init = jax.tree_util.tree_unflatten(treedef, leaves)
            _, rows = _python_loop(cond_fun, body_fun, init, max_steps)
            stacked = _stack_rows(rows, leaves, max_steps)
            return jax.tree_util.tree_unflatten(treedef, stacked), jnp.asarray(len(rows), jnp.int32)
        except jax.errors.ConcretizationTypeError:
            pass
    loop = stack_loop(cond, body, len(consts), len(leaves), max_steps)
    _, stacked, (num_steps, overflowed) = loop.split_out(loop.bind([*consts, *leaves]))
    check_overflow(overflowed, max_steps)
    stacked = poison(overflow_scale(overflowed), stacked)
    return jax.tree_util.tree_unflatten(treedef, stacked), num_steps


__all__ = ["while_loop", "while_loop_stack_output"]
