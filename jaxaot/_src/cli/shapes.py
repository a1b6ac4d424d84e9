"""What ``jaxaot inspect --shapes`` reads: abstract arguments, flat or as pytrees.

Either one ``dtype[dims]`` per positional argument, separated by spaces, or JSON
for pytrees (a string is an array, a list a list node, an object a dict node).
``float``, ``int``, ``uint`` and ``complex`` mean 32-bit widths (:func:`read_dtype`):
only a dtype named 64-bit needs ``jax_enable_x64``.

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
    dtype = read_dtype(m["dtype"])
    if dtype is None:
        raise InvalidValueError(f"cannot read shape {tok!r}: unknown dtype {m['dtype']!r}; use one of "
                                f"{', '.join(short_dtype_names())} (or a full name: float32, int64, ...)")
    dims = m["dims"].replace(" ", "").split(",")
    if dims[-1] == "" and len(dims) > 1:
        dims.pop()  # a trailing comma: f32[8,]
    if "" in dims and len(dims) > 1:
        raise InvalidValueError(f"cannot read shape {tok!r}: an empty dimension between commas")
    return jax.ShapeDtypeStruct(tuple(int(d) for d in dims if d), dtype)


def read_dtype(name: str) -> Any:
    """The dtype ``name`` names in ``--shapes``, or None.

    A short name (``f32``), a full one (``float32``, ``bfloat16``), or one without a width:
    ``float``, ``int``, ``uint`` and ``complex`` are JAX's default widths (float32, int32,
    uint32, complex64), as ``jnp.zeros(3, float)`` gives without x64, so only a 64-bit dtype
    named as such turns on ``jax_enable_x64``. NumPy's other aliases (``double``, ``long``,
    ``f8``) are not read: their widths differ between NumPy and JAX.

    Example:
        >>> [read_dtype(n).name for n in ("f32", "float", "int", "int64", "bf16")]
        ['float32', 'float32', 'int32', 'int64', 'bfloat16']
        >>> read_dtype("double") is None
        True
    """
    name = _DEFAULT_WIDTH.get(name, name)
    dtype = dtype_from_short(name)
    if dtype is None or (name not in short_dtype_names() and name != dtype.name):
        return None
    return dtype


#: The dtypes a name without a width means: JAX's defaults without x64.
_DEFAULT_WIDTH = {"float": "float32", "int": "int32", "uint": "uint32", "complex": "complex64"}


def example_arrays(args: Any, seed: int = 0) -> Any:
    """``args`` with each ``jax.ShapeDtypeStruct`` leaf made an array of its shape and dtype (arrays stay).

    Floating and complex leaves get standard normal values, integers and booleans zeros (valid indices
    and masks), so that a step can run on them: ``jaxaot inspect --compare`` times the steps.

    Example:
        >>> w, n = example_arrays([jax.ShapeDtypeStruct((2, 3), np.float32), jax.ShapeDtypeStruct((), np.int32)])
        >>> w.shape, w.dtype.name, int(n)
        ((2, 3), 'float32', 0)
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
    out = []
    for key, leaf in zip(keys, leaves):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            if jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
                leaf = jax.random.normal(key, leaf.shape).astype(leaf.dtype)
            else:
                leaf = jax.numpy.zeros(leaf.shape, leaf.dtype)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def needs_x64(args: Any) -> list[str]:
    """The 64-bit dtypes among ``args``' leaves (which JAX turns into 32-bit ones unless x64 is on)."""
    wide = {np.dtype(t) for t in ("float64", "int64", "uint64", "complex128")}
    found = {str(x.dtype) for x in jax.tree_util.tree_leaves(args) if hasattr(x, "dtype") and x.dtype in wide}
    return sorted(found)
