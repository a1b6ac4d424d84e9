"""Artifacts: a compiled function saved with ``jax.export``, checked and loaded again."""

import sys as _sys
import types as _types

from jaxaot._src.artifacts import (
    export as export,
    load as load,
    ExportedAOT as ExportedAOT,
    LoadedAOT as LoadedAOT,
)

__all__ = [
    "export", "load", "save", "ExportedAOT", "LoadedAOT",
]


def save(exported: ExportedAOT, path, *, key: bytes | None = None):
    """Write ``exported`` to the directory ``path`` (:meth:`ExportedAOT.save`), signed with ``key`` if given;
    :func:`load` with the same ``key`` checks the signature.

    Raises:
      InvalidInputError: ``exported`` is not an :class:`ExportedAOT` (what :func:`export` returns).
    """
    if not isinstance(exported, ExportedAOT):
        from jaxaot.errors import InvalidInputError

        raise InvalidInputError(f"save expects an ExportedAOT (what jaxaot.export.export(fn, *args) returns), got "
                                f"{type(exported).__name__}: export the function first.")
    return exported.save(path, key=key)


class _Face(_types.ModuleType):
    """``jaxaot.export(fn, *args)``, the function this face replaced at the top level, still works for one
    release, with a ``DeprecationWarning``: call ``jaxaot.export.export``."""

    def __call__(self, *args, **kwargs):
        from jaxaot._src.deprecations import warn_once

        warn_once("export", "calling jaxaot.export(...) is deprecated and will be removed in the next release: "
                            "use jaxaot.export.export(...).", stacklevel=2)
        return export(*args, **kwargs)


_sys.modules[__name__].__class__ = _Face
