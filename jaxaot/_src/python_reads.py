"""What Python code reads besides its arguments, as a key: a function's closure and the globals its code names.

A traced program bakes in the Python values its code read. Where the function runs again at every call in
eager JAX (a loss under ``nnx.value_and_grad``, a custom rule under ``jax.grad``), a compiled stand-in keys its
program by what the code reads (:func:`closure_key`): a new value traces again, as the eager code would read it.
Libraries' code is named, not read (:func:`is_library`); :func:`code_names` lists the names code looks up.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from typing import Any, Callable

import jax
import numpy as np

from jaxaot._src.compat import ById, custom_rule_parts

#: Python scalars: read by type and value.
SCALARS = (bool, int, float, complex, str, bytes, type(None))


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


def is_library_file(path: Any) -> bool:
    """Whether the source file ``path`` is a library's (installed, the standard library's, or jaxaot's own)."""
    return isinstance(path, str) and (_installed(path) or os.path.realpath(path).startswith(_JAXAOT))


_JAXAOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def library_version(module_name: str) -> str:
    """``@<version>`` of the package holding a library module, when it says (``__version__``); else empty."""
    version = getattr(sys.modules.get(module_name.partition(".")[0]), "__version__", None)
    return f"@{version}" if isinstance(version, str) else ""


#: How far :func:`closure_key` looks into containers: deeper or larger ones are named by identity.
_KEY_DEPTH, _KEY_ITEMS = 3, 64
#: NumPy arrays up to this size are read by their contents at each call; larger ones by identity.
_KEY_BYTES = 1 << 20


#: How many calls deep :func:`closure_key` follows the user's own helper functions.
_HELPER_DEPTH = 2


def closure_key(fun: Callable[..., Any], depth: int = 0, seen: set | None = None) -> tuple:
    """What ``fun`` reads besides its arguments, as a key: its closure's values and the module globals its code
    names (nested functions' too), and what the user's own functions it names read, two calls deep. Numbers and
    strings by value; small dicts, lists and tuples, and the attributes of plain objects (``vars``: a config
    object), by their contents, up to 3 levels deep and 64 items a level; NumPy arrays up to 1 MiB by their
    contents (dtype, shape and bytes); JAX arrays (immutable), larger NumPy arrays and other objects by identity;
    modules, classes and a library's functions not at all. ``nnx.value_and_grad`` runs ``fun``'s Python at every
    call, so a loss weight in a global, one a helper the loss calls reads, a target array a global names, or a
    config object's attribute, changed between steps, is read anew; a traced loss program reads them anew when
    this key changes (a NumPy array over 1 MiB written in place is not seen, as under ``jit``)."""
    code = getattr(fun, "__code__", None)
    if code is None:
        return ()
    seen = {id(fun)} if seen is None else seen
    parts = [_read_key(v) if not _helper(v, depth, seen) else (v.__code__, closure_key(v, depth + 1, seen))
             for v in closure_values(fun)]
    scope = getattr(fun, "__globals__", {})
    for name in sorted(code_names(code)):
        value = scope.get(name, _read_key)
        if _helper(value, depth, seen):  # its code too: a helper defined again (a notebook cell run again) is another
            parts.append((name, value.__code__, closure_key(value, depth + 1, seen)))
        elif value is not _read_key and not isinstance(value, (type(jax), type)) and not callable(value):
            parts.append((name, _read_key(value)))  # modules, classes and functions: their code is not a value
    return tuple(parts)


def rule_reads(fn: Any) -> tuple:
    """What a custom rule reads besides its arguments (:func:`closure_key`): of the user's function, or, for a
    library's function wrapping the user's (``custom_jvp.defjvps`` closes its rule over the user's per-argument
    rules), of each user function its closure holds, alone or in a tuple or list. None of a library's own. A bound
    method, a ``functools.partial`` or a callable object reads its function's and what it holds: the object's
    attributes, the partial's arguments."""
    if isinstance(fn, types.MethodType):
        return (rule_reads(fn.__func__), _object_key(fn.__self__))
    if isinstance(fn, functools.partial):
        return (rule_reads(fn.func), _read_key(fn.args), _read_key(fn.keywords))
    if not isinstance(fn, types.FunctionType):
        call = getattr(type(fn), "__call__", None)
        return (rule_reads(call), _object_key(fn)) if isinstance(call, types.FunctionType) else ()
    if not is_library(getattr(fn, "__module__", None)):
        return closure_key(fn)
    inner = [f for v in closure_values(fn) for f in (v if isinstance(v, (tuple, list)) else (v,))
             if isinstance(f, types.FunctionType) and not is_library(getattr(f, "__module__", None))]
    return tuple(closure_key(f) for f in inner)


def function_key(fn: Any, depth: int = 0, seen: frozenset = frozenset()) -> Any:
    """A function as a key by what it is made of: its code, defaults and closure (functions in it alike, two levels
    deep), so that one ``def`` run at every call (a custom rule defined in the loss) is one key while its closure
    holds equal values; anything else is itself. What the code reads from globals is :func:`closure_key`'s."""
    if id(fn) in seen:  # a closure holding what holds it (``defjvps``'s rule, its custom_jvp)
        return "<enclosing>"
    if not isinstance(fn, types.FunctionType) or depth > _HELPER_DEPTH:
        return fn
    seen = seen | {id(fn)}
    cells = tuple(_cell_key(v, depth, seen) for v in closure_values(fn))
    return ("function", fn.__code__, _read_key(fn.__defaults__), _read_key(fn.__kwdefaults__), cells)


def _cell_key(value: Any, depth: int, seen: frozenset) -> Any:
    if id(value) in seen:
        return "<enclosing>"
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, types.FunctionType) for v in value):
        return (type(value), tuple(function_key(v, depth + 1, seen) for v in value))
    if isinstance(value, functools.partial):
        return ("partial", _cell_key(value.func, depth, seen), _read_key(value.args), _read_key(value.keywords))
    rules = custom_rule_parts(value)
    if rules is not None:  # a jax.custom_jvp (or custom_vjp) made anew, its rules the same (``defjvps`` holds one)
        return (type(value), *(_cell_key(r, depth, seen | {id(value)}) for r in rules))
    return function_key(value, depth + 1, seen) if isinstance(value, types.FunctionType) else _read_key(value)


def _object_key(value: Any, depth: int = 0) -> Any:
    """An object by its attributes' values (a config object, or the object a rule is bound to); by identity when
    it has more than 64."""
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict) and len(attributes) <= _KEY_ITEMS:
        return (ById(value), tuple((k, _read_key(v, depth + 1)) for k, v in attributes.items()))
    return ById(value)


def _helper(value: Any, depth: int, seen: set) -> bool:
    """Whether ``value`` is a function of the user's (not a library's) that :func:`closure_key` reads into, once."""
    if not isinstance(value, types.FunctionType) or depth >= _HELPER_DEPTH or id(value) in seen \
            or is_library(getattr(value, "__module__", None)):
        return False
    seen.add(id(value))
    return True


def closure_values(fn: Any) -> list:
    """What ``fn`` closes over, in order (cells not yet assigned skipped)."""
    return [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure cell not yet assigned
        return False
    return True


def _read_key(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (float, complex)):  # by its bits: -0.0 is not 0.0, and a NaN equals itself
        return (type(value), repr(value) if isinstance(value, complex) else float.hex(value))
    if isinstance(value, SCALARS):
        return (type(value), value)
    if depth < _KEY_DEPTH and isinstance(value, (dict, list, tuple)) and len(value) <= _KEY_ITEMS:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return (type(value), tuple((k, _read_key(v, depth + 1)) for k, v in items))
    if isinstance(value, np.ndarray) and not value.dtype.hasobject and value.nbytes <= _KEY_BYTES:
        return _Contents(value)
    if depth < _KEY_DEPTH and _plain_object(value):
        return _object_key(value, depth)
    return ById(value)  # kept alive with the key: an id is never reused while the key holds it


def _plain_object(value: Any) -> bool:
    """An object whose attributes are its values (a config object): not a module, class, function, array or
    Flax object."""
    return (isinstance(getattr(value, "__dict__", None), dict) and not callable(value)
            and not isinstance(value, (type(jax), type, jax.Array, *flax_objects())))


class _Contents:
    """A NumPy array's dtype, shape and bytes (a copy), as part of a key: equal for equal contents. Hashed by
    dtype and shape; the bytes compare on a lookup that finds an entry."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, value: np.ndarray):
        self.dtype, self.shape, self.data = value.dtype.str, value.shape, value.tobytes()

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape))

    def __eq__(self, other: Any) -> bool:
        return (type(other) is _Contents and self.dtype == other.dtype and self.shape == other.shape
                and self.data == other.data)


def flax_objects() -> tuple:
    """Flax's stateful types (modules, Variables, nnx pytrees such as ``nnx.Rngs``), which are no plain values; none
    before ``flax.nnx`` is imported (looked up once after: ``flax.nnx`` resolves its names lazily)."""
    if not _FLAX:
        nnx = sys.modules.get("flax.nnx")
        if nnx is None:
            return ()
        _FLAX.extend((nnx.Variable, nnx.Module, *((nnx.Pytree,) if hasattr(nnx, "Pytree") else ())))
    return tuple(_FLAX)


_FLAX: list = []


__all__ = ["SCALARS", "closure_key", "closure_values", "code_names", "flax_objects", "function_key", "is_library",
           "is_library_file", "library_version", "rule_reads"]
