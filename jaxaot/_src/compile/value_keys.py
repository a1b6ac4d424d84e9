"""A value written as a canonical text that names it across processes: a Python value, an array (by a hash of its
contents), a callable (by its code, defaults, closures and the module globals it reads: :mod:`code_reach`). A value
that cannot be written down raises ``Unkeyable``: the key that holds it is None (not cached).

Example:
    >>> from jaxaot._src.compile.value_keys import value_identity
    >>> value_identity({"b": 1, "a": (2.0, None)}) == value_identity({"a": (2.0, None), "b": 1})
    True
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import re
import struct
import sys
import types
from typing import Any

import jax
import numpy as np

from jaxaot._src.compile import code_reach
from jaxaot._src.compile.code_reach import Unkeyable as _Unkeyable, code_names

ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_DEPTH = 8


def value_identity(value: Any, depth: int = 0) -> str:
    """A canonical text that names ``value`` across processes (arrays by content hash).

    Canonical means independent of ``PYTHONHASHSEED`` and of object addresses
    where it can be: sets and frozensets list their elements sorted, dicts their
    items sorted by key, floats are written by their bits (``-0.0`` and NaN
    payloads included), and each scalar carries its type (``1``, ``1.0`` and
    ``True`` differ). An instance of a user's class is its class's code and its
    fields (:func:`_instance_identity`), of a library's dataclass its type and
    fields, an enum member its type and name, a module what it holds
    (:func:`_module_identity`). Anything else is its type and ``repr``.

    Example:
        >>> from jaxaot._src.compile.value_keys import value_identity
        >>> value_identity({"b": {2, 1}, "a": 0.5})
        "dict(str:'a':float:3fe0000000000000,str:'b':set(int:1,int:2))"
    """
    if depth > _MAX_DEPTH:
        raise _Unkeyable("too deep")
    if value is None or isinstance(value, (bool, str, bytes)) or type(value) is int:
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"{type_name(value)}.{value.name}"
    if isinstance(value, float):
        return f"{type_name(value)}:{struct.pack('>d', value).hex()}"
    if isinstance(value, complex):
        return f"{type_name(value)}:{struct.pack('>dd', value.real, value.imag).hex()}"
    if isinstance(value, int):
        return f"{type_name(value)}:{int(value)}"
    if isinstance(value, (np.ndarray, jax.Array, np.generic)):
        return array_identity(value)
    if isinstance(value, (tuple, list)):
        inner = ",".join(value_identity(v, depth + 1) for v in value)
        return f"{type_name(value)}({inner})"
    if isinstance(value, (set, frozenset)):
        inner = ",".join(sorted(value_identity(v, depth + 1) for v in value))
        return f"{type_name(value)}({inner})"
    if isinstance(value, dict):
        items = sorted(f"{value_identity(k, depth + 1)}:{value_identity(v, depth + 1)}" for k, v in value.items())
        return f"{type_name(value)}({','.join(items)})"
    if callable(value):
        return callable_identity(value, depth + 1)
    if isinstance(value, types.ModuleType):
        return _module_identity(value, None)
    if not code_reach.is_library(type(value).__module__):
        return _instance_identity(value)
    if dataclasses.is_dataclass(value):
        return _dataclass_identity(value, depth)
    return f"{type(value).__module__}.{type(value).__qualname__}:{value!r}"


def type_name(value: Any) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _dataclass_identity(value: Any, depth: int) -> str:
    fields = ",".join(f"{f.name}={value_identity(getattr(value, f.name), depth + 1)}"
                      for f in dataclasses.fields(value))
    return f"{type_name(value)}({fields})"


def callable_identity(fn: Any, depth: int = 0) -> str:
    """Module, qualname, bytecode hash, defaults and closure values of a callable, and the code it reaches.

    ``functools.partial`` objects add their arguments, so
    ``partial(min_cut_rematerialization_partition, memory_budget=0.5)`` and
    ``memory_budget=0.7`` key differently. A function of the user's (not of a
    library, :func:`~jaxaot._src.python_reads.is_library`) adds what its
    code reads (:func:`_globals_identity`); a class of the user's is its methods
    and class attributes through its MRO, an instance of one its class plus its
    fields (:func:`_instance_identity`). Every value is written canonically
    (:func:`value_identity`).

    Example:
        >>> import functools, jaxaot
        >>> from jaxaot._src.compile.value_keys import callable_identity
        >>> p = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5)
        >>> "memory_budget" in callable_identity(p)
        True
    """
    if depth > _MAX_DEPTH:
        raise _Unkeyable("too deep")
    if isinstance(fn, functools.partial):
        args = value_identity(fn.args, depth + 1)
        kw = value_identity(dict(fn.keywords), depth + 1)
        return f"partial({callable_identity(fn.func, depth + 1)},{args},{kw})"
    if hasattr(fn, "__func__") and hasattr(fn, "__self__"):  # bound method
        return f"method({callable_identity(fn.__func__, depth + 1)},{value_identity(fn.__self__, depth + 1)})"
    code = getattr(fn, "__code__", None)
    if code is None:  # classes, callable objects, builtins
        if isinstance(fn, type):
            return _class_identity(fn)
        if not code_reach.is_library(type(fn).__module__):
            return _instance_identity(fn)
        if dataclasses.is_dataclass(fn):
            call = getattr(type(fn), "__call__", None)
            return f"{_dataclass_identity(fn, depth)}:{callable_identity(call, depth + 1)}"
        if isinstance(fn, types.BuiltinFunctionType):  # len, tuple.__new__, a dict's get: its name and its owner
            return f"builtin:{fn.__qualname__}:{value_identity(fn.__self__, depth + 1)}"
        if hasattr(fn, "__wrapped__"):  # a library's wrapper (jax.jit, functools.cache) of a function
            return f"wrapped({type_name(fn)},{callable_identity(fn.__wrapped__, depth + 1)})"
        return f"{type(fn).__module__}.{type(fn).__qualname__}:{getattr(fn, '__qualname__', None)}:{fn!r}"
    module = getattr(fn, "__module__", None)
    if code_reach.is_library(module):
        return _function_identity(fn, code, depth)
    return code_reach.visit(fn, f"fn:{module}.{fn.__qualname__}", lambda: _function_identity(fn, code, 0))


def _function_identity(fn: Any, code: Any, depth: int) -> str:
    parts = [
        f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', None)}",
        _code_hash(code),
        value_identity(getattr(fn, "__defaults__", None), depth + 1),
        value_identity(getattr(fn, "__kwdefaults__", None), depth + 1),
    ]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            parts.append("<empty>")
            continue
        if isinstance(value, types.ModuleType):
            parts.append(_module_identity(value, code_names(code)))
        else:
            parts.append("<itself>" if value is fn else value_identity(value, depth + 1))  # a recursive closure
    if not code_reach.is_library(getattr(fn, "__module__", None)):
        parts.extend(_globals_identity(fn, code))
    return "fn(" + ",".join(parts) + ")"


def _globals_identity(fn: Any, code: Any) -> list[str]:
    """What a user's function reads of its module's globals, by the names its code (nested code included) uses:
    constants and functions by value (:func:`~jaxaot._src.compile.code_reach.constant`), classes and the
    modules of the user's by what the code reaches in them (:func:`_read_identity`). A compiler or partitioner
    that reads a setting of its module, calls a helper of it or of another module of the user's, or builds
    one of the user's classes, keys by their values and code. A name that is no global but an imported module
    (``import helpers`` inside the function) is that module. Mutable objects (a dict of counters) are left
    out: their state changes."""
    scope = getattr(fn, "__globals__", None) or {}
    names = code_names(code)
    parts = []
    for name in sorted(names):
        value = scope.get(name, _MISSING)
        if value is _MISSING:
            value = sys.modules.get(name, _MISSING)
        text = None if value is _MISSING else _read_identity(value, names)
        if text is not None:
            parts.append(f"{name}={text}")
    return parts


_MISSING = object()


def _read_identity(value: Any, names: frozenset[str] | None) -> str | None:
    """How a global or class attribute that a user's code reads is keyed; None for a mutable library object.

    A module of a library is its name and version; one of the user's is the attributes ``names`` (what the
    code looks up; None: all) picks in it, each keyed so in turn. A constant, or a library's wrapper of a
    function, is its value; an instance of a user's class that is not a constant, its class's code (not its
    state)."""
    if isinstance(value, types.ModuleType):
        return _module_identity(value, names)
    if code_reach.constant(value) or (callable(value) and hasattr(value, "__wrapped__")):
        return value_identity(value, 1)
    if not code_reach.is_library(type(value).__module__):
        return f"instance-of:{_class_identity(type(value))}"
    return None


def _module_identity(module: types.ModuleType, names: frozenset[str] | None) -> str:
    name = module.__name__
    if code_reach.is_library(name):
        return f"module:{name}{code_reach.library_version(name)}"

    def write() -> str:
        members = ((n, _read_identity(v, names)) for n, v in code_reach.module_members(module, names))
        return f"module:{name}(" + ",".join(f"{n}={t}" for n, t in members if t is not None) + ")"

    return code_reach.visit(module, f"module:{name}", write, extra=names)


def _class_identity(cls: type) -> str:
    """A library's class by its name; a user's by its MRO and the members its own classes define in it."""
    if code_reach.is_library(cls.__module__):
        return f"{type(cls).__module__}.{type(cls).__qualname__}:{cls.__qualname__}:{cls!r}"

    def write() -> str:
        mro = ",".join(f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__)
        members = ((n, _read_identity(v, None)) for n, v in code_reach.class_members(cls))
        return f"class({mro};" + ",".join(f"{n}={t}" for n, t in members if t is not None) + ")"

    return code_reach.visit(cls, f"class:{cls.__module__}.{cls.__qualname__}", write)


def _instance_identity(obj: Any) -> str:
    """An instance of a user's class: its class's identity and its fields by value, plus its ``repr`` (addresses
    blanked) where the class writes one of its own, for state kept outside its fields."""
    cls = type(obj)

    def write() -> str:
        fields = ",".join(f"{n}={value_identity(v, 1)}" for n, v in code_reach.instance_fields(obj))
        own_repr = not dataclasses.is_dataclass(cls) and cls.__repr__ is not object.__repr__
        return f"{_class_identity(cls)}({fields})" + (ADDRESS.sub(" at 0x?", repr(obj)) if own_repr else "")

    return code_reach.visit(obj, f"obj:{cls.__module__}.{cls.__qualname__}", write)


@functools.lru_cache(maxsize=4096)
def _code_hash(code: Any) -> str:
    # Code objects compare equal only when their bytecode, constants (1, 1.0 and True apart) and names do.
    # Constants canonically: ``x in {"a", "b"}`` compiles to a frozenset constant.
    h = hashlib.sha256(code.co_code)
    for c in code.co_consts:
        h.update(_code_hash(c).encode() if hasattr(c, "co_code") else value_identity(c).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()[:16]


def array_identity(value: Any) -> str:
    try:
        a = np.asarray(value)
    except Exception:
        raise _Unkeyable(type(value).__name__) from None
    if a.dtype == object:
        raise _Unkeyable(type(value).__name__)
    return f"{a.dtype.str}{a.shape}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}"
