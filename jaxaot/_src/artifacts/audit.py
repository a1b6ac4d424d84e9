"""What a loaded program may contain and what it must take: checked op by op before it can run.

Someone else's artifact can name a host callback or host transfer (refused by
name, :func:`is_host_callback`, unless ``allow_callbacks=True``) or a kernel
that trusts its buffers (each custom call must satisfy its target's type rule,
:mod:`jaxaot._src.artifacts.custom_calls`). The StableHLO is walked op by op with
the MLIR bindings, so nothing in a string can hide an op. :func:`check_signature`
and :func:`check_platforms` compare each program with the manifest and with this
process, so a swapped program or an edited signature is refused at load.
:func:`check_calls` lowers a call of each program as ``jax.export`` does, so a
program whose StableHLO has lost its entry function, or takes or returns other
values than its own metadata says, is refused at load too, not at every call.

Example:
    >>> from jaxaot._src.artifacts.audit import is_host_callback
    >>> [is_host_callback(t) for t in ("xla_ffi_python_gpu_callback", "xla_python_cpu_callback", "lapack_sgetrf_ffi")]
    [True, True, False]
"""

from __future__ import annotations

import contextlib
from typing import Any, Collection, Mapping, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import dtype_name
from jaxaot._src.artifacts.custom_calls import mismatch
from jaxaot._src.artifacts.aot_signature import AOTSignature, ArraySpec
from jaxaot.errors import ArtifactError

#: Custom-call targets an exported program may contain: those ``jax.export`` itself allows without a
#: disabled safety check (``_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE`` of jax 0.10), less
#: ``tf.call_tf_function`` (host code). ``tests/artifacts/test_load_trust.py`` keeps the two in step.
EXPORTABLE_CUSTOM_CALLS = frozenset({
    # sharding, shapes and memory placement
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement", "AllocateBuffer",
    "shape_assertion", "stablehlo.dynamic_approx_top_k", "stablehlo.dynamic_reduce_window",
    "stablehlo.dynamic_rng_bit_generator", "stablehlo.dynamic_top_k", "ApproxTopK",
    # TPU linear algebra, device kernels
    "Eigh", "LuDecomposition", "ProductOfElementaryHouseholderReflectors", "Qr", "tpu_custom_call", "mosaic_gpu_v2",
    # CUDA and ROCm
    "cu_lu_pivots_to_permutation", "cu_threefry2x32_ffi", "cusparse_gtsv2_ffi",
    "hip_lu_pivots_to_permutation", "hip_threefry2x32_ffi",
    *(f"{lib}_{op}_ffi" for lib in ("cusolver", "hipsolver")
      for op in ("geqrf", "gesvd", "gesvdj", "getrf", "orgqr", "potrf", "syevd", "sytrd")),
    "hipsolver_gesdd_ffi",
    # LAPACK on CPU
    *(f"lapack_{t}{op}_ffi" for t in "sdcz"
      for op in ("gees", "geev", "gehrd", "geqrf", "gesdd", "getrf", "gtsv", "potrf", "trsm")),
    *(f"lapack_{t}{op}_ffi" for t in "sd" for op in ("orgqr", "syevd", "sytrd")),
    *(f"lapack_{t}{op}_ffi" for t in "cz" for op in ("ungqr", "heevd", "hetrd")),
})

#: Words that mark a custom-call target as host code, in any case: Python callbacks of every platform and
#: version (``xla_python_cpu_callback``, ``xla_ffi_python_gpu_callback``, ``xla_ffi_partitioned_python_cpu_callback``,
#: ...), TensorFlow calls and host compute.
HOST_CODE_WORDS = ("callback", "python", "call_tf", "host_compute", "hostcompute")
#: Ops that move data between the device and the host.
HOST_TRANSFERS = frozenset(f"{d}.{op}" for d in ("stablehlo", "mhlo") for op in ("send", "recv", "infeed", "outfeed"))


def is_host_callback(target: str) -> bool:
    """Whether a custom-call target runs host code (a Python callback of any platform, TensorFlow, ...)."""
    name = target.lower()
    return any(word in name for word in HOST_CODE_WORDS)


def host_code(ops: C.ProgramOps) -> list[str]:
    """The host callbacks and host transfers of a program (:func:`~jaxaot._src.compat.program_ops`)."""
    return (sorted({c.target for c in ops.custom_calls if is_host_callback(c.target)})
            + sorted(ops.op_names & HOST_TRANSFERS))


def read_ops(name: str, exported: Any, where: str) -> C.ProgramOps:
    """The ops of the ``name`` program, or an :class:`ArtifactError` when its StableHLO cannot be parsed."""
    try:
        return C.program_ops(exported)
    except Exception as err:
        raise ArtifactError(f"{where}: the {name} program's StableHLO cannot be read: {type(err).__name__}: {err}"
                            ) from err


def check_program(name: str, exported: Any, where: str, *, allow_callbacks: bool,
                  allow_custom_calls: Collection[str] = (), declared: bool = False) -> None:
    """Raise :class:`ArtifactError` unless every op of the ``name`` program may run here.

    ``declared``: whether the manifest says host callbacks were exported (it
    never is for jaxaot's own exports); a program with callbacks the manifest
    does not declare was altered after export, which the message says.
    ``allow_custom_calls``: targets to let through unchecked (host callbacks
    need ``allow_callbacks`` however they are named).
    """
    ops = read_ops(name, exported, where)
    host = host_code(ops)
    if host and not allow_callbacks:
        how = ("the manifest declares them" if declared else
               "the manifest says none were exported: the program was altered after export")
        raise ArtifactError(
            f"{where}: the {name} program calls host code ({', '.join(host)}); {how}. A host callback runs "
            "whatever this process registered under its index, not code from the artifact: refusing to load it. "
            "Pass jaxaot.export.load(..., allow_callbacks=True) only for an artifact you built yourself.")
    checked = [c for c in ops.custom_calls if not is_host_callback(c.target) and c.target not in allow_custom_calls]
    unknown = sorted({c.target for c in checked if c.target not in EXPORTABLE_CUSTOM_CALLS})
    if unknown:
        raise ArtifactError(
            f"{where}: the {name} program calls custom targets that jax.export does not produce "
            f"({', '.join(unknown)}): refusing to load it (the artifact was altered after export). Name them in "
            "jaxaot.export.load(..., allow_custom_calls=...) only if you trust their kernels with this artifact.")
    for call in checked:
        why = mismatch(call)
        if why is not None:
            raise ArtifactError(
                f"{where}: the {name} program's custom call {call.target} does not fit its type rule: {why}. "
                "Its kernel would read or write outside its buffers: refusing to load it. Name the target in "
                "jaxaot.export.load(..., allow_custom_calls=...) only if you built this artifact yourself.")


def check_platforms(programs: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ArtifactError` unless this process has a platform every program was exported for."""
    here = C.available_platforms()
    for name, program in programs.items():
        exported_for = tuple(program.platforms)
        if not set(exported_for) & here:
            raise ArtifactError(
                f"{where}: the {name} program was exported for {', '.join(exported_for)}, and this process runs "
                f"on {', '.join(sorted(here))}: it cannot run here. Re-export it with "
                f"jaxaot.export.export(..., platforms=({', '.join(repr(p) for p in sorted(here | set(exported_for)))})).")


#: Dtypes JAX makes only with ``jax_enable_x64``.
WIDE = frozenset({"float64", "int64", "uint64", "complex128"})


def check_calls(programs: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ArtifactError` unless a call of each program lowers as ``jax.export`` lowers it.

    Lowering (not compiling) a call for a platform of this process reads the
    program's StableHLO as a call will: its entry function ``main`` must be
    there, and take the values the program's own metadata (``in_avals``) says, in
    number and type; a program exported for several devices is called on a mesh
    of that many (``LoadedAOT`` checks this process has them first).
    """
    here = C.available_platforms()
    for name, program in programs.items():
        platform = next(p for p in program.platforms if p in here)
        # 64-bit inputs are lowered as 64-bit, whatever jax_enable_x64 says: a call checks that setting itself
        # (LoadedAOT's input checks name it), and the program is not damaged for it.
        wide = any(dtype_name(a.dtype) in WIDE for a in (*program.in_avals, *program.out_avals))
        n = int(getattr(program, "nr_devices", 1))
        placed = {} if n == 1 else {"in_shardings": jax.sharding.NamedSharding(
            jax.sharding.Mesh(np.array(jax.devices(platform)[:n]), ("devices",)), jax.sharding.PartitionSpec())}
        try:
            with jax.enable_x64(True) if wide else contextlib.nullcontext():
                avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in program.in_avals]
                jax.jit(program.call, **placed).trace(*avals).lower(lowering_platforms=(platform,))
        except Exception as err:
            why = " ".join(line.strip() for line in str(err).splitlines()[:2])
            raise ArtifactError(
                f"{where}: the {name} program cannot be called as its own metadata describes it "
                f"({type(err).__name__}: {why[:300]}): the program is damaged or was altered after export."
            ) from err


def check_signature(programs: Mapping[str, Any], signature: AOTSignature, where: str) -> None:
    """Raise :class:`ArtifactError` unless each program takes and returns what the signature says.

    Inference: the inputs, then the outputs and a ``bool[]`` per inference
    check. Forward: the inputs, then the outputs, the temporaries and a
    ``bool[]`` per forward check. Backward: the cotangents of
    ``cotangent_outputs`` and the residuals, then a gradient per ``grad_inputs``.
    Each temporary that is saved has its residual's type; each saved input or
    output, the residual's too. Every program takes a flat tuple of arrays and
    returns a flat list (or tuple) of them.
    """
    s = signature
    n_out, n_saved_in = len(s.out_specs), len(s.saved_inputs)
    flag = ArraySpec((), "bool")
    for k, i in enumerate(s.saved_inputs):
        _same(f"residual {k}", s.residual_specs[k], s.in_specs[i], where, "saved input")
    temporaries: list[ArraySpec | None] = [None] * s.num_temporaries
    for j, i in enumerate(s.saved_outputs):
        spec = s.residual_specs[n_saved_in + j]
        if i < n_out:
            _same(f"residual {n_saved_in + j}", spec, s.out_specs[i], where, "saved output")
        else:
            temporaries[i - n_out] = spec
    expected = {
        "inference": (s.in_specs, [*s.out_specs, *[flag] * len(s.inference_checks)]),
        "forward": (s.in_specs, [*s.out_specs, *temporaries, *[flag] * len(s.forward_checks)]),
        "backward": ([*(s.out_specs[i] for i in s.cotangent_outputs), *s.residual_specs],
                     [s.in_specs[i] for i in s.grad_inputs]),
    }
    for name, (ins, outs) in expected.items():
        program = programs[name]
        _check_avals(name, "inputs", list(program.in_avals), ins, where)
        _check_avals(name, "outputs", list(program.out_avals), outs, where)
        _check_structure(name, program, where)


def check_vjps(programs: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ArtifactError` unless each vjp program a program holds takes its primal's inputs and the
    cotangents of its outputs, and returns one cotangent per input (as ``jax.export`` calls it)."""
    for name, program in programs.items():
        primal, what = program, name
        while primal.has_vjp():  # deserialized: the chain ends
            vjp, what = primal.vjp(), f"{what}'s vjp"
            n_in, n_out = len(primal.in_avals), len(primal.out_avals)
            if (len(vjp.in_avals), len(vjp.out_avals)) != (n_in + n_out, n_in):
                raise ArtifactError(
                    f"{where}: the {what} program takes {len(vjp.in_avals)} and returns {len(vjp.out_avals)} "
                    f"arrays, where the vjp of a program of {n_in} inputs and {n_out} outputs takes "
                    f"{n_in + n_out} and returns {n_in}: the program was altered after export.")
            _check_avals(what, "inputs", list(vjp.in_avals)[:n_in],
                         [ArraySpec.of(a) for a in primal.in_avals], where)
            _check_structure(what, vjp, where)
            primal = vjp


def _check_structure(name: str, program: Any, where: str) -> None:
    n_in, n_out = len(program.in_avals), len(program.out_avals)
    leaves = list(range(n_out))
    structures = {
        "inputs": (program.in_tree, [jax.tree_util.tree_structure((tuple(range(n_in)), {}))]),
        "outputs": (program.out_tree, [jax.tree_util.tree_structure(leaves),
                                       jax.tree_util.tree_structure(tuple(leaves))]),
    }
    for what, (have, allowed) in structures.items():
        if have not in allowed:
            raise ArtifactError(
                f"{where}: the {name} program's {what} are structured as {have}, not as the flat sequence of "
                f"{n_in if what == 'inputs' else n_out} arrays the signature describes ({allowed[0]}): the "
                "programs do not belong to this manifest (swapped or altered).")


def _check_avals(name: str, what: str, avals: Sequence[Any], specs: Sequence[ArraySpec | None], where: str) -> None:
    if len(avals) != len(specs):
        raise ArtifactError(f"{where}: the {name} program has {len(avals)} {what}, the signature says {len(specs)}: "
                            "the programs do not belong to this manifest (swapped or altered).")
    for i, (aval, spec) in enumerate(zip(avals, specs)):
        if spec is not None and not _matches(spec, aval):
            raise ArtifactError(
                f"{where}: {what[:-1]} {i} of the {name} program is {_describe(aval)}, the signature says {spec}: "
                "the programs do not belong to this manifest (swapped or altered).")


def _same(what: str, a: ArraySpec, b: ArraySpec, where: str, of: str) -> None:
    if (tuple(a.shape), a.dtype) != (tuple(b.shape), b.dtype):
        raise ArtifactError(f"{where}: {what} is declared {a}, but the {of} it holds is {b}.")


def _matches(spec: ArraySpec, aval: Any) -> bool:
    shape = tuple(str(d) if jax.export.is_symbolic_dim(d) else int(d) for d in aval.shape)
    return shape == tuple(spec.shape) and dtype_name(aval.dtype) == spec.dtype


def _describe(aval: Any) -> str:
    return f"{dtype_name(aval.dtype)}[{','.join(map(str, aval.shape))}]"
