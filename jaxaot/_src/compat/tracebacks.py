"""JAX's traceback filtering, extended to jaxaot's frames (part of :mod:`jaxaot._src.compat`).

An error in a user's function shows the user's lines, as under ``jit``: jaxaot's package is one of the paths
JAX removes from tracebacks (``JAX_TRACEBACK_FILTERING=off`` keeps every frame), and the callables jaxaot hands
users are :func:`api_boundary`\\ s, where the filtered traceback begins.
"""

from __future__ import annotations

import os

from jax._src import traceback_util as _traceback_util

#: jaxaot's package folder: its frames are JAX's to filter, as JAX's own are.
PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_traceback_util.register_exclusion(PACKAGE)

#: ``api_boundary(fn)``: ``fn``, whose exceptions leave it with jaxaot's and JAX's frames filtered out.
api_boundary = _traceback_util.api_boundary

__all__ = ["api_boundary"]
