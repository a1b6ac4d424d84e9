"""Exported programs read op by op, and the platforms of this process (part of :mod:`jaxaot._src.compat`).

The load audit (:mod:`jaxaot._src.artifacts.audit`) checks what a deserialized
``jax.export.Exported`` program will do before it can run. :func:`program_ops`
parses its StableHLO with the MLIR bindings that jaxlib ships (the parse XLA
itself will see, not a search of printed text) and walks every op, nested
regions included, into plain records: the names of all ops, and each
``stablehlo.custom_call`` with its target, operand and result types, API
version, attributes, layouts and aliases.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.compat import program_ops
    >>> exp = jax.export.export(jax.jit(lambda x: jax.scipy.linalg.lu_factor(x)), platforms=["cpu"])(jnp.ones((4, 3)))
    >>> (call,) = program_ops(exp).custom_calls
    >>> call.target, [str(t) for t in call.results]
    ('lapack_sgetrf_ffi', ['float32[4,3]', 'int32[3]', 'int32[]'])
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
from jax._src import xla_bridge as _xb
from jax._src.interpreters import mlir as _mlir
from jax._src.lib.mlir import ir as _ir

_ELEMENT_TYPES = {
    "i1": "bool", "i4": "int4", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "ui4": "uint4", "ui8": "uint8", "ui16": "uint16", "ui32": "uint32", "ui64": "uint64",
    "si8": "int8", "si16": "int16", "si32": "int32", "si64": "int64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "complex<f32>": "complex64", "complex<f64>": "complex128",
}


@dataclasses.dataclass(frozen=True)
class TensorType:
    """An operand's or result's type: its shape (None for a dynamic dimension) and dtype name.

    A tuple has dtype ``"tuple"``, rank 0 and its ``elements``; any other value
    that is not a ranked tensor (a token) has its MLIR type, in angle brackets,
    as its dtype.
    """

    shape: tuple
    dtype: str
    elements: tuple = ()

    @property
    def static(self) -> bool:
        return all(d is not None for d in self.shape) and all(e.static for e in self.elements)

    def __str__(self) -> str:
        if self.dtype == "tuple":
            return f"tuple({', '.join(map(str, self.elements))})"
        return f"{self.dtype}[{','.join('?' if d is None else str(d) for d in self.shape)}]"


@dataclasses.dataclass(frozen=True)
class CustomCall:
    """One ``stablehlo.custom_call`` of a program.

    Attributes:
      target: ``call_target_name``.
      operands / results: their :class:`TensorType` s.
      api_version: 4 for typed FFI handlers, 1 to 3 for older conventions.
      config: the ``mhlo.backend_config`` dictionary (the FFI attributes), as Python values.
      backend_config: the string ``backend_config`` of older conventions.
      operand_layouts / result_layouts: per value, its minor-to-major dimension order, or None if unset.
      aliases: ``(result index, operand index)`` pairs that share a buffer;
        ``tuple_aliases`` is True when one names an element of a tuple.
    """

    target: str
    operands: tuple
    results: tuple
    api_version: int = 0
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    backend_config: str = ""
    operand_layouts: tuple | None = None
    result_layouts: tuple | None = None
    aliases: tuple = ()
    tuple_aliases: bool = False


@dataclasses.dataclass(frozen=True)
class ProgramOps:
    """What :func:`program_ops` reads from a program: every op's name, and its custom calls."""

    op_names: frozenset
    custom_calls: tuple


def program_ops(exported: Any) -> ProgramOps:
    """Every op of an exported program: its names, and each custom call as a :class:`CustomCall`.

    Raises whatever the MLIR bindings raise for a module they cannot parse.
    """
    with _mlir.make_ir_context():
        module = _module(exported)
        names: set[str] = set()
        calls: list[CustomCall] = []
        stack = [module.operation]
        while stack:  # iterative: a hostile program may nest regions deeply
            op = stack.pop()
            names.add(op.name)
            if op.name == "stablehlo.custom_call":
                calls.append(_custom_call(op))
            for region in op.regions:
                for block in region.blocks:
                    stack.extend(o.operation for o in block.operations)
    return ProgramOps(frozenset(names), tuple(calls))


def _module(exported: Any) -> Any:
    try:
        from jax._src.lib import _jax
        return _jax.mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
    except (ImportError, AttributeError):  # pragma: no cover - other jaxlib layouts: through the printed text
        return _ir.Module.parse(exported.mlir_module())


def _custom_call(op: Any) -> CustomCall:
    named = op.attributes
    attrs = {named[i].name: named[i].attr for i in range(len(named))}
    aliases, tuple_aliases = _aliases(attrs.get("output_operand_aliases"))
    config = _value(attrs["mhlo.backend_config"]) if "mhlo.backend_config" in attrs else {}
    raw = attrs.get("backend_config")
    return CustomCall(
        target=_value(attrs["call_target_name"]) if "call_target_name" in attrs else "",
        operands=tuple(_type(v.type) for v in op.operands),
        results=tuple(_type(v.type) for v in op.results),
        api_version=int(_value(attrs["api_version"])) if "api_version" in attrs else 0,
        config=config if isinstance(config, dict) else {"": config},
        backend_config=_value(raw) if raw is not None and _as(raw, _ir.StringAttr) is not None else "",
        operand_layouts=_layouts(attrs.get("operand_layouts")),
        result_layouts=_layouts(attrs.get("result_layouts")),
        aliases=aliases,
        tuple_aliases=tuple_aliases,
    )


def _as(x: Any, cls: type) -> Any:
    """``x`` as an instance of the MLIR class ``cls``, or None (across versions of the bindings)."""
    down = x.maybe_downcast() if hasattr(x, "maybe_downcast") else x
    if isinstance(down, cls):
        return down
    check = getattr(cls, "isinstance", None)
    return cls(x) if check is not None and check(x) else None


def _type(t: Any) -> TensorType:
    rt = _as(t, _ir.RankedTensorType)
    if rt is None:
        tt = _as(t, _ir.TupleType)
        if tt is not None:
            return TensorType((), "tuple", tuple(_type(tt.get_type(i)) for i in range(tt.num_types)))
        return TensorType((), f"<{t}>")
    shape = tuple(None if rt.is_dynamic_dim(i) else int(d) for i, d in enumerate(rt.shape))
    element = str(rt.element_type)
    return TensorType(shape, _ELEMENT_TYPES.get(element, element))


def _value(a: Any) -> Any:
    """An MLIR attribute as a Python value (bool, int, float, str, tuple, dict), else its text."""
    for cls, convert in _CONVERT:
        x = _as(a, cls)
        if x is not None:
            return convert(x)
    return str(a)


def _dict(d: Any) -> dict:
    return {d[i].name: _value(d[i].attr) for i in range(len(d))}


_CONVERT = (
    (_ir.BoolAttr, lambda x: bool(x.value)),
    (_ir.IntegerAttr, lambda x: int(x.value)),
    (_ir.FloatAttr, lambda x: float(x.value)),
    (_ir.StringAttr, lambda x: x.value_bytes.decode("utf-8", "replace")),
    (_ir.DenseIntElementsAttr, lambda x: tuple(int(v) for v in x)),
    (_ir.ArrayAttr, lambda x: tuple(_value(v) for v in x)),
    (_ir.DictAttr, _dict),
)


def _layouts(a: Any) -> tuple | None:
    if a is None or _as(a, _ir.ArrayAttr) is None:
        return None
    return tuple(tuple(x) if isinstance(x, tuple) else None for x in _value(a))


def _aliases(a: Any) -> tuple[tuple, bool]:
    if a is None:
        return (), False
    from jax._src.lib.mlir.dialects import hlo

    out, nested = [], False
    for x in _as(a, _ir.ArrayAttr):
        alias = hlo.OutputOperandAlias(x)
        result = list(alias.output_tuple_indices)
        nested = nested or len(result) > 1 or bool(list(alias.operand_tuple_indices))
        out.append((result[0] if result else 0, int(alias.operand_index)))
    return tuple(out), nested


# --------------------------------------------------------------------------- platforms
def platform_of(device: Any) -> str:
    """The lowering platform of a device, as ``jax.export`` names them: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``."""
    return _xb.canonicalize_platform(device.platform)


def default_platform() -> str:
    """The lowering platform of this process's default backend."""
    return _xb.canonicalize_platform(jax.default_backend())


@functools.lru_cache(maxsize=None)
def available_platforms() -> frozenset:
    """The lowering platforms of every backend this process can run on (its backends are fixed once started)."""
    out = set()
    for name in ("cpu", "gpu", "cuda", "rocm", "tpu"):
        try:
            devices = jax.devices(name)
        except RuntimeError:
            continue
        out.update(platform_of(d) for d in devices)
    return frozenset(out)


__all__ = ["CustomCall", "ProgramOps", "TensorType", "available_platforms", "default_platform", "platform_of",
           "program_ops"]
