"""Eager gradients that go straight to the compiled executables.

``jax.value_and_grad(aot_fn)`` works, but in eager mode JAX's own autodiff
machinery (linearize, ``custom_vjp`` bookkeeping, transposition) costs about as
much per call as the executables themselves on small functions. These
drop-in versions run the compiled forward and backward directly when every
argument is a concrete array, and defer to ``jax.value_and_grad`` otherwise
(under ``jit``, ``vmap``, or for functions that are not :class:`AOTFunction`).

A plain function whose differentiated argument knows how to differentiate a
function of itself (:class:`DifferentiatesItself`: ``jaxaot.aot_module``'s
``AOTModule``) is handed to that argument, which compiles the function with
its module (:mod:`jaxaot.nn.eager_grad`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import jax

from jaxaot import _compat as C
from jaxaot.runtime.function import AOTFunction
from jaxaot.runtime.fused import run_fused
from jaxaot.runtime.signature import TraceKind


@runtime_checkable
class DifferentiatesItself(Protocol):
    """An argument that runs ``value_and_grad`` of a function of itself through its own programs.

    :func:`value_and_grad` hands it the call when it is the one differentiated
    argument of a function that is not an :class:`AOTFunction`. It returns what
    ``nnx.value_and_grad(fun, argnums=position, has_aux=has_aux)(*args, **kwargs)``
    returns (``jaxaot.AOTModule`` implements it).
    """

    def jaxaot_value_and_grad(self, fun: Callable[..., Any], position: int, args: tuple, kwargs: dict,
                              has_aux: bool, fused: bool) -> Any:
        ...


def self_differentiating(fun: Callable[..., Any], argnums: Any, has_aux: bool, fused: bool,
                         fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback`` (a ``value_and_grad`` of ``fun``), except when the one differentiated argument
    (``argnums`` an int or a 1-tuple) is :class:`DifferentiatesItself`: then that argument runs the
    call, and with a 1-tuple ``argnums`` the gradients come in a 1-tuple, as JAX and Flax return them.
    ``jaxaot.value_and_grad`` and :func:`jaxaot.nn.patch_value_and_grad` dispatch through it."""
    as_tuple = isinstance(argnums, (tuple, list))
    position = argnums[0] if as_tuple and len(argnums) == 1 else argnums
    if isinstance(position, bool) or not isinstance(position, int):  # DiffState, several argnums: not ours
        return fallback

    def vg(*args: Any, **kwargs: Any):
        if 0 <= position < len(args) and isinstance(args[position], DifferentiatesItself):
            out, grads = args[position].jaxaot_value_and_grad(fun, position, args, kwargs, has_aux, fused)
            return out, ((grads,) if as_tuple else grads)
        return fallback(*args, **kwargs)

    return vg


def _is_real_scalar_loss(programs: Any, has_aux: bool) -> bool:
    """Whether the outputs are what ``jax.grad`` differentiates: a real scalar, or a ``(scalar, aux)`` pair.

    Anything else goes to ``jax.value_and_grad`` itself, which raises its own error.
    """
    tree = jax.tree_util.tree_unflatten(programs.out_tree, list(range(programs.out_tree.num_leaves)))
    if has_aux:
        if not (isinstance(tree, (tuple, list)) and len(tree) == 2 and isinstance(tree[0], int)):
            return False
    elif not isinstance(tree, int):
        return False
    aval = C.out_avals_of(programs.primal)[0]
    return aval.shape == () and bool(jax.numpy.issubdtype(aval.dtype, jax.numpy.floating))


def _normalize_argnums(argnums: int | Sequence[int]) -> tuple[tuple[int, ...], bool]:
    if isinstance(argnums, int):
        return (argnums,), True
    return tuple(argnums), False


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *, fused: bool = True
) -> Callable[..., Any]:
    """Like ``jax.value_and_grad``, with an eager fast path for :class:`AOTFunction`.

    For a plain ``fun`` whose differentiated argument is a ``jaxaot.aot_module``
    (``loss_fn(aot_model, x, y)``), it behaves as ``nnx.value_and_grad``: the
    gradient is an ``nnx.State`` of the module's parameters, and the state the
    call changes is written back. Eagerly, ``fun`` is then traced once per
    signature together with the module and runs as one compiled step (Python
    side effects in ``fun`` happen when it is traced, as in the module's own
    call); under ``jit`` it is ``nnx.value_and_grad``.

    Args:
      fun, argnums, has_aux: as ``jax.value_and_grad``'s.
      fused: run one executable that computes the forward and then the
        backward, keeping the partition's plan (:mod:`jaxaot.runtime.fused`);
        False runs the split forward and backward executables. ``cache_info()``
        lists which were compiled (``fused`` or ``forward``/``backward``).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
        >>> loss, dw = jaxaot.value_and_grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3)))
        >>> dw.shape
        (3, 2)
    """
    fallback = jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux)
    if not isinstance(fun, AOTFunction):
        return self_differentiating(fun, argnums, has_aux, fused, fallback)
    nums, single = _normalize_argnums(argnums)

    def training_for(programs, leaves, args):
        # The flat leaves are the dynamic arguments' leaves in order (then kwargs'):
        # mark the ranges of the picked arguments, by position (the same array may be
        # passed twice, once differentiated and once not).
        mask, start = [False] * len(leaves), 0
        for i, a in enumerate(args):
            if i in fun.static_argnums:
                continue
            size = len(jax.tree_util.tree_leaves(a))
            if i in nums:
                mask[start:start + size] = [True] * size
            start += size
        return programs.training(tuple(mask))

    # id(programs) -> (programs, training or None): what each signature runs. The
    # differentiated leaves are fixed by the signature, so this is decided once per signature.
    plans: dict[int, tuple[Any, Any]] = {}

    def plan_for(programs, leaves, args):
        plan = plans.get(id(programs))
        if plan is None:
            ok = all(n < len(args) and n not in fun.static_argnums for n in nums) and all(
                C.is_inexact(jax.numpy.result_type(x)) for n in nums for x in jax.tree_util.tree_leaves(args[n]))
            ok = ok and _is_real_scalar_loss(programs, has_aux)
            plan = plans[id(programs)] = (programs, training_for(programs, leaves, args) if ok else None)
        return plan[1]

    def vg(*args: Any, **kwargs: Any):
        programs, leaves, kind = fun.lookup(args, kwargs)
        if kind is not TraceKind.CONCRETE:
            return fallback(*args, **kwargs)
        tr = plan_for(programs, leaves, args)
        if tr is None:
            return fallback(*args, **kwargs)  # JAX's own error for bad argnums or integer inputs
        value_leaf = 0  # the loss: the only leaf, or the first of a (value, aux) pair
        if fused and not tr.joint.num_aux:
            outs, grads = run_fused(tr, leaves, value_leaf)
        else:
            outs, residuals = tr.forward(leaves, concrete=True)
            grads = tr.backward(residuals, tr.unit_cotangents(value_leaf), concrete_residuals=True)
        dyn, _ = tr.input_grads_tree(grads)
        dyn_pos = [i for i in range(len(args)) if i not in fun.static_argnums]
        picked = tuple(dyn[dyn_pos.index(n)] for n in nums)
        out_tree = jax.tree_util.tree_unflatten(programs.out_tree, outs)
        grad = picked[0] if single else picked
        if has_aux:
            value, aux = out_tree
            return (value, aux), grad
        return out_tree, grad

    def lower(*args: Any, **kwargs: Any):
        """The :class:`AOTLowered` of the programs this gradient runs."""
        programs, leaves, _ = fun.lookup(args, kwargs)
        return fun.lowered(training_for(programs, leaves, args))

    vg.__wrapped__ = fun
    vg.lower = lower
    return vg


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *,
         fused: bool = True) -> Callable[..., Any]:
    """Like ``jax.grad``, with the eager fast path of :func:`value_and_grad`.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sum(x ** 2))
        >>> jaxaot.grad(f)(jnp.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
    """
    vg = value_and_grad(fun, argnums=argnums, has_aux=has_aux, fused=fused)

    def g(*args: Any, **kwargs: Any):
        value, gr = vg(*args, **kwargs)
        return (gr, value[1]) if has_aux else gr

    g.__wrapped__ = fun
    return g
