"""``jaxaot.value_and_grad`` and ``jaxaot.grad``: eager gradients that go straight to compiled programs.

They take ``jax.value_and_grad``'s arguments and dispatch on what is
differentiated: an ``aot_function`` runs its compiled forward and backward
(:mod:`jaxaot._src.autograd.direct.function_grad`); a loss whose one differentiated
argument is an ``aot_module`` is compiled with the module into one step
(:mod:`jaxaot._src.autograd.direct.module`); anything else goes to JAX or Flax
itself. Flax is imported only once a Flax module is seen.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Callable, Sequence, overload

import jax

from jaxaot._src import compat as C
from jaxaot._src.names import callable_name, named_as_gradient
from jaxaot._src.autograd.argnums import as_index, check_reduce_axes, normalize_argnums, parse_argnums, resolve_argnums
from jaxaot._src.autograd.grad_of import grad_of
from jaxaot._src.autograd.gradient_types import Gradient, StagedGradient
from jaxaot._src.autograd.direct.function_grad import function_value_and_grad
from jaxaot._src.loops import note_remedy, overflow_checked, overflow_mark
from jaxaot.errors import InvalidInputError
from jaxaot._src.runtime import AOTFunction, CacheInfo


_MODULE_STEP: list = []  # the module step, once imported


def _module_step() -> Any:
    """:mod:`jaxaot._src.autograd.direct.module` once Flax is loaded (else None: no Flax module exists)."""
    if _MODULE_STEP:
        return _MODULE_STEP[0]
    if "flax" not in sys.modules:
        return None
    # Deferred, within this package: the module step imports Flax and jaxaot._src.nn.
    from jaxaot._src.autograd.direct import module

    _MODULE_STEP.append(module)
    return module


def _built_on_first_call(build: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """``build()``'s function, built when first called: a training loop that writes
    ``jaxaot.value_and_grad(loss_fn)(model, ...)`` builds the gradient every step, and the
    module's compiled step never needs JAX's."""
    built: list = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not built:
            built.append(build())
        return built[0](*args, **kwargs)

    return call


def _overflow_checked(vg: Callable[..., Any]) -> Callable[..., Any]:
    """``vg`` raising :class:`~jaxaot.errors.LoopOverflowError` when the call returns if a ``max_steps`` loop it
    ran overflowed where JAX traced it (inside ``lax.cond``, ``lax.scan``, ``jax.checkpoint``, another loop), as an
    ``aot_function`` call does (:func:`jaxaot.loops.reraise_overflow`); JAX's refusal of a ``lax.while_loop``'s
    gradient says how jaxaot differentiates it."""
    def checked(*args: Any, **kwargs: Any) -> Any:
        mark = overflow_mark()
        try:
            return overflow_checked(mark, vg(*args, **kwargs))
        except ValueError as err:
            note_remedy(err)
            raise

    return checked


def module_dispatch(fun: Callable[..., Any], argnums: Any, has_aux: bool, fused: bool,
                    fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback`` (a ``value_and_grad`` of ``fun``), except when the one differentiated argument
    (``argnums`` an int or a 1-tuple) is an ``nnx.Module`` or holds one (a list of modules): then the call is an
    ``aot_module``'s compiled step, or ``nnx.value_and_grad`` otherwise, and with a 1-tuple ``argnums`` the gradients
    come in a 1-tuple, as JAX and Flax return them.
    :func:`value_and_grad` and :func:`~jaxaot.patch_value_and_grad` dispatch through it."""
    as_tuple = isinstance(argnums, (tuple, list))
    position = as_index(argnums[0] if as_tuple and len(argnums) == 1 else argnums)  # np.int64(1) as 1
    if position is None:  # DiffState, several argnums: Flax's or JAX's
        return _flax_where_a_module(fun, argnums, has_aux, fallback)
    ran: "weakref.WeakSet[AOTFunction]" = weakref.WeakSet()  # the loss programs this gradient ran
    last: list = [None]

    def vg(*args: Any, **kwargs: Any):
        step = _module_step()
        if step is not None and 0 <= position < len(args):
            if step.is_aot_module(args[position]):
                program = args[position].loss_program
                if program is not last[0]:
                    last[0] = program
                    ran.add(program)
                out, grads = step.module_value_and_grad(fun, position, args, kwargs, has_aux, fused)
                return out, ((grads,) if as_tuple else grads)
            if step.holds_flax_module(args[position]):  # a plain module, or modules in a list, tuple or dict
                return step.FLAX_VALUE_AND_GRAD(fun, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        return fallback(*args, **kwargs)

    def cache_info() -> CacheInfo:
        """The compile caches of the ``aot_module`` loss programs this gradient ran (``program``: ``loss``)."""
        programs = list(ran)
        labels = ["loss"] if len(programs) == 1 else [f"loss[{k}]" for k in range(len(programs))]
        return CacheInfo.combine({label: p.cache_info() for label, p in zip(labels, programs)})

    vg.cache_info = cache_info
    return vg


def _is_diff_state(argnums: Any) -> bool:
    """Whether ``argnums`` is Flax's ``nnx.DiffState`` (an argument and the Variables of it to differentiate)."""
    kind = type(argnums)
    return kind.__name__ == "DiffState" and kind.__module__.startswith("flax.") and isinstance(
        getattr(argnums, "argnum", None), int)


def _flax_where_a_module(fun: Callable[..., Any], argnums: Any, has_aux: bool,
                         fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``fallback``, or ``nnx.value_and_grad`` for a call whose differentiated arguments (``argnums`` a sequence)
    are or hold an ``nnx.Module``: its gradient is then an ``nnx.State``, as Flax gives, and the state the call changes
    is written back."""
    positions = tuple(n for n in map(as_index, argnums) if n is not None) if isinstance(argnums, (tuple, list)) else ()
    if _is_diff_state(argnums):  # Flax's own argnums: nnx.value_and_grad, which reads it
        return lambda *args, **kwargs: _module_step().FLAX_VALUE_AND_GRAD(fun, argnums=argnums, has_aux=has_aux)(
            *args, **kwargs)

    def vg(*args: Any, **kwargs: Any):
        step = _module_step()
        if step is not None and any(-len(args) <= n < len(args) and step.holds_flax_module(args[n])
                                    for n in positions):
            return step.FLAX_VALUE_AND_GRAD(fun, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        return fallback(*args, **kwargs)

    return vg


def _nothing_compiled() -> CacheInfo:
    """``cache_info()`` of a gradient that compiles nothing itself (``jax.value_and_grad`` runs it)."""
    return CacheInfo(0, 0, ())


def check_gradient_options(fun: Any, argnums: Any, has_aux: Any, fused: Any, who: str = "value_and_grad",
                           holomorphic: Any = False, allow_int: Any = False) -> None:
    """:class:`~jaxaot.errors.InvalidInputError` naming the first option of :func:`value_and_grad` of the
    wrong kind: ``fun`` not callable or a generator function, ``argnums`` not an integer or a non-empty sequence of
    distinct integers (``operator.index`` reads each, as JAX does: ``np.int64(1)`` is one; a bool is not),
    ``has_aux``, ``fused``, ``holomorphic`` or ``allow_int`` not a bool."""
    if not callable(fun):
        raise InvalidInputError(f"{who} expects a callable fun, got {type(fun).__name__} {fun!r}.")
    if not _is_diff_state(argnums):  # Flax's nnx.DiffState: nnx.value_and_grad's to check and run
        parse_argnums(argnums, who)
    if inspect.isgeneratorfunction(fun) or inspect.isasyncgenfunction(fun):  # JAX's TypeError, when built
        raise InvalidInputError(f"{who} expects a function that returns arrays, got a generator function ({fun!r}): "
                                "a generator cannot be traced. Return the values instead of yielding them.")
    for name, value in (("has_aux", has_aux), ("fused", fused), ("holomorphic", holomorphic),
                        ("allow_int", allow_int)):
        if not isinstance(value, bool):
            raise InvalidInputError(f"{name} of {who} must be True or False, got {type(value).__name__} {value!r}.")


def _argnums_checked_at_call(vg: Callable[..., Any], argnums: Any, who: str) -> Callable[..., Any]:
    """``vg``, checking first that ``argnums`` (an int or ints) is in range of the call's positional arguments and
    names each once (``(0, -2)`` of two arguments, as ``(0, 0)``): :class:`~jaxaot.errors.InvalidInputError`
    where ``jax.value_and_grad`` raises a bare ``TypeError`` or returns ``None`` for the repeated argument."""
    if _is_diff_state(argnums):
        return vg  # Flax's nnx.DiffState: nnx.value_and_grad's own checks
    nums, _ = parse_argnums(argnums, who)

    @C.api_boundary  # an error in the user's function shows the user's lines, as under jit
    def checked(*args: Any, **kwargs: Any) -> Any:
        resolve_argnums(nums, len(args), argnums, who)
        return vg(*args, **kwargs)

    checked.cache_info = vg.cache_info
    return checked


@overload
def value_and_grad(fun: AOTFunction, argnums: int | Sequence[int] = ..., has_aux: bool = ..., holomorphic: bool = ...,
                   allow_int: bool = ..., reduce_axes: Sequence[Any] = ..., *, fused: bool = ...) -> StagedGradient: ...


@overload
def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = ..., has_aux: bool = ...,
                   holomorphic: bool = ..., allow_int: bool = ..., reduce_axes: Sequence[Any] = ..., *,
                   fused: bool = ...) -> Gradient: ...


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
    allow_int: bool = False, reduce_axes: Sequence[Any] = (), *, fused: bool = True,
) -> Gradient:
    """Like ``jax.value_and_grad``, with an eager fast path for :class:`~jaxaot.AOTFunction`.

    For a plain ``fun`` whose differentiated argument is a ``jaxaot.nn.aot_module``
    (``loss_fn(aot_model, x, y)``), it behaves as ``nnx.value_and_grad``: the
    gradient is an ``nnx.State`` of the module's parameters, and the state the
    call changes is written back. Eagerly, ``fun`` is then traced once per
    signature together with the module and runs as one compiled step (Python
    side effects in ``fun`` happen when it is traced, as in the module's own
    call); under ``jit`` it is ``nnx.value_and_grad``.

    Args:
      fun, argnums, has_aux, holomorphic, allow_int, reduce_axes: as ``jax.value_and_grad``'s, in its order
        (``reduce_axes`` must be empty, as JAX requires; ``argnums`` may be Flax's
        ``nnx.DiffState``: the call is then ``nnx.value_and_grad``'s). With ``holomorphic`` or
        ``allow_int`` the call is ``jax.value_and_grad``'s (an ``aot_function`` inside it still runs its
        compiled programs, split: ``fused`` does not apply), with ``cache_info()`` that of ``fun`` where it has
        one, and for an ``aot_function`` ``lower()``, ``jax.jit``'s of that gradient.
      fused: run one executable that computes the forward and then the
        backward, keeping the partition's plan (``docs/concepts/fused_step.md``);
        False runs the split forward and backward executables. ``cache_info()``
        lists which were compiled (``fused`` or ``forward``/``backward``).

    The result has ``cache_info()``: the ``aot_function``'s, or that of the ``aot_module``
    loss programs it ran (labelled ``loss``); for other functions, which ``jax.value_and_grad``
    runs, nothing.

    Raises:
      InvalidInputError: ``fun`` is not callable or is a generator function, ``argnums`` is not an integer
        (``operator.index`` reads it, as JAX does) or a non-empty sequence of integers or names an argument twice
        (``(0, 0)``; ``(0, -2)`` at a call with two), ``has_aux``, ``fused``, ``holomorphic`` or ``allow_int`` is
        not a bool; a call whose ``argnums`` is out of range of its positional arguments (for any ``fun``).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
        >>> loss, dw = jaxaot.value_and_grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3)))
        >>> dw.shape
        (3, 2)
    """
    check_gradient_options(fun, argnums, has_aux, fused, holomorphic=holomorphic, allow_int=allow_int)
    check_reduce_axes(reduce_axes)
    argnums = normalize_argnums(argnums)  # np.int64(1) as 1, for the dispatch and the compiled paths
    return named_as_gradient(_value_and_grad(fun, argnums, has_aux, holomorphic, allow_int, fused), fun,
                             "Value and gradient", argnums)


def _value_and_grad(fun: Callable[..., Any], argnums: Any, has_aux: bool, holomorphic: bool, allow_int: bool,
                    fused: bool) -> Callable[..., Any]:
    if holomorphic or allow_int:
        vg = jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux, holomorphic=holomorphic, allow_int=allow_int)
        vg.cache_info = fun.cache_info if isinstance(fun, AOTFunction) else _nothing_compiled
        checked = _argnums_checked_at_call(vg, argnums, callable_name(fun))
        if isinstance(fun, AOTFunction):  # its stages, as an aot_function's gradient has them: jit's of this one
            checked.lower = jax.jit(_argnums_checked_at_call(vg, argnums, callable_name(fun))).lower
        return checked
    if isinstance(fun, AOTFunction):
        return function_value_and_grad(fun, argnums, has_aux, fused)
    vg = module_dispatch(fun, argnums, has_aux, fused, _built_on_first_call(
        lambda: _overflow_checked(jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux))))
    if not hasattr(vg, "cache_info"):
        vg.cache_info = _nothing_compiled
    return _argnums_checked_at_call(vg, argnums, callable_name(fun))


@overload
def grad(fun: AOTFunction, argnums: int | Sequence[int] = ..., has_aux: bool = ..., holomorphic: bool = ...,
         allow_int: bool = ..., reduce_axes: Sequence[Any] = ..., *, fused: bool = ...) -> StagedGradient: ...


@overload
def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = ..., has_aux: bool = ..., holomorphic: bool = ...,
         allow_int: bool = ..., reduce_axes: Sequence[Any] = ..., *, fused: bool = ...) -> Gradient: ...


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
         allow_int: bool = False, reduce_axes: Sequence[Any] = (), *, fused: bool = True) -> Gradient:
    """Like ``jax.grad`` (its arguments in its order), with the eager fast path of :func:`value_and_grad`.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sum(x ** 2))
        >>> jaxaot.grad(f)(jnp.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
    """
    check_gradient_options(fun, argnums, has_aux, fused, "grad", holomorphic, allow_int)
    check_reduce_axes(reduce_axes)
    argnums = normalize_argnums(argnums)
    vg = value_and_grad(fun, argnums=argnums, has_aux=has_aux, fused=fused, holomorphic=holomorphic,
                        allow_int=allow_int)
    return grad_of(vg, fun, has_aux=has_aux, argnums=argnums)
