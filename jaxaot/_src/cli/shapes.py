"""What ``jaxaot inspect --shapes`` reads: abstract arguments, flat or as pytrees.

Two forms, told apart by the first character:

* a plain list, one ``dtype[dims]`` per positional argument, separated by
  spaces: ``"f32[8,16] f32[4, 8]"`` (spaces inside the brackets are fine);
* JSON, for pytree arguments: a JSON list holds the positional arguments, any
  other JSON value is the only positional argument. Inside it, a string is one
  array (``"f32[8,16]"``), a list is a list node and an object is a dict node:
  ``'[{"w": "f32[8,16]", "b": "f32[16]"}, "f32[4,8]"]'``.

Example:
    >>> [(s.shape, s.dtype.name) for s in parse_shapes("f32[8, 16] i32[]")]
    [((8, 16), 'float32'), ((), 'int32')]
    >>> args = parse_shapes('[{"w": "f32[8,16]", "b": "f32[16]"}, ["f32[4,8]", "i32[4]"]]')
    >>> args[0]["w"].shape, [x.dtype.name for x in args[1]]
    ((8, 16), ['float32', 'int32'])
    >>> parse_shapes("q8[2]")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jaxaot.errors.InvalidValueError: cannot read shape 'q8[2]': unknown dtype 'q8'; use one of f64, f32, ...
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax
import numpy as np

from jaxaot._src.pytrees import dtype_from_short, short_dtype_names
from jaxaot.errors import InvalidValueError

# One token of the plain form: dtype[dims] (spaces allowed inside the brackets), or anything up to a space.
_TOKEN = re.compile(r"[^\s\[]*\[[^\[\]]*\](?!\S)|\S+")
_SHAPE = re.compile(r"\s*(?P<dtype>\w+)\[(?P<dims>[\d\s,]*)\]\s*")


def parse_shapes(spec: str) -> list[Any]:
    """The positional arguments ``spec`` describes, as pytrees of ``jax.ShapeDtypeStruct``.

    Raises :class:`~jaxaot.errors.InvalidValueError` naming what it cannot read.
    """
    text = spec.strip()
    if not text:
        raise InvalidValueError("cannot read shapes from an empty --shapes: give one dtype[dims] per positional "
                                "argument, e.g. \"f32[8,16] f32[4,8]\", or a JSON spec for pytrees")
    if text[0] in "[{\"":
        try:
            tree = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidValueError(f"cannot read --shapes as JSON: {e.msg} at character {e.pos}") from None
        return [_from_json(x, f"[{i}]") for i, x in enumerate(tree)] if isinstance(tree, list) \
            else [_from_json(tree, "")]
    return [parse_shape(tok) for tok in _TOKEN.findall(text)]


def _from_json(node: Any, where: str) -> Any:
    if isinstance(node, str):
        return parse_shape(node)
    if isinstance(node, list):
        return [_from_json(x, f"{where}[{i}]") for i, x in enumerate(node)]
    if isinstance(node, dict):
        return {k: _from_json(v, f"{where}[{k!r}]") for k, v in node.items()}
    raise InvalidValueError(f"cannot read --shapes at argument{where}: {json.dumps(node)} is neither a "
                            "\"dtype[dims]\" string, a list nor an object")


def parse_shape(tok: str) -> jax.ShapeDtypeStruct:
    """``"f32[8, 16]"`` -> ``jax.ShapeDtypeStruct((8, 16), float32)``."""
    m = _SHAPE.fullmatch(tok)
    if not m:
        raise InvalidValueError(f"cannot read shape {tok!r}: write dtype[dims], e.g. f32[8,16] or i32[] "
                                f"(dtype one of {', '.join(short_dtype_names())})")
    dtype = dtype_from_short(m["dtype"])
    if dtype is None:
        raise InvalidValueError(f"cannot read shape {tok!r}: unknown dtype {m['dtype']!r}; use one of "
                                f"{', '.join(short_dtype_names())}")
    dims = m["dims"].replace(" ", "").split(",")
    if dims[-1] == "" and len(dims) > 1:
        dims.pop()  # a trailing comma: f32[8,]
    if "" in dims and len(dims) > 1:
        raise InvalidValueError(f"cannot read shape {tok!r}: an empty dimension between commas")
    return jax.ShapeDtypeStruct(tuple(int(d) for d in dims if d), dtype)


def needs_x64(args: Any) -> list[str]:
    """The 64-bit dtypes among ``args``' leaves (which JAX turns into 32-bit ones unless x64 is on)."""
    wide = {np.dtype(t) for t in ("float64", "int64", "uint64", "complex128")}
    found = {str(x.dtype) for x in jax.tree_util.tree_leaves(args) if hasattr(x, "dtype") and x.dtype in wide}
    return sorted(found)
