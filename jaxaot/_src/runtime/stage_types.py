"""What a stage takes and returns, as ``jax.stages`` names it: ``in_tree``, ``args_info``, ``out_tree``, ``out_info``.

:class:`~jaxaot._src.runtime.lowered.AOTLowered` and :class:`~jaxaot._src.runtime.lowered.AOTCompiled` read
these off a signature's programs: the inputs off its :class:`~jaxaot._src.runtime.signature.Signature`, the
outputs off the primal program (the function's stage) or off the stage's call evaluated abstractly (a gradient's
stage, whose outputs are the gradient's); the compiled stage's shardings off its executables, compiled for one
placement of the inputs.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError
from jaxaot._src.pytrees import shape_dtype_struct
from jaxaot._src.runtime.shardings import input_shardings, output_shardings


def check_compile_arguments(compiler_options: Any) -> None:
    """Refuse ``compile(compiler_options=...)``: the programs compile with the function's compilers, which its
    calls use too, so options given here would not reach what runs."""
    if compiler_options:
        raise InvalidInputError(
            f"AOTLowered.compile(compiler_options={dict(compiler_options)!r}): the programs compile with the "
            "aot_function's compilers, as its calls do; give it a fw_compiler that passes the options (see "
            "\"XLA's compiler options\" in docs/getting_started.md).")


def args_info(programs: Any) -> Any:
    """A ``jax.stages.ArgInfo`` (aval, ``donated``) per dynamic input, in the pytree of ``(args, kwargs)``."""
    donated = set(programs.donated_leaves)
    infos = [jax.stages.ArgInfo(C.shaped_abstractify(a), i in donated) for i, a in enumerate(programs.in_avals)]
    return jax.tree_util.tree_unflatten(programs.signature.treedef, infos)


def out_info(programs: Any, run: Callable[..., Any] | None, fun: Any = None) -> Any:
    """A ``jax.ShapeDtypeStruct`` per output of the stage's call (weak types kept): the primal program's outputs
    where ``run`` is None (the function's stage), else those of ``run``, the stage's call of the flat inputs,
    evaluated abstractly (a gradient's ``(value, grads)``). Reading it leaves ``fun``'s cache as it was (its
    hits, and the signature the abstract call looks up), as reading ``jax.stages.Lowered.out_info`` does."""
    mesh = programs.mesh
    if run is None:
        outs = [shape_dtype_struct(a, sharding=_explicit(a, mesh)) for a in C.out_avals_of(programs.primal)]
        return jax.tree_util.tree_unflatten(programs.out_tree, outs)
    # Tracers of the avals alone, as under jax.jit (their Explicit mesh axes kept: they type the outputs).
    avals = [shape_dtype_struct(a, sharding=getattr(a, "sharding", None) if _explicit(a, mesh) else None)
             for a in programs.in_avals]
    hits, signatures = (getattr(fun, "_hits", 0), set(getattr(fun, "_cache", ())))
    try:
        return jax.tree.map(lambda a: shape_dtype_struct(a, sharding=_explicit(a, mesh)), jax.eval_shape(run, *avals))
    finally:
        if fun is not None:
            fun._hits = hits
            for sig in set(fun._cache) - signatures:
                fun._cache.pop(sig, None)


def _explicit(aval: Any, mesh: Any) -> Any:
    """The sharding an aval's type holds over ``mesh``'s ``Explicit`` axes (as ``jax.jit``'s stages give it in
    ``out_info``), on ``mesh`` itself; None where its type holds none."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None or not C.explicit_axes(getattr(sharding, "mesh", None)):
        return None
    return jax.sharding.NamedSharding(mesh, spec)


def stage_input_shardings(programs: Any, exe: Any) -> Any:
    """The sharding each dynamic input is taken at, in the pytree of ``(args, kwargs)``: every program of a
    signature is compiled for one placement of its inputs, the inference ``exe``'s."""
    flat = input_shardings(exe)
    if flat is None or len(flat) != len(programs.in_avals):
        raise AttributeError(f"input_shardings: the compiler of this stage reports no input shardings ({exe!r}).")
    return jax.tree_util.tree_unflatten(programs.signature.treedef, flat)


def stage_input_formats(programs: Any, exe: Any) -> Any:
    """The layout (``Format``) each dynamic input is taken in, in the pytree of ``(args, kwargs)``: the inference
    ``exe``'s, a ``jax.stages.Compiled`` of the flat inputs."""
    formats = getattr(getattr(exe, "executable", exe), "input_formats", None)
    flat = list(formats[0]) if isinstance(formats, tuple) and formats and isinstance(formats[0], tuple) else None
    if flat is None or len(flat) != len(programs.in_avals):
        raise AttributeError(f"input_formats: the compiler of this stage reports no input formats ({exe!r}).")
    return jax.tree_util.tree_unflatten(programs.signature.treedef, flat)


def stage_output_shardings(programs: Any, exe: Any, runs_function: bool) -> Any:
    """The sharding of each output of the function's stage (``runs_function``), in the pytree of its outputs: the
    inference ``exe``'s, and an input's where the output is that input."""
    if not runs_function:
        raise AttributeError(
            "output_shardings: a gradient's stage has no single executable whose outputs it returns (the fused step, "
            "or the split forward and backward, chosen at its first call); read the shardings of what it returns, "
            "or compiled.executables[name].output_shardings.")
    outs, ins = output_shardings(exe), input_shardings(exe)
    if outs is None or ins is None:
        raise AttributeError(f"output_shardings: the compiler of this stage reports no output shardings ({exe!r}).")
    computed = iter(outs)
    flat = [next(computed) if src is None else ins[src] for src in programs.output_is_input]
    return jax.tree_util.tree_unflatten(programs.out_tree, flat)


def stage_output_formats(programs: Any, exe: Any, runs_function: bool) -> Any:
    """The ``Format`` (layout and sharding) of each output of the function's stage (``runs_function``), in the
    pytree of its outputs: the inference ``exe``'s, and an input's where the output is that input."""
    if not runs_function:
        raise AttributeError("output_formats: a gradient's stage has no single executable whose outputs it returns; "
                             "read compiled.executables[name].output_formats.")
    inner = getattr(exe, "executable", exe)
    outs, ins = getattr(inner, "output_formats", None), getattr(inner, "input_formats", None)
    outs = list(jax.tree_util.tree_leaves(outs, is_leaf=_is_format)) if outs is not None else None
    ins = list(ins[0]) if isinstance(ins, tuple) and ins and isinstance(ins[0], tuple) else None
    if outs is None or ins is None:
        raise AttributeError(f"output_formats: the compiler of this stage reports no output formats ({exe!r}).")
    computed = iter(outs)
    flat = [next(computed) if src is None else ins[src] for src in programs.output_is_input]
    return jax.tree_util.tree_unflatten(programs.out_tree, flat)


def _is_format(x: Any) -> bool:
    return hasattr(x, "layout") and hasattr(x, "sharding")


def compiled_out_info(lowered_info: Any, formats: Any | None) -> Any:
    """``lowered_info`` with each output's ``Format`` (``formats``, the pytree of the outputs: layout and sharding),
    where known, as ``jax.stages.Compiled.out_info`` gives it."""
    if formats is None:
        return lowered_info
    return jax.tree.map(lambda s, fm: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=fm, weak_type=s.weak_type),
                        lowered_info, formats, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
