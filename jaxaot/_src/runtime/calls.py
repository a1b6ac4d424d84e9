"""A call of an :class:`~jaxaot._src.runtime.AOTFunction` read as its signature, and what a compiled stage of one
signature runs when called: the arguments checked as JAX's ``Compiled`` checks them."""

from __future__ import annotations

from typing import Any, Callable

from jaxaot._src import compat as C
from jaxaot._src.runtime import arguments, reasons
from jaxaot._src.runtime.shardings import context_mesh, placed_as_compiled
from jaxaot._src.runtime.signature import Signature, TraceKind, key_parts, lookup_keys


def call_signature(fun: Any, args: tuple, kwargs: dict) -> tuple[Signature, list, TraceKind]:
    """A call's :class:`Signature` (the compile-cache key), its flat leaves and its trace kind, in one pass."""
    static, leaves, treedef = arguments.split_static(fun.static_argnums, args, kwargs, fun.fn)
    keys, kind = lookup_keys(leaves, lambda: arguments.raise_not_array(fun.static_argnums, treedef, leaves))
    return Signature(treedef, keys, static, context_mesh(), C.trace_context()), leaves, kind


def _with_statics(fun: Any, sig: Signature, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with the static values of ``sig`` put back in place when the call left them out, as JAX's
    ``Compiled`` is called (the dynamic arguments only), whatever its dynamic ones are; a call that passes them is
    taken as it is."""
    full = arguments.with_statics(fun.static_argnums, sig.static, args, kwargs) if fun.static_argnums else None
    if full is None:
        return args, kwargs
    try:
        got = call_signature(fun, *full)[0]
    except Exception:  # noqa: BLE001 - not this call's form: the arguments as given are checked below
        return args, kwargs
    if got.static != sig.static:
        return args, kwargs
    # As many positional arguments as the stage's dynamic ones: the statics were left out (whatever else differs,
    # named below); else they were passed.
    left_out = got.treedef == sig.treedef or len(args) == len(sig.treedef.children()[0].children())
    return full if left_out else (args, kwargs)


def stage_call(fun: Any, sig: Signature, run: Callable[..., Any]) -> Callable[[tuple, dict], Any]:
    """What a compiled stage of ``sig`` runs when called: ``run(*args, **kwargs)``, for arrays of that very
    signature. As JAX's ``Compiled``, it refuses tracers and arguments of other types with a ``TypeError`` (naming
    what differs), where ``run`` itself would trace or compile anew. Its ``run``: ``run`` of the flat dynamic inputs,
    where ``run`` is not ``fun`` itself (a gradient's stage), else None (the stage's outputs are ``fun``'s)."""
    def call(args: tuple, kwargs: dict) -> Any:
        args, kwargs = _with_statics(fun, sig, args, kwargs)
        got, leaves, kind = call_signature(fun, args, kwargs)
        if kind is not TraceKind.CONCRETE:
            raise TypeError(
                f"A compiled stage of {fun.__name__} runs arrays only; it was called with jax.ShapeDtypeStruct "
                f"inputs: pass arrays of those shapes and dtypes." if kind is TraceKind.ABSTRACT else
                f"A compiled stage of {fun.__name__} runs arrays only; it was called with tracers. Under jax.jit, "
                f"jax.grad or jax.vmap call {fun.__name__} itself, which composes with JAX's transformations.")
        if got != sig:
            placed = _placed(fun, sig, got, leaves)
            if placed is None:
                why = reasons.describe_change(sig, got, fun._paths, fun._arg_names())
                raise TypeError(
                    f"Argument types differ from the types for which this stage of {fun.__name__} was compiled: "
                    f"{why}. Lower and compile for these arguments, or call {fun.__name__} itself, which compiles "
                    f"each signature on first use.")
            return arguments.flat_function(run, fun.static_argnums, got.static, got.treedef)(*placed)
        return run(*args, **kwargs)
    call.run = None if run is fun else arguments.flat_function(run, fun.static_argnums, sig.static, sig.treedef)
    call.fun = fun
    return call


def _placed(fun: Any, sig: Signature, got: Signature, leaves: list) -> list | None:
    """A call's ``leaves`` placed as the stage of ``sig`` takes them (uncommitted ones copied where it was compiled
    for, :func:`~jaxaot._src.runtime.shardings.placed_as_compiled`); None where it differs in more than placement."""
    if got._replace(leaves=sig.leaves) != sig:
        return None
    return placed_as_compiled(leaves, [key_parts(k) for k in got.leaves], [key_parts(k) for k in sig.leaves],
                              fun._paths(sig), fun.__name__)
