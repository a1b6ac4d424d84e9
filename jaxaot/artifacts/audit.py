"""What a loaded program may contain and what it must take: custom calls and the signature's types.

``jax.export`` serializes StableHLO, which runs no Python by itself; but a
program can name a *custom call*, and some targets run host code. A host
callback (``jax.pure_callback``, ``io_callback``, ``jax.debug.print``) lowers to
``stablehlo.custom_call @xla_ffi_python_cpu_callback`` whose only argument is an
*index into the loading process's table of callbacks*: planted in an artifact,
it segfaults when called eagerly and, inside a ``jax.jit`` that has callbacks of
its own, calls one of the user's functions with the artifact's data.
``jax.export`` refuses host callbacks at export, and so does
:func:`jaxaot.export`, but nothing checks a deserialized program, so
:func:`check_program` does, at load:

* every custom-call target must be in :data:`EXPORTABLE_CUSTOM_CALLS`, the
  targets ``jax.export`` lets an exported program contain (sharding
  annotations, shape assertions, LAPACK/cuSOLVER kernels, Pallas kernels),
  less ``tf.call_tf_function``, which runs TensorFlow on the host;
* host callbacks (a target naming a callback) and host transfers (``send``,
  ``recv``, ``infeed``, ``outfeed``) are refused unless the user passes
  ``allow_callbacks=True`` to :func:`~jaxaot.load`.

The program text is read with ``Exported.mlir_module()``, which prints each op
on a line of its own, so ops are matched at the start of a line (a string in a
location or attribute cannot hide or fake one). jaxaot's own loop-overflow
checks are no callbacks in an artifact: :func:`~jaxaot.export` hoists them into
boolean outputs (:class:`~jaxaot.artifacts.signature.RuntimeCheck`).

:func:`check_signature` compares every program's own ``in_avals`` and
``out_avals`` (shape and dtype) with what the manifest's signature says it
takes and returns, so programs swapped inside an artifact, or a signature
edited to disagree with them, are refused at load instead of failing later
with a raw ``IndexError``.

Cost: printing a program's StableHLO is linear in its size, once per load.

Example:
    >>> from jaxaot.artifacts.audit import host_code, custom_call_targets
    >>> text = '  %0 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) : (tensor<3xf32>) -> tensor<3xf32>'
    >>> sorted(custom_call_targets(text)), host_code(text)
    (['xla_ffi_python_cpu_callback'], ['xla_ffi_python_cpu_callback'])
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax

from jaxaot._pytrees import dtype_name
from jaxaot.artifacts.signature import AOTSignature, ArraySpec
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

_OP = re.compile(r'^[ \t]*(?:%[^=\n]*=[ \t]*)?"?([A-Za-z_][\w$]*\.[\w.$]+)"?', re.M)
_PRETTY_TARGET = re.compile(r'custom_call"?[ \t]+@(?:"((?:[^"\\\n]|\\.)*)"|([\w.$-]+))')
_GENERIC_TARGET = re.compile(r'call_target_name[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"')
_HOST_TRANSFERS = ("send", "recv", "infeed", "outfeed")


def custom_call_targets(text: str) -> set[str]:
    """Every custom-call target in a program's StableHLO text (pretty or generic op syntax)."""
    targets: set[str] = set()
    for m in _OP.finditer(text):
        if not m.group(1).endswith(".custom_call"):
            continue
        end = text.find("\n", m.start())
        line = text[m.start(): end if end >= 0 else len(text)]
        found = [a or b for a, b in _PRETTY_TARGET.findall(line)] + _GENERIC_TARGET.findall(line)
        targets.update(found or ["<unnamed>"])
    return targets


def is_host_callback(target: str) -> bool:
    """Whether a custom-call target calls back into the host's Python (``xla_ffi_python_cpu_callback``, ...)."""
    return "callback" in target.lower()


def host_code(text: str) -> list[str]:
    """The host callbacks and host transfers (``send``/``recv``/``infeed``/``outfeed`` ops) of a program."""
    found = sorted(t for t in custom_call_targets(text) if is_host_callback(t))
    found += sorted({m.group(1) for m in _OP.finditer(text) if m.group(1).rsplit(".", 1)[1] in _HOST_TRANSFERS})
    return found


def check_program(name: str, exported: Any, where: str, *, allow_callbacks: bool, declared: bool = False) -> None:
    """Raise :class:`ArtifactError` if the ``name`` program runs host code or calls an unknown custom target.

    ``declared``: whether the manifest says host callbacks were exported (it
    never is for jaxaot's own exports); a program with callbacks the manifest
    does not declare was altered after export, which the message says.
    """
    try:
        text = exported.mlir_module()
    except Exception as err:
        raise ArtifactError(f"{where}: the {name} program's StableHLO cannot be read: {type(err).__name__}: {err}"
                            ) from err
    host = host_code(text)
    if host and not allow_callbacks:
        how = ("the manifest declares them" if declared else
               "the manifest says none were exported: the program was altered after export")
        raise ArtifactError(
            f"{where}: the {name} program calls host code ({', '.join(host)}); {how}. A host callback runs "
            "whatever this process registered under its index, not code from the artifact: refusing to load it. "
            "Pass jaxaot.load(..., allow_callbacks=True) only for an artifact you built yourself.")
    unknown = sorted(t for t in custom_call_targets(text) if t not in EXPORTABLE_CUSTOM_CALLS
                     and not is_host_callback(t))
    if unknown:
        raise ArtifactError(
            f"{where}: the {name} program calls custom targets that jax.export does not produce "
            f"({', '.join(unknown)}): refusing to load it (the artifact was altered after export).")


def check_signature(programs: Mapping[str, Any], signature: AOTSignature, where: str) -> None:
    """Raise :class:`ArtifactError` unless each program takes and returns what the signature says.

    Inference: the inputs, then the outputs and a ``bool[]`` per inference
    check. Forward: the inputs, then the outputs, the temporaries and a
    ``bool[]`` per forward check. Backward: the cotangents of
    ``cotangent_outputs`` and the residuals, then a gradient per ``grad_inputs``.
    Each temporary that is saved has its residual's type; each saved input or
    output, the residual's too.
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
