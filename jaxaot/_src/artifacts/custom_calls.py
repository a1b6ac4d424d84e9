"""What each custom call a loaded program may make must take and return: one type rule per target.

A custom call runs a kernel that trusts its buffers: a crafted artifact that
declares a result smaller than the kernel writes would overwrite the loading
process's memory. So every target a loaded program calls must have a rule here
(:data:`RULES`: LAPACK, cuSOLVER, GPU helpers, TPU linear algebra, annotations),
and the call must match it: the rule derives, from the operands and attributes,
the exact operand and result types, aliases and layouts ``jax``'s own lowering
gives the kernel. Pallas kernels have no rule: they are refused unless
``jaxaot.export.load(..., allow_custom_calls=...)`` names them.

Example:
    >>> from jaxaot._src.compat import CustomCall, TensorType
    >>> f32, i32 = "float32", "int32"
    >>> call = CustomCall("lapack_sgetrf_ffi", (TensorType((1024, 1024), f32),),
    ...                   (TensorType((1,), f32), TensorType((1024,), i32), TensorType((), i32)))
    >>> print(mismatch(call))
    result 0 (the LU factors) is float32[1], the kernel writes float32[1024,1024]
"""

from __future__ import annotations

from typing import Callable, Sequence

from jaxaot._src.compat import CustomCall, TensorType

I32, U32 = "int32", "uint32"
_LETTERS = {"s": "float32", "d": "float64", "c": "complex64", "z": "complex128"}
_SOLVER_DTYPES = tuple(_LETTERS.values())
_REAL = {"float32": "float32", "float64": "float64", "complex64": "float32", "complex128": "float64"}
_COMPLEX = {"float32": "complex64", "float64": "complex128", "complex64": "complex64", "complex128": "complex128"}
_L, _R, _U, _N, _A, _S, _V = (ord(c) for c in "LRUNASV")


class RuleError(Exception):
    """How a custom call breaks its target's rule (the message)."""


Rule = Callable[[CustomCall], None]


def mismatch(call: CustomCall) -> str | None:
    """How ``call`` breaks its target's rule, or None when it keeps it; a target without a rule is a mismatch."""
    rule = RULES.get(call.target)
    if rule is None:
        return "no rule says what it may take and return"
    try:
        rule(call)
    except RuleError as err:
        return str(err)
    except Exception as err:  # a call too odd for its rule's arithmetic is refused all the same
        return f"its types cannot be checked ({type(err).__name__}: {err})"
    return None


# --------------------------------------------------------------------------- checking a call
def _t(shape: Sequence[int], dtype: str) -> TensorType:
    return TensorType(tuple(shape), dtype)


def _matrix(call: CustomCall, i: int, dtypes: Sequence[str], square: bool = False) -> tuple[tuple, int, int, str]:
    """``(batch, rows, cols, dtype)`` of operand ``i``, a (batch of) matrices of one of ``dtypes``."""
    if len(call.operands) <= i:
        raise RuleError(f"it has {len(call.operands)} operands; the kernel reads at least {i + 1}")
    x = call.operands[i]
    if not x.static:
        raise RuleError(f"operand {i} is {x}: a kernel's buffer must have static dimensions to be checked before "
                        "it runs")
    if x.dtype not in dtypes or len(x.shape) < 2:
        raise RuleError(f"operand {i} is {x}, not a (batch of) {' or '.join(dtypes)} matrices")
    *batch, m, n = x.shape
    if square and m != n:
        raise RuleError(f"operand {i} is {x}, not a (batch of) square matrices")
    return tuple(batch), m, n, x.dtype


def _expect(call: CustomCall, operands: Sequence[tuple[str, TensorType]], results: Sequence[tuple[str, TensorType]],
            column_major: bool = True) -> None:
    """The call's operands and results must be exactly these (what, type), with static shapes, their aliases
    type-preserving and their layouts those the kernel reads (column-major matrices where ``column_major``)."""
    for kind, have, want in (("operand", call.operands, operands), ("result", call.results, results)):
        if len(have) != len(want):
            raise RuleError(f"it has {len(have)} {kind}s; the kernel takes {len(want)} "
                            f"({', '.join(w for w, _ in want)})")
        for i, (got, (what, wanted)) in enumerate(zip(have, want)):
            if not got.static:
                raise RuleError(f"{kind} {i} ({what}) is {got}: a kernel's buffer must have static dimensions to "
                                "be checked before it runs")
            if got != wanted:
                verb = "reads" if kind == "operand" else "writes"
                raise RuleError(f"{kind} {i} ({what}) is {got}, the kernel {verb} {wanted}")
    _check_aliases(call)
    _check_layouts(call, column_major)


def _check_aliases(call: CustomCall) -> None:
    if call.tuple_aliases:
        raise RuleError("an alias names an element of a tuple")
    for r, o in call.aliases:
        if not (0 <= r < len(call.results) and 0 <= o < len(call.operands)):
            raise RuleError(f"it aliases result {r} to operand {o}, which do not exist")
        if call.results[r] != call.operands[o]:
            raise RuleError(f"it aliases result {r} ({call.results[r]}) to operand {o} ({call.operands[o]})")


def _check_layouts(call: CustomCall, column_major: bool) -> None:
    top = max((len(t.shape) for t in call.operands), default=0)
    for kind, types, layouts in (("operand", call.operands, call.operand_layouts),
                                 ("result", call.results, call.result_layouts)):
        if layouts is None:
            continue
        if len(layouts) != len(types):
            raise RuleError(f"it gives {len(layouts)} {kind} layouts for {len(types)} {kind}s")
        for i, (t, layout) in enumerate(zip(types, layouts)):
            rank = len(t.shape)
            row_major = tuple(range(rank - 1, -1, -1))
            want = (rank - 2, rank - 1, *range(rank - 3, -1, -1)) if column_major and rank == top >= 2 else row_major
            if layout is not None and tuple(layout) != want:
                raise RuleError(f"{kind} {i} has layout {tuple(layout)}, the kernel reads {want}")


def _flag(call: CustomCall, name: str, allowed: Sequence, default=None):
    value = call.config.get(name, default)
    if value not in allowed:
        raise RuleError(f"attribute {name}={value!r} is not one the kernel supports ({', '.join(map(repr, allowed))})")
    return value


# --------------------------------------------------------------------------- LAPACK and cuSOLVER
def _getrf(call, dtypes):
    b, m, n, t = _matrix(call, 0, dtypes)
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            [("the LU factors", _t(b + (m, n), t)), ("the pivots", _t(b + (min(m, n),), I32)),
             ("the status", _t(b, I32))])


def _geqrf(call, dtypes):
    b, m, n, t = _matrix(call, 0, dtypes)
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            [("the factors", _t(b + (m, n), t)), ("the Householder scalars", _t(b + (min(m, n),), t))])


def _orgqr(call, dtypes):
    b, m, n, t = _matrix(call, 0, dtypes)
    taus = call.operands[1] if len(call.operands) > 1 else None
    k = taus.shape[-1] if taus is not None and taus.shape and taus.shape[-1] is not None else 0
    if not m >= n >= k:
        raise RuleError(f"operands {call.operands[0]} and {taus} need rows >= columns >= reflectors")
    _expect(call, [("the reflectors", _t(b + (m, n), t)), ("the Householder scalars", _t(b + (k,), t))],
            [("the orthogonal factor", _t(b + (m, n), t))])


def _potrf(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    _expect(call, [("the matrix", _t(b + (n, n), t))], [("the factor", _t(b + (n, n), t)), ("the status", _t(b, I32))])


def _syevd(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            [("the eigenvectors", _t(b + (n, n), t)), ("the eigenvalues", _t(b + (n,), _REAL[t])),
             ("the status", _t(b, I32))])


def _sytrd(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    e = max(n - 1, 0)
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            [("the reduced matrix", _t(b + (n, n), t)), ("the diagonal", _t(b + (n,), _REAL[t])),
             ("the off-diagonal", _t(b + (e,), _REAL[t])), ("the Householder scalars", _t(b + (e,), t)),
             ("the status", _t(b, I32))])


def _geev(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    values = [("the eigenvalues' real parts", _t(b + (n,), t)), ("their imaginary parts", _t(b + (n,), t))]
    if t.startswith("complex"):
        values = [("the eigenvalues", _t(b + (n,), t))]
    vectors = _t(b + (n, n), _COMPLEX[t])
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            [*values, ("the left eigenvectors", vectors), ("the right eigenvectors", vectors),
             ("the status", _t(b, I32))])


def _gees(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    _flag(call, "sort", (_N,))  # the kernel has no eigenvalue ordering
    values = [("the eigenvalues' real parts", _t(b + (n,), t)), ("their imaginary parts", _t(b + (n,), t))]
    if t.startswith("complex"):
        values = [("the eigenvalues", _t(b + (n,), t))]
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            [("the Schur form", _t(b + (n, n), t)), ("the Schur vectors", _t(b + (n, n), t)), *values,
             ("the number selected", _t(b, I32)), ("the status", _t(b, I32))])


def _gehrd(call, dtypes):
    b, n, _, t = _matrix(call, 0, dtypes, square=True)
    low, high = call.config.get("low", 1), call.config.get("high", n)
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= max(high, 1) <= max(n, 1)):
        raise RuleError(f"attributes low={low!r}, high={high!r} are outside 1 <= low <= high <= {n}")
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            [("the Hessenberg form", _t(b + (n, n), t)), ("the Householder scalars", _t(b + (max(n - 1, 0),), t)),
             ("the status", _t(b, I32))])


def _gesdd(call, dtypes):
    b, m, n, t = _matrix(call, 0, dtypes)
    k = min(m, n)
    mode = _flag(call, "mode", (_A, _S, _N))
    shapes = {_A: [((m, m), (n, n))], _S: [((m, k), (k, n))], _N: [((m, m), (n, n)), ((m, k), (k, n))]}[mode]
    _expect_one_of(call, [
        ([("the matrix", _t(b + (m, n), t))],
         [("the overwritten matrix", _t(b + (m, n), t)), ("the singular values", _t(b + (k,), _REAL[t])),
          ("U", _t(b + u, t)), ("V^H", _t(b + v, t)), ("the status", _t(b, I32))])
        for u, v in shapes])


def _trsm(call, dtypes):
    if len(call.operands) < 2:
        raise RuleError(f"it has {len(call.operands)} operands; the kernel reads a triangular matrix and a right side")
    b, m, n, t = _matrix(call, 1, dtypes)
    s = m if _flag(call, "side", (_L, _R), _L) == _L else n
    operands = [("the triangular matrix", _t(b + (s, s), t)), ("the right side", _t(b + (m, n), t))]
    if len(call.operands) == 3:  # older kernels take a scalar alpha
        operands.append(("alpha", _t((), t)))
    _expect(call, operands, [("the solution", _t(b + (m, n), t))])


def _gtsv(call, dtypes):
    if len(call.operands) != 4:
        raise RuleError(f"it has {len(call.operands)} operands; the kernel reads three diagonals and a right side")
    b, m, n, t = _matrix(call, 3, dtypes)
    diag = _t(b + (m,), t)
    _expect(call, [("the lower diagonal", diag), ("the diagonal", diag), ("the upper diagonal", diag),
                   ("the right side", _t(b + (m, n), t))],
            [("the lower diagonal", diag), ("the diagonal", diag), ("the upper diagonal", diag),
             ("the solution", _t(b + (m, n), t)), ("the status", _t(b, I32))])


def _gesvd_gpu(call, dtypes, may_transpose=True):
    b, m, n, t = _matrix(call, 0, dtypes)
    k = min(m, n)
    full = _flag(call, "full_matrices", (True, False), True)
    compute_uv = _flag(call, "compute_uv", (True, False), True)
    transposed = _flag(call, "transposed", (m < n,) if may_transpose else (False,), False)
    u = _t(b + (m, m if full else k), t) if compute_uv else _t((), t)
    vt = _t(b + (n if full else k, n), t) if compute_uv else _t((), t)
    first, second = (("V^H", vt), ("U", u)) if transposed else (("U", u), ("V^H", vt))
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            [("the overwritten matrix", _t(b + (m, n), t)), ("the singular values", _t(b + (k,), _REAL[t])),
             first, second, ("the status", _t(b, I32))], column_major=not transposed)


def _gesvdj_gpu(call, dtypes):
    b, m, n, t = _matrix(call, 0, dtypes)
    k = min(m, n)
    full = _flag(call, "full_matrices", (True, False), True)
    _flag(call, "compute_uv", (True, False), True)
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            [("the overwritten matrix", _t(b + (m, n), t)), ("the singular values", _t(b + (k,), _REAL[t])),
             ("U", _t(b + (m, m if full else k), t)), ("V", _t(b + (n, n if full else k), t)),
             ("the status", _t(b, I32))])


def _expect_one_of(call: CustomCall, forms: Sequence[tuple[list, list]]) -> None:
    errors = []
    for operands, results in forms:
        try:
            return _expect(call, operands, results)
        except RuleError as err:
            errors.append(str(err))
    raise RuleError(errors[0])


# --------------------------------------------------------------------------- GPU helpers
def _pivots_to_permutation(call):
    if len(call.operands) != 1 or len(call.results) != 1 or not call.operands[0].shape or not call.results[0].shape:
        raise RuleError("the kernel reads one batch of pivots and writes one batch of permutations")
    *b, k = call.operands[0].shape
    p = call.results[0].shape[-1]
    if p is None or k is None or p < k or call.config.get("permutation_size", p) != p:
        raise RuleError(f"the permutation {call.results[0]} is shorter than the pivots {call.operands[0]}, or "
                        f"disagrees with permutation_size={call.config.get('permutation_size')}")
    _expect(call, [("the pivots", _t((*b, k), I32))], [("the permutation", _t((*b, p), I32))], column_major=False)


def _threefry(call):
    if not call.results:
        raise RuleError("the kernel writes two arrays of random bits")
    bits = call.results[0]
    _expect(call, [(w, _t(bits.shape, U32)) for w in ("key 0", "key 1", "count 0", "count 1")],
            [("bits 0", _t(bits.shape, U32)), ("bits 1", _t(bits.shape, U32))], column_major=False)


def _gtsv2(call):
    if len(call.operands) != 4:
        raise RuleError(f"it has {len(call.operands)} operands; the kernel reads three diagonals and a right side")
    b, m, n, t = _matrix(call, 3, _SOLVER_DTYPES)
    diag = _t(b + (m,), t)
    _expect(call, [("the lower diagonal", diag), ("the diagonal", diag), ("the upper diagonal", diag),
                   ("the right side", _t(b + (m, n), t))], [("the solution", _t(b + (m, n), t))])


# --------------------------------------------------------------------------- expanded by XLA on TPU
def _expanded(call: CustomCall, results: list[tuple[str, TensorType]]) -> list[tuple[str, TensorType]]:
    """``results`` as the call gives them: flat, or (in older programs) one tuple."""
    if len(call.results) == 1 and call.results[0].dtype == "tuple":
        return [("the results", TensorType((), "tuple", tuple(t for _, t in results)))]
    return results


def _tpu_qr(call):
    b, m, n, t = _matrix(call, 0, _SOLVER_DTYPES)
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            _expanded(call, [("the factors", _t(b + (m, n), t)), ("the scalars", _t(b + (min(m, n),), t))]),
            column_major=False)


def _tpu_householder(call):
    b, m, n, t = _matrix(call, 0, _SOLVER_DTYPES)
    taus = call.operands[1] if len(call.operands) > 1 else None
    k = taus.shape[-1] if taus is not None and taus.shape else None
    if k is None or k > min(m, n):
        raise RuleError(f"the scalars {taus} do not fit the reflectors {call.operands[0]}")
    _expect(call, [("the reflectors", _t(b + (m, n), t)), ("the scalars", _t(b + (k,), t))],
            [("the product", _t(b + (m, n), t))], column_major=False)


def _tpu_lu(call):
    b, m, n, t = _matrix(call, 0, _SOLVER_DTYPES)
    _expect(call, [("the matrix", _t(b + (m, n), t))],
            _expanded(call, [("the LU factors", _t(b + (m, n), t)), ("the pivots", _t(b + (min(m, n),), I32)),
                             ("the permutation", _t(b + (m,), I32))]), column_major=False)


def _tpu_eigh(call):
    b, n, _, t = _matrix(call, 0, _SOLVER_DTYPES, square=True)
    _expect(call, [("the matrix", _t(b + (n, n), t))],
            _expanded(call, [("the eigenvectors", _t(b + (n, n), t)), ("the eigenvalues", _t(b + (n,), _REAL[t]))]),
            column_major=False)


# --------------------------------------------------------------------------- annotations, and ops XLA verifies
def _same_as_operand(call):
    if len(call.operands) != 1 or len(call.results) != 1 or call.operands[0] != call.results[0]:
        raise RuleError("an annotation takes one value and returns it, of the same type")


def _resharding(grows: bool):
    def rule(call):
        if len(call.operands) != 1 or len(call.results) != 1:
            raise RuleError("a resharding takes one value and returns one")
        x, y = call.operands[0], call.results[0]
        small, big = (x, y) if grows else (y, x)
        if x.dtype != y.dtype or len(x.shape) != len(y.shape) or any(
                s is not None and g is not None and s > g for s, g in zip(small.shape, big.shape)):
            raise RuleError(f"{x} cannot be resharded to {y}")
    return rule


def _shape_assertion(call):
    if call.results or not call.operands or call.operands[0] != _t((), "bool") or any(
            o.shape or not o.dtype.startswith(("int", "uint")) for o in call.operands[1:]):
        raise RuleError("a shape assertion takes a bool[] and integer scalars, and returns nothing")


def _allocate(call):
    if call.operands or len(call.results) != 1:
        raise RuleError("AllocateBuffer takes nothing and returns one buffer")


def _approx_top_k(call):
    """``ApproxTopK``: XLA rewrites it into HLO; each result is its operand cut along ``reduction_dim``."""
    n = len(call.results)
    dim = call.config.get("reduction_dim")
    if n == 0 or len(call.operands) < 2 * n or not isinstance(dim, int):
        raise RuleError("it takes n arrays and n initial values, returns n arrays, and names a reduction_dim")
    for i, (x, y) in enumerate(zip(call.operands, call.results)):
        same = x.dtype == y.dtype and len(x.shape) == len(y.shape) and 0 <= dim < len(x.shape)
        if not same or any(a != b for j, (a, b) in enumerate(zip(x.shape, y.shape)) if j != dim) or (
                None not in (x.shape[dim], y.shape[dim]) and y.shape[dim] > x.shape[dim]):
            raise RuleError(f"result {i} ({y}) is not operand {i} ({x}) cut along dimension {dim}")


def _verified_by_xla(call):
    """Ops that StableHLO's shape refinement rewrites into verified ops before anything runs."""


RULES: dict[str, Rule] = {
    **{f"lapack_{c}{op}_ffi": (lambda call, f=f, d=(d,): f(call, d))
       for c, d in _LETTERS.items()
       for op, f in (("getrf", _getrf), ("geqrf", _geqrf), ("potrf", _potrf), ("geev", _geev), ("gees", _gees),
                     ("gehrd", _gehrd), ("gesdd", _gesdd), ("trsm", _trsm), ("gtsv", _gtsv))},
    **{f"lapack_{c}{op}_ffi": (lambda call, f=f, d=(_LETTERS[c],): f(call, d))
       for c, ops in (("s", ("orgqr", "syevd", "sytrd")), ("d", ("orgqr", "syevd", "sytrd")),
                      ("c", ("ungqr", "heevd", "hetrd")), ("z", ("ungqr", "heevd", "hetrd")))
       for op, f in zip(ops, (_orgqr, _syevd, _sytrd))},
    **{f"{lib}_{op}_ffi": (lambda call, f=f: f(call, _SOLVER_DTYPES))
       for lib in ("cusolver", "hipsolver")
       for op, f in (("getrf", _getrf), ("geqrf", _geqrf), ("orgqr", _orgqr), ("potrf", _potrf),
                     ("syevd", _syevd), ("sytrd", _sytrd), ("gesvd", _gesvd_gpu), ("gesvdj", _gesvdj_gpu))},
    "hipsolver_gesdd_ffi": lambda call: _gesvd_gpu(call, _SOLVER_DTYPES, may_transpose=False),
    "cu_lu_pivots_to_permutation": _pivots_to_permutation,
    "hip_lu_pivots_to_permutation": _pivots_to_permutation,
    "cu_threefry2x32_ffi": _threefry,
    "hip_threefry2x32_ffi": _threefry,
    "cusparse_gtsv2_ffi": _gtsv2,
    "Qr": _tpu_qr,
    "ProductOfElementaryHouseholderReflectors": _tpu_householder,
    "LuDecomposition": _tpu_lu,
    "Eigh": _tpu_eigh,
    "Sharding": _same_as_operand,
    "annotate_device_placement": _same_as_operand,
    "SPMDFullToShardShape": _resharding(grows=False),
    "SPMDShardToFullShape": _resharding(grows=True),
    "shape_assertion": _shape_assertion,
    "AllocateBuffer": _allocate,
    "ApproxTopK": _approx_top_k,
    **{t: _verified_by_xla for t in ("stablehlo.dynamic_approx_top_k", "stablehlo.dynamic_top_k",
                                     "stablehlo.dynamic_reduce_window", "stablehlo.dynamic_rng_bit_generator")},
}
