"""Rich displays of lower-layer objects, drawn by a higher layer: renderers by kind.

Jupyter shows an object through its ``_repr_html_``. The runtime's
:class:`~jaxaot.AOTLowered` and :class:`~jaxaot.ResidualTable` are drawn by
:mod:`jaxaot._src.viz`, which sits above the runtime (it reads what the runtime
built, and pulls in the optional graphviz and matplotlib). So the runtime asks
this registry instead of importing viz: :mod:`jaxaot._src.viz` registers one renderer
per kind of object when it is imported (:func:`register`), and the objects'
hooks call :func:`render`.

The pictures must appear even when the user never imported :mod:`jaxaot._src.viz`.
The package face ``jaxaot`` (the top layer) installs a *loader* that imports it
(:func:`add_loader`); :func:`render` runs the pending loaders the first time it
finds no renderer for a kind, so viz loads on first display and never at
``import jaxaot``. A kind no loader registers renders as None, which Jupyter
takes as "no HTML" and shows the text ``repr`` instead.

Costs: a dict look-up per display; the loaders run once per process.

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
