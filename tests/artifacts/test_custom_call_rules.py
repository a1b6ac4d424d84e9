"""Every custom call of a loaded program is checked against its target's type rule before it can run.

The attack: an artifact whose program calls ``lapack_sgetrf_ffi`` (allowlisted)
on a 1024 x 1024 input with a 1-float result buffer passed a check of target
names, then overwrote the heap on its first call (SIGSEGV; with a 1-int pivot
buffer, "Mutex corrupt"). Each call's operand and result types must be
exactly those its kernel reads and writes; here that is checked three ways:

* against ``jax``'s own lowering of every linear-algebra function, for each
  platform (lowered here, for CPU, CUDA, ROCm and TPU) - no false refusals;
* against the programs ``jax`` keeps to test its export compatibility (every
  allowlisted target, in the forms older jax versions wrote);
* by changing one dimension or dtype of each call's operands and results: each
  change is refused.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src import compat as C
from jaxaot._src.artifacts import audit
from jaxaot._src.artifacts.custom_calls import RULES, mismatch
from jaxaot.errors import ArtifactError
from reliability.hostile import program_from_text, write_program

PLATFORMS = ["cpu", "cuda", "rocm", "tpu"]


def _square(x):
    k = min(x.shape[-2:])
    return x[..., :k, :k]


LINALG = {
    "lu_factor": lambda x: jax.scipy.linalg.lu_factor(_square(x)),
    "lu": lambda x: jax.lax.linalg.lu(x),
    "qr": lambda x: jnp.linalg.qr(x),
    "qr_complete": lambda x: jnp.linalg.qr(x, mode="complete"),
    "svd": lambda x: jnp.linalg.svd(x),
    "svd_values": lambda x: jnp.linalg.svd(x, compute_uv=False),
    "svd_reduced": lambda x: jnp.linalg.svd(x, full_matrices=False),
    "svd_qr": lambda x: jax.lax.linalg.svd(x, algorithm=jax.lax.linalg.SvdAlgorithm.QR),
    "eig": lambda x: jnp.linalg.eig(_square(x)),
    "eigvals": lambda x: jnp.linalg.eigvals(_square(x)),
    "eigh": lambda x: jnp.linalg.eigh(_square(x)),
    "cholesky": lambda x: jnp.linalg.cholesky(_square(x)),
    "solve_triangular": lambda x: jax.scipy.linalg.solve_triangular(_square(x), _square(x)[..., :2]),
    "solve_right": lambda x: jax.lax.linalg.triangular_solve(_square(x), _square(x)[..., :1, :], left_side=False),
    "tridiagonal_solve": lambda x: jax.lax.linalg.tridiagonal_solve(
        x[..., 0, :], x[..., 0, :] + 3, x[..., 0, :], jnp.ones(x.shape[:-2] + (x.shape[-1], 2), x.dtype)),
    "schur": lambda x: jax.scipy.linalg.schur(_square(x)),
    "hessenberg": lambda x: jax.scipy.linalg.hessenberg(_square(x)),
    "tridiagonal": lambda x: jax.lax.linalg.tridiagonal(_square(x)),
    "solve": lambda x: jnp.linalg.solve(_square(x), _square(x)[..., :1]),
    "det": lambda x: jnp.linalg.det(_square(x)),
    "pinv": lambda x: jnp.linalg.pinv(x),
    "approx_max_k": lambda x: jax.lax.approx_max_k(jnp.real(x), 2),
}


def _lowered_calls(platform: str, dtype: str, shape: tuple) -> list:
    """The custom calls of jax's lowering of every function of :data:`LINALG` (those the platform has)."""
    x = jax.ShapeDtypeStruct(shape, dtype)
    calls = []
    for fn in LINALG.values():
        try:
            exported = jax.export.export(jax.jit(fn), platforms=[platform])(x)
        except (NotImplementedError, ValueError, TypeError):  # no lowering there, or not exportable there
            continue
        calls += C.program_ops(exported).custom_calls
    return calls


def _check_lowering(platform: str, dtype: str, shape: tuple) -> set:
    calls = _lowered_calls(platform, dtype, shape)
    refused = [(c.target, mismatch(c)) for c in calls if mismatch(c)]
    assert not refused, refused
    return {c.target for c in calls}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_jax_s_own_lowering_keeps_every_rule(platform):
    seen = _check_lowering(platform, "float32", (2, 5, 4)) | _check_lowering(platform, "complex64", (4, 5))
    assert len(seen) >= {"cpu": 20, "cuda": 9, "rocm": 8, "tpu": 4}[platform], seen


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_jax_s_own_lowering_keeps_every_rule_for_every_dtype_and_shape(platform, dtype):
    with jax.enable_x64(True):
        for shape in [(5, 4), (4, 5), (4, 4), (2, 3, 4, 4), (1, 1), (40, 36)]:
            _check_lowering(platform, dtype, shape)


def test_gpu_random_bits_keep_their_rule():
    old = jax.config.jax_threefry_gpu_kernel_lowering
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        exported = jax.export.export(jax.jit(lambda k: jax.random.bits(k, (3, 5))), platforms=["cuda", "rocm"])(
            jax.random.key_data(jax.random.key(0)))
    finally:
        jax.config.update("jax_threefry_gpu_kernel_lowering", old)
    calls = C.program_ops(exported).custom_calls
    assert {c.target for c in calls} == {"cu_threefry2x32_ffi", "hip_threefry2x32_ffi"}
    assert all(mismatch(c) is None for c in calls)
    bad = dataclasses.replace(calls[0], results=calls[0].results[:1] + (C.TensorType((1,), "uint32"),))
    assert "result 1 (bits 1) is uint32[1]" in mismatch(bad)


# --------------------------------------------------------------------------- jax's compatibility corpus
def _corpus_calls() -> list:
    """The custom calls of allowlisted targets in the programs jax keeps to test export compatibility."""
    data = importlib.import_module("jax._src.internal_test_util.export_back_compat_test_data")
    calls = []
    for info in pkgutil.iter_modules(data.__path__):
        if info.ispkg:
            continue
        module = importlib.import_module(f"{data.__name__}.{info.name}")
        for value in vars(module).values():
            entries = [value] if isinstance(value, dict) else []
            if isinstance(value, dict) and "mlir_module_serialized" not in value:
                entries = [v for v in value.values() if isinstance(v, dict)]
            for entry in entries:
                if "mlir_module_serialized" in entry:
                    program = types.SimpleNamespace(mlir_module_serialized=entry["mlir_module_serialized"])
                    calls += [c for c in C.program_ops(program).custom_calls if c.target in audit.EXPORTABLE_CUSTOM_CALLS]
    return calls


@pytest.fixture(scope="module")
def corpus():
    calls = _corpus_calls()
    assert len({c.target for c in calls}) >= 60
    return calls


def test_jax_s_compatibility_corpus_keeps_every_rule(corpus):
    refused = [(c.target, mismatch(c)) for c in corpus if mismatch(c)]
    assert not refused, refused


def test_every_allowlisted_target_has_a_rule_but_pallas_kernels():
    assert set(RULES) <= audit.EXPORTABLE_CUSTOM_CALLS
    assert audit.EXPORTABLE_CUSTOM_CALLS - set(RULES) == {"tpu_custom_call", "mosaic_gpu_v2"}


KERNELS = ("lapack_", "cusolver_", "hipsolver_", "cu_", "hip_", "cusparse_", "Qr", "Eigh", "LuDecomposition",
           "ProductOfElementaryHouseholderReflectors")
#: Operands a kernel reads only as far as another tells it to: fewer is no overrun.
_SHORTER_IS_SAFE = {"lu_pivots_to_permutation": 0, "orgqr_ffi": 1, "ungqr_ffi": 1,
                    "ProductOfElementaryHouseholderReflectors": 1}


def _mutations(call):
    """Each ``(what, call)`` with one type changed: a dimension cut to 1, a dtype widened, a result dropped."""
    for kind in ("results", "operands"):
        types_ = getattr(call, kind)
        for i, t in enumerate(types_):
            if kind == "operands" and any(call.target.endswith(k) and i == j for k, j in _SHORTER_IS_SAFE.items()):
                continue
            flat = t.elements if t.dtype == "tuple" else (t,)
            for e, leaf in enumerate(flat):
                for j, d in enumerate(leaf.shape):
                    if d and d > 1:
                        shape = leaf.shape[:j] + (1,) + leaf.shape[j + 1:]
                        yield f"{kind} {i}.{e} dim {j} -> 1", _replace(call, kind, i, e, C.TensorType(shape, leaf.dtype))
                wider = {"float32": "float64", "int32": "int64", "complex64": "complex128", "uint32": "uint64"}
                if leaf.dtype in wider:
                    yield (f"{kind} {i}.{e} dtype", _replace(call, kind, i, e,
                                                             C.TensorType(leaf.shape, wider[leaf.dtype])))
    yield "a result dropped", dataclasses.replace(call, results=call.results[:-1])


def _replace(call, kind, i, e, leaf):
    types_ = list(getattr(call, kind))
    t = types_[i]
    if t.dtype == "tuple":
        leaf = C.TensorType((), "tuple", t.elements[:e] + (leaf,) + t.elements[e + 1:])
    types_[i] = leaf
    return dataclasses.replace(call, **{kind: tuple(types_)})


def test_every_changed_type_of_a_kernel_call_is_refused(corpus):
    calls = corpus + _lowered_calls("cpu", "float32", (2, 5, 4)) + _lowered_calls("cuda", "float32", (2, 5, 4))
    kept = []
    checked = 0
    for call in calls:
        if not call.target.startswith(KERNELS):
            continue
        for what, changed in _mutations(call):
            checked += 1
            if mismatch(changed) is None:
                kept.append((call.target, what))
    assert checked > 1000 and not kept, kept


# --------------------------------------------------------------------------- at load
def _getrf_attack(n: int, factors: tuple, pivots: tuple):
    """A program calling LAPACK's getrf on an ``n x n`` input with result buffers of the given shapes."""
    def attack(x):
        lu, piv, info = jax.ffi.ffi_call("lapack_sgetrf_ffi", (
            jax.ShapeDtypeStruct(factors, jnp.float32), jax.ShapeDtypeStruct(pivots, jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32)))(x)
        return [jnp.sum(lu) + jnp.sum(piv) + info]
    return jax.export.export(jax.jit(attack))(jax.ShapeDtypeStruct((n, n), jnp.float32))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return jaxaot.export.export(lambda x: jnp.sum(jnp.sin(x)), jax.ShapeDtypeStruct((1024, 1024), jnp.float32)).save(
        tmp_path_factory.mktemp("big") / "art")


@pytest.mark.parametrize("factors,pivots,match", [
    ((1,), (1024,), r"result 0 \(the LU factors\) is float32\[1\], the kernel writes float32\[1024,1024\]"),
    ((1024, 1024), (1,), r"result 1 \(the pivots\) is int32\[1\], the kernel writes int32\[1024\]"),
])
def test_an_undersized_lapack_result_is_refused_at_load(big, tmp_path, factors, pivots, match):
    art = tmp_path / "art"
    shutil.copytree(big, art)
    write_program(art, "inference", _getrf_attack(1024, factors, pivots))
    with pytest.raises(ArtifactError, match=r"the inference program's custom call lapack_sgetrf_ffi does not fit "
                                            r"its type rule: " + match):
        jaxaot.export.load(art)
    # Naming the target is the user's escape hatch (never taken for an artifact from elsewhere).
    assert jaxaot.export.load(art, allow_custom_calls=["lapack_sgetrf_ffi"]).signature == jaxaot.export.load(big).signature


def test_a_pallas_kernel_is_refused_unless_named():
    program = program_from_text("""
      func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
        %0 = stablehlo.custom_call @tpu_custom_call(%arg0) {backend_config = "kernel"} : (tensor<8xf32>) -> tensor<8xf32>
        return %0 : tensor<8xf32>
      }""")
    with pytest.raises(ArtifactError, match=r"custom call tpu_custom_call does not fit its type rule: no rule says"):
        audit.check_program("forward", program, "art", allow_callbacks=False)
    audit.check_program("forward", program, "art", allow_callbacks=False, allow_custom_calls={"tpu_custom_call"})


def test_dynamic_dimensions_of_a_kernel_buffer_are_refused():
    exported = jax.export.export(jax.jit(jnp.linalg.inv), platforms=["cpu"])(
        jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 3, 3"), jnp.float32))
    with pytest.raises(ArtifactError, match=r"lapack_s\w+_ffi does not fit its type rule: .*static dimensions"):
        audit.check_program("forward", exported, "art", allow_callbacks=False)


def test_good_linear_algebra_artifacts_load_and_match_jax(tmp_path):
    def f(a):  # LU factors and triangular solves in the forward and the backward
        return jnp.sum(jnp.linalg.solve(a @ a.T + 3 * jnp.eye(4), a))

    a = jax.random.normal(jax.random.key(1), (4, 4), jnp.float32)
    g = jaxaot.export.load(jaxaot.export.export(f, a).save(tmp_path / "art"))
    np.testing.assert_allclose(g(a), f(a), rtol=1e-4)
    np.testing.assert_allclose(jax.grad(g)(a), jax.grad(f)(a), rtol=1e-3, atol=1e-4)


def test_calls_too_odd_for_a_rule_are_refused_not_raised():
    f32 = "float32"
    odd = [C.CustomCall("lapack_sgetrf_ffi", (C.TensorType((None, 3), f32),), ()),
           C.CustomCall("lapack_sgetrf_ffi", (C.TensorType((), "tuple", (C.TensorType((3, 3), f32),)),), ()),
           C.CustomCall("lapack_sorgqr_ffi", (C.TensorType((4, 3), f32), C.TensorType((None,), f32)),
                        (C.TensorType((4, 3), f32),)),
           C.CustomCall("cusolver_gesvdj_ffi", (C.TensorType((4, 3), f32),), (), config={"full_matrices": "yes"}),
           C.CustomCall("Sharding", (), ())]
    assert all(isinstance(mismatch(c), str) for c in odd)
