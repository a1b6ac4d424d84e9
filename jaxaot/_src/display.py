"""Rich displays of lower-layer objects, drawn by a higher layer: renderers by kind.

:class:`~jaxaot.AOTLowered` and :class:`~jaxaot.ResidualTable` are drawn by
:mod:`jaxaot._src.viz`, which sits above the runtime, so their ``_repr_html_``
asks this registry instead of importing viz: viz registers a renderer per kind
(:func:`register`), and ``jaxaot`` adds a loader that imports viz on the first
display (:func:`add_loader`), never at ``import jaxaot``. A kind with no renderer
renders as None, and Jupyter shows the text ``repr``.

Example:
    >>> from jaxaot._src import display as _display
    >>> _display.register("doctest-kind", lambda obj: f"<b>{obj}</b>")
    >>> _display.render("doctest-kind", 3)
    '<b>3</b>'
    >>> _display.render("no-such-kind", 3) is None
    True
"""

from __future__ import annotations

import threading
from typing import Any, Callable

#: The kinds of object the runtime displays: ``AOTLowered`` and its ``ResidualTable``.
LOWERED = "lowered"
RESIDUAL_TABLE = "residual_table"

_RENDERERS: dict[str, Callable[[Any], str]] = {}
_LOADERS: list[Callable[[], Any]] = []
_LOCK = threading.Lock()


def register(kind: str, renderer: Callable[[Any], str]) -> None:
    """Draw objects of ``kind`` with ``renderer(obj) -> html`` (a later registration replaces an earlier one)."""
    _RENDERERS[kind] = renderer


def add_loader(loader: Callable[[], Any]) -> None:
    """Run ``loader()`` (once) the first time :func:`render` finds no renderer for a kind; it is
    expected to import the module that registers the renderers."""
    with _LOCK:
        _LOADERS.append(loader)


def render(kind: str, obj: Any) -> str | None:
    """``obj`` drawn by the renderer of ``kind`` (loading the renderers first if none is
    registered yet), or None when no renderer draws that kind."""
    renderer = _RENDERERS.get(kind)
    if renderer is None:
        with _LOCK:
            pending, _LOADERS[:] = list(_LOADERS), []
        for loader in pending:
            loader()
        renderer = _RENDERERS.get(kind)
    return None if renderer is None else renderer(obj)


__all__ = ["LOWERED", "RESIDUAL_TABLE", "add_loader", "register", "render"]
