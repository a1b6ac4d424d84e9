"""Gradient hooks: functions of a cotangent that run inside the backward pass.

``jaxaot.grad_hook(x, hook)`` returns ``x``; in the backward, the total cotangent
of the value it returns becomes ``hook(cotangent)`` (PyTorch's ``Tensor.register_hook``).
The hook is an identity ``custom_vjp``, so it is traced into whatever backward is
built around it, never a host callback by itself. Hooks given in one call run in
order; a later call on the returned value is another identity, whose hooks run
first (the cotangent reaches it first), each hook seeing the whole cotangent of its
call's value however many times it is used. A hook returning another structure,
shape or dtype raises :class:`~jaxaot.errors.HookOutputError`. In a recorded
forward, steps are keyed by what the hooks do, so a new lambda per step does not
recompile.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.autograd.recorded.structure import structure_of
from jaxaot.errors import HookOutputError, InvalidInputError

Hook = Callable[[Any], Any]

_LOCK = threading.Lock()


def hook_name(hook: Any) -> str:
    """A readable name for a hook in error messages."""
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or type(hook).__name__
    return f"{getattr(hook, '__module__', '') or ''}.{name}".lstrip(".")


def check_like(expected: Any, got: Any, what: str) -> None:
    """Raise :class:`HookOutputError` unless ``got`` has ``expected``'s structure, shapes and dtypes."""
    exp_leaves, exp_tree = jax.tree_util.tree_flatten(expected)
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    if exp_tree != got_tree:
        raise HookOutputError(f"{what} returned a value of structure {got_tree}, but the cotangent it got has "
                              f"structure {exp_tree}: return a cotangent of the same structure.")
    for i, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        if not (hasattr(g, "shape") and hasattr(g, "dtype")) or (tuple(g.shape), g.dtype) != (tuple(e.shape), e.dtype):
            got_text = format_aval(g) if hasattr(g, "shape") and hasattr(g, "dtype") else type(g).__name__
            where = f" (leaf {i})" if len(exp_leaves) > 1 else ""
            raise HookOutputError(
                f"{what} returned {got_text}{where}, but the cotangent it got is {format_aval(e)}: a hook must return "
                "a cotangent of the same shape and dtype (cast with .astype, reshape, or broadcast it back).")


def as_hooks(hook: Any) -> tuple[Hook, ...]:
    """``hook`` (a callable, or a sequence of callables) as a tuple, each checked callable."""
    hooks = tuple(hook) if isinstance(hook, (list, tuple)) else (hook,)
    if not hooks:
        raise InvalidInputError("grad_hook got an empty list of hooks: pass a callable cotangent -> cotangent.")
    for h in hooks:
        if not callable(h):
            raise InvalidInputError(
                f"grad_hook's hook must be callable (cotangent -> cotangent), got a {type(h).__name__}: {h!r}.")
    return hooks


#: structures of traced hook programs -> the identity custom_vjp that evaluates them (bounded).
_PROGRAMS: "collections.OrderedDict[tuple, Callable]" = collections.OrderedDict()
_PROGRAMS_MAX = 256


def _identity_with_programs(traced: Sequence[tuple[Any, list]]) -> Callable[[list, list], list]:
    """The identity ``custom_vjp`` of ``(leaves, consts)`` whose backward runs the hook programs in order."""
    programs = tuple(p for p, _ in traced)
    key = tuple(structure_of(p).key for p in programs)
    with _LOCK:
        identity = _PROGRAMS.get(key)
        if identity is not None:
            _PROGRAMS.move_to_end(key)
            return identity
    counts = [len(c) for _, c in traced]

    @jax.custom_vjp
    def identity(xs, consts):
        return xs

    def fwd(xs, consts):
        return xs, consts

    def bwd(consts, cts):
        start = 0
        for program, n in zip(programs, counts):
            cts = C.eval_closed(program, *consts[start:start + n], *cts)
            start += n
        return cts, [None] * len(consts)

    setattr(bwd, C.PRIMAL_IN_FORWARD_MODE, True)  # forward mode passes x through (an aot_function's jvp)
    identity.defvjp(fwd, bwd)
    with _LOCK:
        identity = _PROGRAMS.setdefault(key, identity)
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    return identity


def _trace_hooks(x: Any, hooks: Sequence[Hook]) -> list[tuple[Any, list]]:
    """Each hook traced on ``x``'s cotangent: ``(program, consts)`` per hook (each hook called once)."""
    leaves, tree = jax.tree_util.tree_flatten(x)
    avals = [C.typeof(leaf).to_tangent_aval() for leaf in leaves]
    out = []
    for h in hooks:
        def one(*cts, h=h):
            ct = jax.tree_util.tree_unflatten(tree, list(cts))
            new = h(ct)
            check_like(ct, new, f"gradient hook {hook_name(h)}")
            return jax.tree_util.tree_leaves(new)

        out.append(C.stage_function(one, avals))
    return out


def _apply_traced(x: Any, traced: Sequence[tuple[Any, list]]) -> Any:
    """:func:`grad_hook` inside a recorded forward: the identity whose backward runs ``traced``."""
    leaves, tree = jax.tree_util.tree_flatten(x)
    consts = [c for _, cs in traced for c in cs]
    return jax.tree_util.tree_unflatten(tree, _identity_with_programs(traced)(list(leaves), consts))


def grad_hook(x: Any, hook: Hook | Sequence[Hook]) -> Any:
    """``x`` unchanged; in the backward pass its cotangent becomes ``hook(cotangent)``.

    Forward mode (``jax.jvp``, ``jax.jacfwd``) computes no cotangent: there ``x`` passes through untouched, as
    it does for a reverse pass over a forward-mode derivative (``jax.jacrev(jax.jacfwd(f))``); ``jax.hessian``'s
    inner reverse pass runs the hook. ``jax.jvp`` of a plain ``jax.jit`` function with a hook inside meets JAX's
    ``custom_vjp`` error (JAX stages the function first): apply ``jax.jvp`` inside the ``jit``, or use an
    ``aot_function``, whose forward mode passes hooks through.

    Args:
      x: an array or pytree of arrays (concrete or traced).
      hook: ``cotangent -> cotangent`` (same structure, shapes and dtypes), or a
        list of them, run in order. Hooks are traced into the backward program. ``grad_hook(grad_hook(x, a), b)``
        runs ``b`` first: the cotangent reaches the outer call first.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> f = lambda x: jnp.sum(jaxaot.grad_hook(x, lambda g: 2 * g) ** 2)
        >>> jax.grad(f)(jnp.arange(3.0)).tolist()
        [0.0, 4.0, 8.0]
    """
    hooks = as_hooks(hook)
    leaves = jax.tree_util.tree_leaves(x)
    if any(C.is_forward_mode_tracer(leaf) for leaf in leaves):
        return x  # a jvp: no cotangent for a hook to see (custom_vjp, which carries the hooks, refuses jvp)
    if C.current_recording_trace() is None and not any(C.is_tracer(leaf) for leaf in leaves):
        return x  # concrete, outside any trace: no backward will see it
    # Traced now: in a recorded forward (each hook traced once) or a JAX trace (jit, grad, aot_function), where a
    # hook may read the forward's values, which become the backward's inputs.
    return _apply_traced(x, _trace_hooks(x, hooks))
