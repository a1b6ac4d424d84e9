"""Export the partitioned programs with ``jax.export``; reload them without the source.

:func:`export` traces, builds the joint and partitions as the runtime does, then
exports three StableHLO programs (``inference``, ``forward`` with the residuals,
``backward``) and the :class:`~jaxaot._src.artifacts.aot_signature.AOTSignature` that
ties them together; :func:`~jaxaot.export.load` makes a function of them whose
``jax.grad`` runs the exported forward and backward. A loop's overflow check
becomes a boolean output (``jax.export`` refuses callbacks); ``dynamic_shapes``
gives symbolic dimensions; example arguments sharded over several devices make
an artifact that runs on that many devices.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> exp = jaxaot.export.export(lambda w, x: jnp.tanh(x @ w).sum(), jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> f = jaxaot.export.load(exp)  # or exp.save(path) ... jaxaot.export.load(path) in another process
    >>> jax.grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3))).shape
    (3, 2)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot._src import progress as _progress
from jaxaot._src.pytrees import flatten_checked
from jaxaot._src.artifacts.exported import ExportedAOT
from jaxaot._src.artifacts.loaded import LoadedAOT
from jaxaot._src.artifacts.export_options import check_platforms
from jaxaot._src.artifacts.mesh_spec import MeshSpec
from jaxaot._src.artifacts.aot_signature import AOTSignature, ArraySpec, RuntimeCheck
from jaxaot._src.artifacts.treedef_json import treedef_to_json
from jaxaot._src.artifacts.weak_types import weak_grad_rule
from jaxaot.errors import InvalidInputError, NotExportableError
from jaxaot._src.loops import overflow_check
from jaxaot._src.partition import Partitioner, default_partition
from jaxaot._src.runtime import (
    AOTFunction, SignaturePrograms, TrainingPrograms, aot_function, is_abstract, is_multi_device, output_shardings,
    replicated,
)


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
        ``jax.ShapeDtypeStruct``): their shapes and dtypes, and their shardings
        where they span several devices (a sharded artifact, above).
      platforms: e.g. ``("cpu", "cuda", "tpu")`` for one multi-platform artifact
        (lowering needs no such hardware); default: the current platform.
      dynamic_shapes: symbolic dims, as ``jax.export.symbolic_args_specs``'s
        ``shapes_specs``: e.g. ``(None, ("b, 16", "b, 4"))`` for ``(params, (x, y))``.
      partition_fn: overrides the partitioner (default: the AOTFunction's, else
        :func:`~jaxaot.partition.default_partition`).

    Raises:
      NotExportableError: host callbacks in the function, pytree nodes the
        manifest cannot describe, programs ``jax.export`` refuses, or sharded
        inputs with ``dynamic_shapes``.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> exp = jaxaot.export.export(lambda x: jnp.sin(x).sum(), jnp.ones(8), dynamic_shapes=("b",))
        >>> exp.signature.residual_specs[0].shape
        ('b',)
    """
    check_platforms(platforms)
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
    placed = _Placement.of(programs, training, name) if programs.sharded else _Placement.none(programs, training)
    n_user = len(programs.output_is_input)
    carriers = _shape_carriers(in_avals, placed.backward_avals)
    exported = {
        "inference": _export_program(inference, in_avals, platforms, name, "inference",
                                     placed.outputs(n_user, len(inference_checks))),
        "forward": _export_program(forward, in_avals, platforms, name, "forward",
                                   placed.outputs(len(placed.forward), len(forward_checks)),
                                   carry=(len(placed.forward), [i for i, _ in carriers])),
        "backward": _export_program(backward, [*placed.backward_avals, *(c for _, c in carriers)], platforms, name,
                                    "backward", placed.grads, unread=len(carriers)),
    }
    static_argnums = tuple(i for i in sorted(static) if i < len(args))
    static_args = _static_repr(tuple(args[i] for i in static_argnums)) if static else None
    signature = _signature(in_structure, programs, training, forward_checks, inference_checks, static_args, placed,
                           [c for _, c in carriers])
    signature = dataclasses.replace(signature, static_argnums=static_argnums, weak_grads=weak_grad_rule(training),
                                    dim_constraints=C.dim_constraints([a.shape for a in in_avals]))
    return ExportedAOT(name=name, signature=signature, **exported)


def _static_repr(values: tuple) -> str:
    """The static arguments baked in, as the manifest records them (a stand-in where ``__repr__`` raises)."""
    try:
        return repr(values)
    except Exception as err:
        return f"<{len(values)} static arguments (a __repr__ raised {type(err).__name__})>"


class _Placement:
    """The shardings a signature's programs are exported for (all None when it is not sharded).

    Attributes:
      forward: per output of the partition's forward (the function's outputs,
        then temporaries), the sharding the compiled forward gives it; the
        exported forward is pinned to these, so its residuals keep them.
      backward_avals: the backward's inputs (cotangents, then residuals), each
        carrying the sharding the backward is compiled for
        (``TrainingPrograms.backward_avals``).
      grads: per gradient, its parameter's sharding (as ``jax.grad`` returns it).
      mesh: the signature's mesh, or None.
    """

    def __init__(self, forward: list, backward_avals: list, grads: list | None, mesh: Any):
        self.forward, self.backward_avals, self.grads, self.mesh = forward, backward_avals, grads, mesh

    @classmethod
    def none(cls, programs: SignaturePrograms, training: TrainingPrograms) -> "_Placement":
        n_fwd = len(programs.output_is_input) + training.partition.num_temporaries
        return cls([None] * n_fwd, training.backward_avals(), None, None)

    @classmethod
    def of(cls, programs: SignaturePrograms, training: TrainingPrograms, name: str) -> "_Placement":
        p, part = programs, training.partition
        if any(jax.export.is_symbolic_dim(d) for a in p.in_avals for d in a.shape):
            raise NotExportableError(
                f"{name} has sharded inputs and symbolic dimensions (dynamic_shapes): the shardings of its "
                "residuals are read off the compiled forward, which needs concrete shapes. Export one artifact "
                "per batch size, or export with unsharded inputs.")
        outs = output_shardings(training.forward_exe)  # compiles the forward: its residual shardings
        if outs is None:
            raise NotExportableError(f"the forward compiler of {name} does not report output shardings, which "
                                     "a sharded export records: export with the default XLA compiler.")
        n_real = len(p.computed_outputs)
        forward = [outs[p.computed_outputs.index(i)] if src is None else p.in_avals[src].sharding
                   for i, src in enumerate(p.output_is_input)] + list(outs[n_real:])
        grads = [p.in_avals[i].sharding for i in part.grad_inputs]
        return cls(forward, training.backward_avals(), grads, p.mesh)

    def outputs(self, n: int, n_checks: int) -> list | None:
        """``out_shardings`` of a program returning the first ``n`` forward outputs and ``n_checks`` flags."""
        if self.mesh is None:
            return None
        return list(self.forward[:n]) + [replicated(self.mesh)] * n_checks


def _shape_carriers(in_avals: Sequence[Any], backward_avals: Sequence[Any]) -> list[tuple[int, Any]]:
    """``(input index, bool[0, *shape])`` per input with a symbolic dim the backward's own inputs do not give.

    ``jax.export`` solves a program's dimension variables from the shapes of its
    inputs; the backward takes cotangents and residuals, which may not carry a
    variable its gradients' shapes need (``sum(x)`` saves nothing of ``x``). The
    forward returns a zero-size stand-in of such an input as a saved temporary,
    and the backward takes it as a residual it does not read: a shape, no data.
    """
    solved = {str(d) for a in backward_avals for d in a.shape
              if jax.export.is_symbolic_dim(d) and str(d).isidentifier()}
    return [(i, jax.ShapeDtypeStruct((0, *a.shape), jnp.bool_)) for i, a in enumerate(in_avals)
            if any(jax.export.is_symbolic_dim(d) and str(d) not in solved for d in a.shape)]


def _signature(in_structure: dict, programs: SignaturePrograms, training: TrainingPrograms, forward_checks: tuple,
               inference_checks: tuple, static_args: str | None, placed: _Placement, carriers: list) -> AOTSignature:
    """The :class:`AOTSignature` of a signature's programs and its (full-mask) training programs; ``carriers``
    (:func:`_shape_carriers`) are saved temporaries after the partition's own."""
    part = training.partition
    n_cts = len(part.cotangent_outputs)
    out_avals = training.out_avals
    first_carrier = len(programs.output_is_input) + part.num_temporaries
    return AOTSignature(
        in_structure=in_structure,
        out_structure=treedef_to_json(programs.out_tree, "output"),
        in_specs=tuple(ArraySpec.of(a, a.sharding) for a in programs.in_avals),
        out_specs=tuple(ArraySpec.of(a, s) for a, s in zip(out_avals, placed.forward)),
        grad_inputs=tuple(part.grad_inputs),
        cotangent_outputs=tuple(part.cotangent_outputs),
        saved_inputs=tuple(part.saved_inputs),
        saved_outputs=(*part.saved_outputs, *range(first_carrier, first_carrier + len(carriers))),
        num_temporaries=part.num_temporaries + len(carriers),
        residual_specs=(*(ArraySpec.of(r.aval, a.sharding)
                          for r, a in zip(part.residuals, placed.backward_avals[n_cts:])),
                        *map(ArraySpec.of, carriers)),
        forward_checks=forward_checks,
        inference_checks=inference_checks,
        static_args=static_args,
        mesh=None if placed.mesh is None else MeshSpec.of(placed.mesh),
    )


def _fresh_aot_function(fn: Callable, partition_fn: Partitioner | None) -> AOTFunction:
    # A new AOTFunction, so exporting adds no (abstract, maybe symbolic) entry to
    # the caller's cache; the AOTFunction's options carry over.
    if isinstance(fn, AOTFunction):
        return aot_function(
            fn.fn, partition_fn=partition_fn or fn.partition_fn, decompositions=fn.decompositions,
            static_argnums=fn.static_argnums, out_shardings=fn.options.out_shardings,
            residual_sharding=fn.options.residual_sharding,
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
    examples = jax.tree_util.tree_leaves(dyn)
    leaves, treedef = jax.tree_util.tree_flatten(specs)
    return jax.tree_util.tree_unflatten(treedef, [_abstract(x, example) for x, example in zip(leaves, examples)])


def _multi_device_sharding(x: Any) -> Any:
    """The sharding of an example argument that spans several devices, else None.

    An artifact of unsharded arguments is device-independent: single-device
    placements of the example arrays stay behind.
    """
    if isinstance(x, jax.ShapeDtypeStruct):
        sharding = x.sharding
    elif isinstance(x, jax.Array) and not C.is_tracer(x):
        sharding = x.sharding if x.committed else None
    else:
        sharding = None
    return sharding if is_multi_device(sharding) and not is_abstract(sharding) else None


def _abstract(x: Any, example: Any) -> jax.ShapeDtypeStruct:
    """The input spec of ``x`` (an example argument, or its symbolic spec): with the example's sharding where it
    spans several devices, and its weak type (a Python number's), which ``jax.export``'s symbolic specs drop."""
    typed = [v if isinstance(v, jax.ShapeDtypeStruct) else jax.typeof(v) for v in (x, example)]
    weak = any(getattr(t, "weak_type", False) for t in typed)
    return jax.ShapeDtypeStruct(typed[0].shape, typed[0].dtype, sharding=_multi_device_sharding(example),
                                weak_type=bool(weak))


def _export_program(closed: Any, avals: Sequence[Any], platforms: Sequence[str] | None, name: str, what: str,
                    out_shardings: Sequence[Any] | None = None, carry: tuple[int, Sequence[int]] = (0, ()),
                    unread: int = 0):
    """``jax.export`` of ``closed`` for ``avals`` (their shardings are its input shardings).

    ``out_shardings``: per output, the sharding to pin it to (None: unpinned); the
    exported program records them, and its outputs come back with them.
    ``carry``: ``(position, inputs)``, the outputs at ``position`` get a
    ``bool[0, *shape]`` per input of ``inputs`` (:func:`_shape_carriers`);
    ``unread``: how many trailing inputs (those stand-ins) ``closed`` does not take.
    """
    at, carried = carry

    def run(*flat):
        outs = list(C.eval_closed(closed, *flat[:len(flat) - unread]))
        outs[at:at] = [jnp.zeros((0, *flat[i].shape), jnp.bool_) for i in carried]
        return outs

    run.__name__ = run.__qualname__ = re.sub(r"\W", "_", f"{name}_{what}")
    options = {} if out_shardings is None else {"out_shardings": list(out_shardings)}
    _progress.step("exporting", ("inference", "forward", "backward").index(what) + 1, 3,
                   f"the {what} program for {', '.join(platforms or ['this platform'])}")
    try:
        return jax.export.export(jax.jit(run, keep_unused=True, **options), platforms=platforms)(*avals)
    except Exception as err:
        raise NotExportableError(
            f"jax.export cannot export the {what} program of {name}: {type(err).__name__}: {err}"
        ) from err


# --------------------------------------------------------------------------- host callbacks
def _hoist_checks(closed: Any, what: str, name: str) -> tuple[Any, tuple[RuntimeCheck, ...]]:
    """``closed`` with jaxaot's loop-overflow callbacks turned into extra outputs.

    ``jax.export`` refuses host callbacks; ``jaxaot.loops.while_loop``'s reverse mode
    checks its stack with one. Such a check becomes a boolean output that the
    loaded function inspects; any other callback is a :class:`NotExportableError`.
    """
    hoist, inside = [], set()  # the checks found, and the callbacks inside their conds
    for eqn, depth in C.iter_eqns(closed, with_depth=True):
        check = overflow_check(eqn) if id(eqn) not in inside else None
        if check is None and (id(eqn) in inside or not C.is_host_callback(eqn)):
            continue
        if check is None:
            raise NotExportableError(
                f"the {what} program of {name} calls a host callback ({eqn.primitive}) at {C.eqn_source(eqn)}. "
                "jax.export cannot serialize host callbacks (jax.debug.callback, jax.debug.print, io_callback, "
                "pure_callback): remove them from the function before exporting."
            )
        if depth:
            raise NotExportableError(
                f"the {what} program of {name} checks a jaxaot.loops.while_loop stack for overflow inside another "
                f"loop or call ({C.eqn_source(eqn)}); only top-level checks can be exported. Use checkpoints=k "
                "(no run-time check) for nested loops."
            )
        if str(eqn.primitive) == "cond":
            inside.add(id(eqn.params["branches"][1].jaxpr.eqns[0]))
        hoist.append((eqn, check))
    if not hoist:
        return closed, ()
    j = C.jaxpr_of(closed)
    skip = {id(e) for e, _ in hoist}
    eqns = [e for e in j.eqns if id(e) not in skip]
    flags = [flag for _, (_, flag) in hoist]
    new = C.make_closed_jaxpr(j.constvars, j.invars, [*j.outvars, *flags], eqns, C.consts_of(closed))
    return new, tuple(RuntimeCheck("loop_overflow", int(m)) for _, (m, _) in hoist)
