"""Leaves, key paths, byte sizes and printed avals: the small facts every stage shares.

There is exactly one of each here: the leaf check and its error, the printable
path of a leaf (``arg[0]['w']``), the byte size of an aval (typed PRNG keys
included) and the short and long printed forms of an aval.

Example:
    >>> import jax, jax.numpy as jnp
    >>> format_aval(jax.ShapeDtypeStruct((8, 16), jnp.bfloat16))
    'bf16[8,16]'
    >>> nbytes(jax.ShapeDtypeStruct((8, 16), jnp.bfloat16))
    256
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError

_SCALAR_TYPES = (bool, int, float, complex, np.generic)

#: Short dtype names, as JAX prints them in jaxprs.
_SHORT_DTYPE = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "complex64": "c64", "complex128": "c128", "bool": "bool", "float0": "float0",
}


# --------------------------------------------------------------------------- leaves and paths
def is_array_leaf(x: Any) -> bool:
    """What jaxaot accepts as a pytree leaf: arrays, tracers and numeric scalars."""
    return isinstance(x, (jax.Array, np.ndarray, C.Tracer, jax.ShapeDtypeStruct, *_SCALAR_TYPES))


def is_python_scalar(x: Any) -> bool:
    return isinstance(x, _SCALAR_TYPES)


def is_weakly_typed(x: Any) -> bool:
    """Whether JAX reads ``x`` as weakly typed: a Python scalar is, an array or tracer by its aval, NumPy never."""
    if type(x) in (int, float, complex):
        return True
    return bool(getattr(getattr(x, "aval", None), "weak_type", False))


def describe_path(prefix: str, path: Sequence[Any], positions: Sequence[int] | None = None) -> str:
    """``prefix`` + the key path; prefix ``"input"`` names an ``(args, kwargs)`` pair's
    leaves ``arg[0]['w']`` / ``kwarg['scale']``. ``positions``: each argument's position in the call, where
    ``args`` holds the dynamic arguments only (static ones left out), so ``arg[i]`` is the user's ``i``."""
    path = tuple(path)
    if prefix == "input" and path:
        head = getattr(path[0], "idx", None)
        if head == 0 and positions is not None and len(path) > 1:
            return f"arg[{positions[path[1].idx]}]" + jax.tree_util.keystr(path[2:])
        return ("arg" if head == 0 else "kwarg") + jax.tree_util.keystr(path[1:])
    return prefix + jax.tree_util.keystr(path)


def not_array_message(prefix: str, path: Sequence[Any], leaf: Any, positions: Sequence[int] | None = None) -> str:
    """Why a leaf that is not an array cannot be traced, named by :func:`describe_path`, and the remedy for where it
    is: an output is returned as an array; a whole input argument may be static; a Python value inside a pytree
    argument makes the whole argument static (hashable) or is held as an array."""
    path = tuple(path)
    where, kind = describe_path(prefix, path, positions), type(leaf).__name__
    if prefix == "output":
        return (f"{where} is a {kind}, not an array or scalar. A compiled program returns arrays only, as under "
                "jax.jit: return it as an array (jnp.asarray), or return Python values from outside the compiled "
                "function.")
    if prefix == "input" and len(path) > 2:
        arg = describe_path(prefix, path[:2], positions)
        return (f"{where} is a {kind} inside the pytree argument {arg}, not an array or scalar. jaxaot traces "
                f"pytrees of arrays: hold an array there (jnp.asarray), close over the value, or make all of {arg} "
                "a static argument (static_argnums; it must then be hashable: a tuple, not a list or dict).")
    return (f"{where} is a {kind}, not an array or scalar. jaxaot traces pytrees of arrays: pass it as a static "
            "argument (static_argnums), close over it, or convert it with jnp.asarray.")


def flatten_checked(tree: Any, prefix: str, error: type[Exception] = InvalidInputError):
    """Flatten ``tree``; raise ``error`` naming the first leaf that is not an array (:func:`not_array_message`)."""
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves_with_path:
        if not is_array_leaf(leaf):
            raise error(not_array_message(prefix, path, leaf))
    return [leaf for _, leaf in leaves_with_path], treedef


def leaf_paths(treedef: Any, prefix: str = "") -> list[str]:
    """Printable paths of the leaves of ``treedef`` (``arg[0]['w']`` style)."""
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    return [describe_path(prefix, p) for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]


def leaf_paths_or_positions(treedef: Any, prefix: str, count: int) -> list[str]:
    """:func:`leaf_paths` of ``treedef`` if it has ``count`` leaves, else ``prefix[0]``, ``prefix[1]``, ...

    A partitioner may split a re-traced program whose pytree no longer fits its
    values; then positions are the honest names.
    """
    names = leaf_paths(treedef, prefix) if treedef is not None else []
    return names if len(names) == count else [f"{prefix}[{i}]" for i in range(count)]


def abstractify(x: Any) -> jax.ShapeDtypeStruct:
    """The aval-like description of a leaf: shape, dtype, weak type, sharding."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    aval = jax.typeof(x) if hasattr(jax, "typeof") else jax.api_util.shaped_abstractify(x)
    sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) and not C.is_tracer(x) else None
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type)


def shape_dtype_struct(aval: Any, *, sharding: Any = None) -> jax.ShapeDtypeStruct:
    """A ``jax.ShapeDtypeStruct`` of an aval (keeping its weak type)."""
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding,
                                weak_type=bool(getattr(aval, "weak_type", False)))


# --------------------------------------------------------------------------- sizes
#: The size at which a symbolic dimension (``jax.export`` shape polymorphism) is
#: costed: each symbol stands for this many elements. Byte counts and FLOPs of
#: programs with symbolic shapes are those of this representative instance; the
#: partitioner's choice depends only on their ratios, which it keeps for any
#: size where the symbolic terms dominate.
SYMBOLIC_DIM_SIZE = 128


def concrete_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """``shape`` with symbolic dims evaluated at :data:`SYMBOLIC_DIM_SIZE` per symbol.

    Example:
        >>> import jax
        >>> b, = jax.export.symbolic_shape("b")
        >>> concrete_shape((2 * b, 3))
        (256, 3)
    """
    return tuple(C.dim_value(d, SYMBOLIC_DIM_SIZE) for d in shape)


def has_symbolic_dims(shape: Sequence[Any]) -> bool:
    return any(jax.export.is_symbolic_dim(d) for d in shape)


def itemsize(dtype: Any) -> int:
    """Bytes per element; typed PRNG keys (``key<fry>``) count their underlying words."""
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:  # extended dtypes: PRNG keys and the like
        return int(getattr(dtype, "itemsize", 0) or 8)


def nbytes(aval: Any) -> int:
    """Bytes of an abstract value (0 for tokens and other values without shape and dtype).

    Symbolic dimensions count :data:`SYMBOLIC_DIM_SIZE` elements per symbol.

    Example:
        >>> import jax
        >>> nbytes(jax.eval_shape(lambda: jax.random.key(0)))  # a threefry key: two uint32 words
        8
    """
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    return int(math.prod(concrete_shape(shape))) * itemsize(dtype)


def in_host_memory(aval: Any) -> bool:
    """Whether an abstract value lives in host memory (``memory_space`` host, e.g. a
    ``jax.device_put(x, jax.memory.Space.Host)`` or a JAX offload policy's residual)."""
    return getattr(aval, "memory_space", None) == jax.memory.Space.Host


def device_nbytes(aval: Any) -> int:
    """Bytes an abstract value takes in device memory: :func:`nbytes`, or 0 in host memory."""
    return 0 if in_host_memory(aval) else nbytes(aval)


def var_device_nbytes(v: Any) -> int:
    """:func:`device_nbytes` of a jaxpr variable's value; 0 for those with none (tokens, opaque dtypes)."""
    try:
        return int(device_nbytes(v.aval))
    except Exception:  # noqa: BLE001 - tokens, opaque dtypes
        return 0


# --------------------------------------------------------------------------- printing
def dtype_name(dtype: Any) -> str:
    """``float32``, ``bfloat16``, ``key<fry>``: the dtype's own name."""
    return getattr(dtype, "name", None) or str(dtype)


def dtype_from_short(name: str) -> Any:
    """The dtype a short name (``f32``, ``bf16``, ``i32``, ``bool``) or a long one names; None if neither.

    Example:
        >>> dtype_from_short("bf16")
        dtype(bfloat16)
    """
    long = {v: k for k, v in _SHORT_DTYPE.items()}.get(name, name)
    if long == "float0":
        return None
    try:
        return jax.numpy.dtype(long)
    except TypeError:
        return None


def short_dtype_names() -> tuple[str, ...]:
    """The short dtype names :func:`format_aval` prints and :func:`dtype_from_short` reads."""
    return tuple(v for v in _SHORT_DTYPE.values() if v != "float0")


def format_aval(aval: Any, *, short: bool = True, weak: bool = False) -> str:
    """``f32[8,16]`` (``short``) or ``float32[8, 16]``; ``weak`` adds ``{weak}`` to weak-typed arrays.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> format_aval(jax.ShapeDtypeStruct((2, 3), jnp.float32), short=False)
        'float32[2, 3]'
    """
    name = dtype_name(aval.dtype)
    shape = tuple(getattr(aval, "shape", ()))
    if short:
        text = f"{_SHORT_DTYPE.get(name, name)}[{','.join(map(str, shape))}]"
    else:
        text = f"{name}{list(shape)}"
    if weak and getattr(aval, "weak_type", False) and (shape or not short):
        text += "{weak}"
    return text
