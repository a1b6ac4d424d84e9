"""Checks of what the public viz functions are given, so a wrong value fails early with a typed error.

Each check raises :class:`~jaxaot.errors.InvalidInputError` (a ``TypeError``) for a value of the wrong
kind, or :class:`~jaxaot.errors.InvalidValueError` (a ``ValueError``) for one out of range, naming the
function, what was passed and what it expects, before any drawing starts.

Example:
    >>> describe(None), describe("abc"), describe(lambda x: x)
    ('None', "str 'abc'", 'function <lambda>')
    >>> check_max_nodes(80, "render")
    80
"""

from __future__ import annotations

import importlib
import operator
import os
from typing import Any

from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.viz.model import SplitGraph


def describe(value: Any) -> str:
    """A short description of ``value`` for an error message: its type and, where short, what it is."""
    if value is None:
        return "None"
    name = type(value).__name__
    if callable(value) and hasattr(value, "__name__") and not isinstance(value, type):
        return f"{name} {value.__name__}"
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{name} of shape {tuple(shape)} and dtype {value.dtype}"
    if isinstance(value, (str, bytes, int, float, os.PathLike)):
        text = repr(value)
        return f"{name} {text if len(text) <= 60 else text[:57] + '...'}"
    return name


def hint(value: Any) -> str:
    """What the caller probably meant, for the values most often passed by mistake (or ``""``)."""
    if callable(value) and not hasattr(value, "partition"):
        return "; lower the function first: aot_fn.lower(*args)"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return "; pass the lowered function, not an array"
    return ""


def check_graph(graph: Any, where: str) -> SplitGraph:
    """``graph`` if it is a :class:`SplitGraph`, else :class:`InvalidInputError` saying how to get one."""
    if isinstance(graph, SplitGraph):
        return graph
    lowered = hasattr(graph, "partition") and not isinstance(graph, (str, bytes))
    advice = "; build one with jaxaot.viz.split_graph(lowered)" if lowered else hint(graph)
    raise InvalidInputError(f"{where} expects a SplitGraph (from jaxaot.viz.split_graph(aot_fn.lower(*args))), "
                            f"got {describe(graph)}{advice}")


def check_text(value: Any, name: str, where: str) -> str:
    """``value`` if it is a ``str`` (a title, a note), else :class:`InvalidInputError`."""
    if isinstance(value, str):
        return value
    raise InvalidInputError(f"{where}: {name} must be a str, got {describe(value)}")


def check_max_nodes(value: Any, where: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (a NumPy or JAX integer scalar too): how many nodes a
    picture may have."""
    try:
        count = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        count = None
    if count is None:
        raise InvalidInputError(f"{where}: max_nodes must be a positive int, got {describe(value)}")
    if count < 1:
        raise InvalidValueError(f"{where}: max_nodes must be a positive int, got {count}")
    return count


def check_timeout(value: Any, where: str) -> float:
    """``value`` if it is a positive number of seconds: how long Graphviz's ``dot`` may run."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{where}: timeout must be a positive number of seconds, got {describe(value)}")
    if not value > 0:
        raise InvalidValueError(f"{where}: timeout must be a positive number of seconds, got {value}")
    if value > MAX_TIMEOUT:  # infinity, or more than the process's clock and selectors can count
        raise InvalidValueError(f"{where}: timeout must be at most {MAX_TIMEOUT:g} seconds (a day), got {value}")
    return float(value)


#: The longest a ``dot`` layout may be given to run: a day.
MAX_TIMEOUT = 86400.0


def check_choice(value: Any, name: str, choices: tuple[str, ...], where: str) -> str:
    """``value`` if it is one of ``choices`` (a format, a grouping), else :class:`InvalidValueError`."""
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
    raise InvalidValueError(f"{where}: {name} must be {listed}, got {describe(value)}")


def check_path(value: Any, where: str) -> None:
    """``value`` must be None (return the text), a ``str`` or an ``os.PathLike`` (a file or a folder)."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise InvalidInputError(f"{where}: path must be a str, an os.PathLike or None, got {describe(value)}")


def require_extra(module: str, where: str) -> Any:
    """The optional module ``module`` (``"graphviz"``, ``"matplotlib.figure"``), imported; where it is missing, an
    ``ImportError`` naming ``where`` and the extra that installs it, not a bare ``ModuleNotFoundError``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = module.split(".")[0]
        raise ImportError(f"{where} needs the {package!r} package, which is not installed: "
                          f"pip install 'jaxaot[viz]' (or pip install {package})") from err
