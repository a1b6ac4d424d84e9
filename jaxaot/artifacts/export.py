"""Export the partitioned programs with ``jax.export``; reload them without the source.

:func:`export` runs the runtime's pipeline (trace -> joint -> partition) on
abstract inputs and exports three StableHLO programs with ``jax.export``:

* ``inference``: ``(inputs...) -> (outputs...)``;
* ``forward``: ``(inputs...) -> (outputs..., temporaries...)``;
* ``backward``: ``(cotangents..., saved inputs..., saved outputs...) -> (grads...)``.

This is the :class:`~jaxaot.Partition` contract, recorded in the
:class:`~jaxaot.artifacts.signature.AOTSignature`; nothing is re-emitted.
:func:`~jaxaot.load` turns a saved directory into a
:class:`~jaxaot.LoadedAOT` whose ``jax.grad`` runs the exported forward and
backward.

``jax.export`` refuses host callbacks; ``jaxaot.while_loop``'s reverse mode
checks its stack with one. Such a check becomes an extra boolean output (a
:class:`~jaxaot.artifacts.signature.RuntimeCheck`) that the loaded function
inspects; any other callback is a :class:`~jaxaot.errors.NotExportableError`.

``dynamic_shapes`` is the ``shapes_specs`` argument of
``jax.export.symbolic_args_specs``: a pytree prefix of the (non-static) positional
arguments whose entries are shape strings such as ``"b, 16"`` or ``"b, ..."``
(``...`` keeps the remaining dims of the example argument), or None (static).
Alternatively pass ``jax.ShapeDtypeStruct`` arguments with symbolic shapes made
in one ``jax.export.SymbolicScope``. Static arguments of an :class:`~jaxaot.AOTFunction`
(``static_argnums``) are baked in: the loaded function takes the others only.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> exp = jaxaot.export(lambda w, x: jnp.tanh(x @ w).sum(), jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> f = jaxaot.load(exp)  # or exp.save(path) ... jaxaot.load(path) in another process
    >>> jax.grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3))).shape
    (3, 2)
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax

from jaxaot import _compat as C
from jaxaot._pytrees import flatten_checked, shape_dtype_struct
from jaxaot.artifacts.exported import ExportedAOT
from jaxaot.artifacts.loaded import LoadedAOT
from jaxaot.artifacts.signature import AOTSignature, ArraySpec, RuntimeCheck
from jaxaot.artifacts.treedef_json import treedef_to_json
from jaxaot.errors import InvalidInputError, NotExportableError
from jaxaot.loops.overflow import overflow_check_max_steps
from jaxaot.partition.default import default_partition
from jaxaot.partition.split import Partitioner
from jaxaot.runtime.function import AOTFunction, aot_function
from jaxaot.runtime.programs import SignaturePrograms, TrainingPrograms


def export(
    fn_or_aot_function: Callable[..., Any],
    *args: Any,
    platforms: Sequence[str] | None = None,
    dynamic_shapes: Any = None,
    partition_fn: Partitioner | None = None,
) -> ExportedAOT:
    """Export the inference, forward and backward programs of a function.

    Args:
      fn_or_aot_function: a function of pytrees of arrays, or an
        :class:`~jaxaot.AOTFunction` (its partitioner and decompositions are used).
      *args: example positional arguments (arrays, scalars or
        ``jax.ShapeDtypeStruct``; only shapes and dtypes matter).
      platforms: e.g. ``("cpu", "cuda", "tpu")`` for one multi-platform artifact
        (lowering needs no such hardware); default: the current platform.
      dynamic_shapes: symbolic dims, as ``jax.export.symbolic_args_specs``'s
        ``shapes_specs``: e.g. ``(None, ("b, 16", "b, 4"))`` for ``(params, (x, y))``.
      partition_fn: overrides the partitioner (default: the AOTFunction's, else
        :func:`~jaxaot.default_partition`).

    Raises:
      NotExportableError: host callbacks in the function, pytree nodes the
        manifest cannot describe, or programs ``jax.export`` refuses.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> exp = jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(8), dynamic_shapes=("b",))
        >>> exp.signature.residual_specs[0].shape
        ('b',)
    """
    aot = _fresh_aot_function(fn_or_aot_function, partition_fn)
    name = aot.__name__
    static = set(aot.static_argnums)
    dyn = tuple(a for i, a in enumerate(args) if i not in static)
    flatten_checked((dyn, {}), "input", InvalidInputError)
    specs = _input_specs(dyn, dynamic_shapes)
    in_structure = treedef_to_json(jax.tree_util.tree_structure(specs), "arg")
    it = iter(specs)
    call_args = tuple(a if i in static else next(it) for i, a in enumerate(args))

    programs = aot.lookup(call_args, {}).programs  # traces the primal program, compiles nothing
    inference, inference_checks = _hoist_checks(programs.primal, "inference", name)
    training = programs.training()
    part = training.partition
    forward, forward_checks = _hoist_checks(part.forward, "forward", name)
    backward, backward_checks = _hoist_checks(part.backward, "backward", name)
    if backward_checks:  # pragma: no cover - loop checks run where the loop runs: the forward
        raise NotExportableError(f"the backward program of {name} contains a run-time check; it cannot be exported.")

    in_avals = list(programs.in_avals)
    exported = {
        "inference": _export_program(inference, in_avals, platforms, name, "inference"),
        "forward": _export_program(forward, in_avals, platforms, name, "forward"),
        "backward": _export_program(backward, training.backward_avals(), platforms, name, "backward"),
    }
    static_args = repr(tuple(args[i] for i in sorted(static) if i < len(args))) if static else None
    signature = _signature(in_structure, programs, training, forward_checks, inference_checks, static_args)
    return ExportedAOT(name=name, signature=signature, **exported)


def _signature(in_structure: dict, programs: SignaturePrograms, training: TrainingPrograms, forward_checks: tuple,
               inference_checks: tuple, static_args: str | None) -> AOTSignature:
    """The :class:`AOTSignature` of a signature's programs and its (full-mask) training programs."""
    part = training.partition
    return AOTSignature(
        in_structure=in_structure,
        out_structure=treedef_to_json(programs.out_tree, "output"),
        in_specs=tuple(ArraySpec.of(a) for a in programs.in_avals),
        out_specs=tuple(ArraySpec.of(a) for a in training.joint.out_avals),
        grad_inputs=tuple(part.grad_inputs),
        cotangent_outputs=tuple(part.cotangent_outputs),
        saved_inputs=tuple(part.saved_inputs),
        saved_outputs=tuple(part.saved_outputs),
        num_temporaries=part.num_temporaries,
        residual_specs=tuple(ArraySpec.of(r.aval) for r in part.residuals),
        forward_checks=forward_checks,
        inference_checks=inference_checks,
        static_args=static_args,
    )


def _fresh_aot_function(fn: Callable, partition_fn: Partitioner | None) -> AOTFunction:
    # A new AOTFunction, so exporting adds no (abstract, maybe symbolic) entry to
    # the caller's cache; the AOTFunction's options carry over.
    if isinstance(fn, AOTFunction):
        return aot_function(
            fn.fn, partition_fn=partition_fn or fn.partition_fn, decompositions=fn.decompositions,
            static_argnums=fn.static_argnums,
        )
    if isinstance(fn, LoadedAOT):
        raise InvalidInputError("this function was loaded from an artifact: save its ExportedAOT again instead.")
    return aot_function(fn, partition_fn=partition_fn or default_partition)


def _input_specs(dyn: tuple, dynamic_shapes: Any) -> tuple:
    if dynamic_shapes is not None:
        try:
            specs = jax.export.symbolic_args_specs(dyn, dynamic_shapes)
        except Exception as err:
            raise InvalidInputError(f"dynamic_shapes {dynamic_shapes!r} does not fit the arguments: {err}") from err
    else:
        specs = dyn
    return jax.tree_util.tree_map(_strip_sharding, specs)


def _strip_sharding(x: Any) -> jax.ShapeDtypeStruct:
    # The artifact is device-independent: shardings of the example arrays stay behind.
    return shape_dtype_struct(x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x))


def _export_program(closed: Any, avals: Sequence[Any], platforms: Sequence[str] | None, name: str, what: str):
    def run(*flat):
        return C.eval_closed(closed, *flat)

    run.__name__ = run.__qualname__ = re.sub(r"\W", "_", f"{name}_{what}")
    try:
        return jax.export.export(jax.jit(run, keep_unused=True), platforms=platforms)(*avals)
    except Exception as err:
        raise NotExportableError(
            f"jax.export cannot export the {what} program of {name}: {type(err).__name__}: {err}"
        ) from err


# --------------------------------------------------------------------------- host callbacks
def _hoist_checks(closed: Any, what: str, name: str) -> tuple[Any, tuple[RuntimeCheck, ...]]:
    """``closed`` with jaxaot's loop-overflow callbacks turned into extra outputs.

    ``jax.export`` refuses host callbacks; ``jaxaot.while_loop``'s reverse mode
    checks its stack with one. Such a check becomes a boolean output that the
    loaded function inspects; any other callback is a :class:`NotExportableError`.
    """
    hoist = []
    for eqn, depth in C.iter_eqns(closed, with_depth=True):
        if not C.is_host_callback(eqn):
            continue
        max_steps = overflow_check_max_steps(eqn)
        if max_steps is None:
            raise NotExportableError(
                f"the {what} program of {name} calls a host callback ({eqn.primitive}) at {C.eqn_source(eqn)}. "
                "jax.export cannot serialize host callbacks (jax.debug.callback, jax.debug.print, io_callback, "
                "pure_callback): remove them from the function before exporting."
            )
        if depth:
            raise NotExportableError(
                f"the {what} program of {name} checks a jaxaot.while_loop stack for overflow inside another "
                f"loop or call ({C.eqn_source(eqn)}); only top-level checks can be exported. Use checkpoints=k "
                "(no run-time check) for nested loops."
            )
        hoist.append((eqn, max_steps))
    if not hoist:
        return closed, ()
    j = C.jaxpr_of(closed)
    skip = {id(e) for e, _ in hoist}
    eqns = [e for e in j.eqns if id(e) not in skip]
    flags = [e.invars[0] for e, _ in hoist]
    new = C.make_closed_jaxpr(j.constvars, j.invars, [*j.outvars, *flags], eqns, C.consts_of(closed))
    return new, tuple(RuntimeCheck("loop_overflow", int(m)) for _, m in hoist)
