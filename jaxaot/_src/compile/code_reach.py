"""What a user's compiler or partitioner reaches: the objects its cache key reads beyond the callable itself.

A callable runs more code than its own: the other methods and class attributes of its class, the functions and
classes it reads on a module of the user's, what their code reads in turn. This module says which objects those
are (:func:`class_members`, :func:`module_members`, :func:`instance_fields`), and walks each object once per
key, with bounds on nesting and count (:func:`visit`); which modules are libraries, keyed by name and version
rather than read, :mod:`~jaxaot._src.python_reads` says. :mod:`~jaxaot._src.compile.cache_keys` writes what it finds.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import threading
from typing import Any, Callable, Iterable

import jax
import numpy as np

from jaxaot._src.python_reads import code_names, is_library, library_version  # noqa: F401 - cache_keys reads them here

#: How many objects one key may reach, and how deep their chain may go; past either the entry is not cached.
MAX_OBJECTS = 4096
MAX_NESTING = 24


class Unkeyable(Exception):
    """A value whose identity cannot be written down (the entry is then not cached)."""


# --------------------------------------------------------------------------- what is read
#: Values keyed as constants; a mutable object's state (a dict, a list, an instance) is not a key.
_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, enum.Enum, np.generic, np.ndarray, jax.Array,
              functools.partial, type)


def constant(value: Any) -> bool:
    """Whether a module global or class attribute is keyed by its value: a number, string, array, class,
    function, or a tuple or frozenset or frozen dataclass of them."""
    if isinstance(value, (tuple, frozenset)):
        return all(constant(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.__dataclass_params__.frozen
    return isinstance(value, _CONSTANTS) or (callable(value) and hasattr(value, "__code__"))


#: Class attributes that say nothing the class runs: bookkeeping of Python, ``abc``, ``typing`` and dataclasses
#: (a dataclass's fields are keyed by their values on the instance).
_BOOKKEEPING = frozenset({
    "__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__", "__slots__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__orig_bases__", "__parameters__",
    "__abstractmethods__", "_abc_impl", "__firstlineno__", "__static_attributes__", "__type_params__"})
#: Methods ``dataclasses`` writes from the fields (keyed already); one the class spells out itself is read.
_DATACLASS_MADE = frozenset({"__init__", "__repr__", "__eq__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__",
                             "__setattr__", "__delattr__", "__getstate__", "__setstate__", "__replace__"})
_GENERATED_FILES = ("<string>", dataclasses.__file__)


def class_members(cls: type) -> list[tuple[str, Any]]:
    """``(owner.name, value)`` of each attribute the user's classes in ``cls``'s MRO define, library classes left
    out: methods (of static and class methods, their functions; of a property, its accessors) and class
    attributes, in MRO order then by name."""
    out = []
    for klass in cls.__mro__:
        if is_library(klass.__module__):
            continue
        made = dataclasses.is_dataclass(klass)
        for name, value in sorted(vars(klass).items()):
            if name in _BOOKKEEPING or (made and name in _DATACLASS_MADE and _generated(value)):
                continue
            out.append((f"{klass.__qualname__}.{name}", _unwrapped(value)))
    return out


def _generated(fn: Any) -> bool:
    return getattr(getattr(fn, "__code__", None), "co_filename", None) in _GENERATED_FILES


def _unwrapped(value: Any) -> Any:
    """The functions behind a descriptor: what it runs."""
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    if isinstance(value, property):
        return (value.fget, value.fset, value.fdel)
    if isinstance(value, functools.cached_property):
        return value.func
    if isinstance(value, functools.partialmethod):
        return functools.partial(value.func, *value.args, **value.keywords)
    return value


def instance_fields(obj: Any) -> list[tuple[str, Any]]:
    """The state of an instance of a user's class: its dataclass fields, or its ``__dict__`` and the slots its
    user classes declare, by name."""
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    fields = dict(getattr(obj, "__dict__", None) or {})
    for klass in type(obj).__mro__:
        if is_library(klass.__module__):
            continue
        slots = vars(klass).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                fields.setdefault(slot, getattr(obj, slot))
    return sorted(fields.items(), key=lambda item: str(item[0]))


def module_members(module: Any, names: Iterable[str] | None) -> list[tuple[str, Any]]:
    """The attributes of ``module`` among ``names`` (what the code reading the module looks up; None: all), as
    bound in its namespace (a module's ``__getattr__`` is not run)."""
    scope = vars(module)
    return [(n, scope[n]) for n in sorted(scope if names is None else names)
            if n in scope and isinstance(n, str) and not n.startswith("__")]


# --------------------------------------------------------------------------- the walk
_WALK = threading.local()  # .memo: {(id, extra): [obj, digest or None while being written]}; .depth


def visit(obj: Any, label: str, write: Callable[[], str], extra: Any = None) -> str:
    """``label#<sha256 of write()>``, written once per key that reaches ``obj`` (found again, it is looked up);
    ``<cycle label>`` while it is being written (the code reached reads it again: its text is in the key).

    A digest, not the text, so that an object reached from many places is hashed once, and its text does not
    depend on the order it is reached in. Past :data:`MAX_OBJECTS` objects or :data:`MAX_NESTING` levels the
    key is :class:`Unkeyable`. The walk ends, its memo dropped, when the outermost visit returns.
    """
    memo = getattr(_WALK, "memo", None)
    outer = memo is None
    if outer:
        memo = _WALK.memo = {}
        _WALK.depth = 0
    try:
        key = (id(obj), extra)
        held = memo.get(key)
        if held is not None:
            return held[1] or f"<cycle {label}>"
        if len(memo) >= MAX_OBJECTS or _WALK.depth >= MAX_NESTING:
            raise Unkeyable("the code reached is too large to key")
        memo[key] = held = [obj, None]  # holding obj keeps its id from being reused during the walk
        _WALK.depth += 1
        try:
            text = write()
        except BaseException:
            del memo[key]
            raise
        finally:
            _WALK.depth -= 1
        held[1] = f"{label}#{hashlib.sha256(text.encode()).hexdigest()[:32]}"
        return held[1]
    except RecursionError:
        if outer:  # deep data inside deep code: too large to key, as past the bounds
            raise Unkeyable("the code reached is too deep to key") from None
        raise
    finally:
        if outer:
            _WALK.memo = None
