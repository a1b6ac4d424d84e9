"""The options of :func:`~jaxaot.export` and :func:`~jaxaot.export.load`, checked when given.

Each check raises the typed error of ``docs/errors.md`` naming the option, before
any tracing or file access, so a wrong option costs nothing and leaves nothing behind.

Example:
    >>> check_load_options("artifact", check_versions=True, allow_callbacks=False, max_bytes=None)
    frozenset()
    >>> check_load_options("artifact", check_versions="yes", allow_callbacks=False, max_bytes=None)
    Traceback (most recent call last):
    ...
    jaxaot.errors.InvalidInputError: load: check_versions must be True or False, got 'yes' (a str).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxaot.errors import InvalidInputError, InvalidValueError


def _flag(fn: str, option: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{fn}: {option} must be True or False, got {value!r} (a {type(value).__name__}).")


def check_load_options(path: Any, *, check_versions: Any, allow_callbacks: Any, max_bytes: Any,
                       allow_custom_calls: Any = None) -> frozenset:
    """Refuse a ``path`` that is not a folder name, flags that are not booleans, a ``max_bytes`` that is not
    a positive integer (or None), ``allow_custom_calls`` that is not a collection of target names; the names."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInputError(
            f"load: path must be the artifact's folder (a str or os.PathLike) or an ExportedAOT, "
            f"got {type(path).__name__}.")
    _flag("load", "check_versions", check_versions)
    _flag("load", "allow_callbacks", allow_callbacks)
    if max_bytes is not None:
        if isinstance(max_bytes, (bool, np.bool_)) or not isinstance(max_bytes, (int, np.integer)):
            raise InvalidInputError(
                f"load: max_bytes must be an int (the largest file to read, in bytes) or None, "
                f"got {max_bytes!r} (a {type(max_bytes).__name__}).")
        if max_bytes <= 0:
            raise InvalidValueError(f"load: max_bytes must be a positive number of bytes, got {max_bytes}.")
    return _target_names(allow_custom_calls)


def _target_names(names: Any) -> frozenset:
    if names is None:
        return frozenset()
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple, set, frozenset)) \
            or not all(isinstance(n, str) for n in names):
        raise InvalidInputError(
            f"load: allow_custom_calls must be None or a list, tuple or set of custom-call target names such as "
            f"('tpu_custom_call',), got {names!r}.")
    return frozenset(names)


#: The platforms a program can be exported for, as ``jax.export`` names them.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def check_platforms(platforms: Any) -> None:
    """Refuse ``platforms`` that is not None or a non-empty sequence of distinct names of :data:`PLATFORMS`
    (``jax.export`` lowers for any name, so a misspelt one would fail only where the artifact is loaded)."""
    if platforms is None:
        return
    if isinstance(platforms, str) or not isinstance(platforms, (list, tuple)) or not platforms \
            or not all(isinstance(p, str) for p in platforms):
        raise InvalidInputError(
            f"export: platforms must be None (this platform) or a non-empty list or tuple of platform "
            f"names such as ('cpu', 'cuda'), got {platforms!r}.")
    for p in platforms:
        if p not in PLATFORMS:
            meant = {"gpu": "'cuda' or 'rocm'"}.get(p.lower(), repr(p.lower()) if p.lower() in PLATFORMS else None)
            raise InvalidValueError(
                f"export: platforms names {p!r}, which is none of {', '.join(map(repr, PLATFORMS))}"
                + (f": did you mean {meant}?" if meant else "."))
    if len(set(platforms)) != len(platforms):
        twice = sorted({p for p in platforms if platforms.count(p) > 1})
        raise InvalidValueError(f"export: platforms names {', '.join(map(repr, twice))} more than once: {platforms!r}.")
