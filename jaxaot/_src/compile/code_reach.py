"""What a user's compiler or partitioner reaches: the objects its cache key reads beyond the callable itself.

A callable runs more code than its own: the other methods and class attributes of its class, the functions and
classes it reads on a module of the user's, what their code reads in turn. This module says which objects those
are (:func:`class_members`, :func:`module_members`, :func:`instance_fields`), which modules are libraries, keyed
by name and version rather than read (:func:`is_library`), and walks each object once per key, with bounds on
nesting and count (:func:`visit`). :mod:`~jaxaot._src.compile.cache_keys` writes what it finds.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import sys
import sysconfig
import threading
from typing import Any, Callable, Iterable

import jax
import numpy as np

#: How many objects one key may reach, and how deep their chain may go; past either the entry is not cached.
MAX_OBJECTS = 4096
MAX_NESTING = 24


class Unkeyable(Exception):
    """A value whose identity cannot be written down (the entry is then not cached)."""


@functools.lru_cache(maxsize=1024)
def code_names(code: Any) -> frozenset[str]:
    """The names ``code`` and its nested code objects look up (``co_names``: globals and attributes alike), read
    once per code object (a loss's key reads them at every call)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            names |= code_names(c)
    return frozenset(names)


# --------------------------------------------------------------------------- libraries
#: Packages read by name and version, wherever they are installed (jaxaot's own editable checkout included).
_LIBRARIES = frozenset({"jaxaot", "jax", "jaxlib", "flax", "numpy", "builtins"})
#: The script, notebook or ``python -c`` code being run: the user's, whatever file a launcher gives it.
_MAIN = frozenset({"__main__", "__mp_main__"})
_INSTALLED = ("site-packages", "dist-packages")
_STDLIB = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})


def is_library(module_name: Any) -> bool:
    """Whether code of the module ``module_name`` is keyed by the module's name and version, not read.

    A library is one of :data:`_LIBRARIES`, a built-in or frozen module, or a module whose file lies in the
    standard library or in an install folder (``site-packages``, ``dist-packages``). Installed code changes only
    by installing another version: jax's, jaxlib's and jaxaot's are in the key's environment, another
    package's ``__version__`` is written beside the name of a module of it that the code reads
    (:func:`library_version`), and reading it by bytecode would walk thousands of library functions per key.
    Everything else (a script, ``__main__``, the user's project, an editable install of it, a module made at
    run time) is the user's code and is read.
    """
    known = _KNOWN.get(module_name) if isinstance(module_name, str) else False
    if known is not None:
        return known
    if module_name.partition(".")[0] in _LIBRARIES or module_name in sys.builtin_module_names:
        _KNOWN[module_name] = True
        return True
    module = sys.modules.get(module_name)
    if module is None or module_name in _MAIN:  # not imported (yet): the user's, and asked again next time
        return False
    spec = getattr(module, "__spec__", None)
    paths = [getattr(module, "__file__", None)] + list(getattr(module, "__path__", None) or ())
    found = _KNOWN[module_name] = getattr(spec, "origin", None) in ("built-in", "frozen") or any(
        isinstance(p, str) and _installed(p) for p in paths)
    return found


_KNOWN: dict[str, bool] = {}  # module name -> is_library, for imported modules (a module's file does not move)


@functools.lru_cache(maxsize=4096)
def _installed(path: str) -> bool:
    real = os.path.realpath(path)
    return real.startswith(_STDLIB) or any(part in _INSTALLED for part in real.split(os.sep))


def library_version(module_name: str) -> str:
    """``@<version>`` of the package holding a library module, when it says (``__version__``); else empty."""
    version = getattr(sys.modules.get(module_name.partition(".")[0]), "__version__", None)
    return f"@{version}" if isinstance(version, str) else ""


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
