"""The overflow of a bounded loop: never silent, on any platform.

A ``max_steps=N`` loop that needs more than N iterations has wrong outputs and
gradients. :func:`check_overflow` raises :class:`LoopOverflowError` at once when the
flag is concrete; under ``jit`` it makes the outputs and gradients NaN on the device
and records the overflow on the host, and :func:`reraise_overflow` (around
``aot_function`` calls) raises it on exit. For ``jax.export``,
:func:`overflow_check` finds each check so the artifact can return it as
an output instead.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda f: check_overflow(f, max_steps=8))(jnp.bool_(False))
    >>> overflow_check(closed.jaxpr.eqns[-1])[0]  # a cond whose true branch records the overflow
    8
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import LoopOverflowError

#: How deep :func:`overflow_check` looks into the closures around the callback.
_MAX_WRAPPER_DEPTH = 4
_MESSAGE_START = "while_loop needed more than max_steps="


def _message(max_steps: int) -> str:
    return (f"{_MESSAGE_START}{max_steps} iterations (the bound of a while_loop's reverse mode, or the rows of "
            f"while_loop_stack_output): raise max_steps; a while_loop may use checkpoints=k alone instead (any "
            f"trip count).")


def raise_if_overflowed(overflowed: Any, max_steps: int) -> None:
    """Raise :class:`LoopOverflowError` if ``overflowed`` (a concrete value) is true."""
    if np.any(np.asarray(overflowed)):
        raise LoopOverflowError(_message(max_steps))


class _Recorded:
    """The overflows host callbacks recorded: a process-wide count and the last message."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.message = ""
        self.traced = False  # whether any program with a check was traced (reraise_overflow then waits)

    def record(self, overflowed: Any, max_steps: int) -> None:
        if np.any(np.asarray(overflowed)):
            with self.lock:
                self.count += 1
                self.message = _message(max_steps)


_RECORDED = _Recorded()


def record_overflow(overflowed: Any, max_steps: int) -> None:
    """The host callback of a traced check: count an overflow, never raise."""
    _RECORDED.record(overflowed, max_steps)


def check_overflow(overflowed: Any, max_steps: int) -> None:
    """Raise :class:`LoopOverflowError` now if ``overflowed`` is concrete and true;
    for a traced flag, record it at run time (see the module docstring).

    The host callback sits in the true branch of a ``lax.cond`` on the flag, so a call
    that does not overflow pays for no host round trip (on a CPU one callback costs
    more than a small loop's whole gradient); under ``vmap`` both branches run."""
    try:
        over = bool(overflowed)
    except jax.errors.ConcretizationTypeError:  # traced (jit, vmap): checked at run time
        _RECORDED.traced = True
        jax.lax.cond(jnp.any(overflowed), functools.partial(_record_on_host, max_steps=max_steps), _no_overflow,
                     overflowed)
    else:
        raise_if_overflowed(over, max_steps)


def _record_on_host(overflowed: Any, max_steps: int) -> None:
    # A program over several processes runs an unpartitioned callback on its first device alone: there every
    # device's host records it, so that every process raises (JAX partitions callbacks on CPUs and GPUs only).
    every_host = jax.process_count() > 1 and jax.default_backend() in ("cpu", "gpu")
    jax.debug.callback(functools.partial(record_overflow, max_steps=max_steps), overflowed, partitioned=every_host)


def _no_overflow(overflowed: Any) -> None:
    del overflowed


def overflow_scale(overflowed: Any) -> Any:
    """A float32 scalar (or one per lane): NaN where ``overflowed``, else 1."""
    return jnp.where(jax.lax.stop_gradient(overflowed), jnp.float32(np.nan), jnp.float32(1.0))


def poison(scale: Any, values: Sequence[Any]) -> list:
    """``values`` times ``scale`` (from :func:`overflow_scale`): the inexact ones become
    NaN on overflow, and so does every derivative through them (a multiply, not a
    select, so a tangent map stays linear); integer values pass unchanged. Each keeps its weak type, so
    the result promotes downstream as the unpoisoned value would."""
    return [_poison_one(scale, x) if C.is_inexact(jnp.result_type(x)) else x for x in values]


def _poison_one(scale: Any, x: Any) -> Any:
    aval = jax.typeof(x)
    y = x * scale.astype(aval.dtype).reshape(scale.shape + (1,) * (aval.ndim - scale.ndim))
    return C.typed_as(y, aval)


# --------------------------------------------------------------------------- the deferred check
#: ``guard(overflowed, *tangents) -> tangents``: the identity, checking the flag (:func:`check_overflow`) where
#: it runs or is transposed. It stands on the tangents a bounded loop's reverse mode produces, so a loop whose
#: tangents nobody reads (DCE drops the guard with them) runs past ``max_steps`` without an error, as the
#: forward does; a read tangent raises (or records, under ``jit``) in the backward.
_guard_p = C.new_loop_primitive("loop_overflow_guard")


def guard_tangents(overflowed: Any, max_steps: int, tangents: Sequence[Any]) -> list:
    """``tangents``, checked against ``overflowed`` wherever they are used (see ``_guard_p``)."""
    return list(_guard_p.bind(overflowed, *tangents, max_steps=max_steps)) if tangents else []


def _guard_impl(overflowed: Any, *values: Any, max_steps: int) -> list:
    check_overflow(overflowed, max_steps)
    return list(values)


def _guard_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, max_steps: int) -> tuple[list, list]:
    flag, values = primals[0], primals[1:]
    nz = [type(t) is not C.Zero for t in tangents[1:]]
    out_t = iter(guard_tangents(flag, max_steps, [t for t, z in zip(tangents[1:], nz) if z]))
    return guard_tangents(flag, max_steps, values), [next(out_t) if z else t for t, z in zip(tangents[1:], nz)]


def _guard_transpose(cts: Sequence[Any], overflowed: Any, *values: Any, max_steps: int) -> list:
    if any(type(ct) is not C.Zero for ct in cts):  # staged as a visible check under jit (see overflow_check),
        with C.outside_name_scopes():  # reading forward values only: an aot_function's forward runs it
            check_overflow(overflowed, max_steps)
    return [None, *cts]


def _guard_batch(axis_data: Any, args: Sequence[Any], dims: Sequence[Any], *, max_steps: int) -> tuple[list, list]:
    del axis_data
    flag = args[0] if dims[0] is None else jnp.any(args[0], axis=dims[0])
    return guard_tangents(flag, max_steps, args[1:]), list(dims[1:])


_guard_p.def_impl(_guard_impl)
_guard_p.def_abstract_eval(lambda overflowed, *avals, max_steps: list(avals))
C.register_lowering(_guard_p, C.lower_fun(_guard_impl, multiple_results=True))
C.primitive_jvps[_guard_p] = _guard_jvp
C.primitive_transposes[_guard_p] = _guard_transpose
C.fancy_primitive_batchers[_guard_p] = _guard_batch


def checked_values(flags: Sequence[Any], max_steps: Sequence[int], values: Sequence[Any]) -> list:
    """``values`` after the overflow flags a program returned (an exported one, which cannot call back into
    Python itself): :class:`LoopOverflowError` at once for a concrete flag that is true; under ``jit``, each
    traced flag recorded on the host for :func:`reraise_overflow` and the inexact ``values`` NaN where any is
    true, as a traced :func:`check_overflow` makes them."""
    traced = [(f, n) for f, n in zip(flags, max_steps) if C.is_tracer(f)]
    for f, n in zip(flags, max_steps):
        if not C.is_tracer(f):
            raise_if_overflowed(f, n)
    if not traced:
        return list(values)
    for f, n in traced:
        check_overflow(f, n)
    return poison(overflow_scale(jnp.any(jnp.stack([jnp.any(f) for f, _ in traced]))), values)


@contextlib.contextmanager
def reraise_overflow() -> Iterator[None]:
    """Raise :class:`LoopOverflowError` on leaving the block if a ``max_steps`` loop run
    inside it overflowed (its results are NaN; other errors pass through unchanged).

    On exit it waits for the block's programs and their callbacks
    (``jax.effects_barrier``), once any overflow check was traced in the process.
    Overflows are recorded per process: one in another thread's program during the block raises here too.

    Example:
        >>> import jax, jaxaot
        >>> f = jax.jit(jax.grad(lambda x: jaxaot.loops.while_loop(lambda c: c < 9.0, lambda c: c + x, 0.0, max_steps=2)))
        >>> try:
        ...     with jaxaot.loops.reraise_overflow():
        ...         g = f(1.0)
        ... except jaxaot.errors.LoopOverflowError as e:
        ...     print(str(e)[:37])
        while_loop needed more than max_steps
        >>> bool(jax.numpy.isnan(g))  # a bare jit gets NaN
        True
    """
    start = overflow_mark()
    yield
    raise_overflow_since(start)


def overflow_mark() -> int:
    """Where the overflows recorded so far end: :func:`raise_overflow_since` raises for those recorded after."""
    return _RECORDED.count


def raise_overflow_since(mark: int, outputs: Any = None) -> None:
    """Raise :class:`LoopOverflowError` if a loop overflowed since :func:`overflow_mark` gave ``mark``, once the
    programs and callbacks run meanwhile are done (``jax.effects_barrier``, once any check was traced); the
    error holds the call's ``outputs`` (NaN where a loop overflowed, as a bare ``jit`` returns them), which a
    call that donated its arguments has nowhere else."""
    if not _RECORDED.traced:
        return
    jax.effects_barrier()
    with _RECORDED.lock:
        overflowed, message = _RECORDED.count != mark, _RECORDED.message
    if overflowed:
        err = LoopOverflowError(message + (" The call's outputs are the error's `outputs` (NaN where a loop "
                                           "overflowed)." if outputs is not None else ""))
        err.outputs = outputs
        raise err


def overflow_checked(mark: int, outputs: Any) -> Any:
    """``outputs``, once no loop overflowed since ``mark`` (:func:`raise_overflow_since`, which raises with them)."""
    raise_overflow_since(mark, outputs)
    return outputs


def overflow_check(eqn: Any) -> tuple[int, Any] | None:
    """``(max_steps, the overflow flag's var)`` if ``eqn`` is a check of :func:`check_overflow`: its ``cond``
    (or its callback alone), else None."""
    if str(eqn.primitive) == "cond":
        branches = eqn.params.get("branches", ())
        if len(branches) != 2 or branches[0].jaxpr.eqns or len(branches[1].jaxpr.eqns) != 1 or len(eqn.invars) != 2:
            return None
        found = overflow_check(branches[1].jaxpr.eqns[0])
        return None if found is None else (found[0], eqn.invars[1])
    if str(eqn.primitive) != "debug_callback" or len(eqn.invars) != 1:
        return None
    max_steps = _find_check(eqn.params.get("callback"), 0)
    return None if max_steps is None else (max_steps, eqn.invars[0])


def overflow_check_max_steps(eqn: Any) -> int | None:
    """``max_steps`` if ``eqn`` is a check of :func:`check_overflow` (:func:`overflow_check`), else None."""
    found = overflow_check(eqn)
    return None if found is None else found[0]


def _find_check(obj: Any, depth: int) -> int | None:
    # jax.debug.callback wraps the callback in closures; look a few levels in.
    if depth > _MAX_WRAPPER_DEPTH or obj is None:
        return None
    if isinstance(obj, functools.partial):
        if obj.func is record_overflow and "max_steps" in obj.keywords:
            return int(obj.keywords["max_steps"])
        return _find_check(obj.func, depth + 1)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            found = _find_check(cell.cell_contents, depth + 1) if callable(cell.cell_contents) else None
        except ValueError:  # an empty cell
            found = None
        if found is not None:
            return found
    return None
