"""Where a call equation's function was written: the file JAX's debug info names for a ``jax.jit`` call's body.

JAX traces a jitted library function (``jnp.where`` is one) once and reuses its jaxpr, whose equations keep the
source info of that first trace: the line of whichever user code called it first. Inlined into another
program, such an equation belongs to the call's own site instead (:func:`call_source_file` tells which calls).
"""

from __future__ import annotations

from typing import Any

__all__ = ["call_source_file"]


def call_source_file(eqn: Any) -> str | None:
    """The file of the function a call equation (``jit``, ``closed_call``) runs, from its jaxpr's debug info
    (``"_where at /.../jax/_src/numpy/util.py:288"``); None where JAX recorded none."""
    body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    info = getattr(getattr(body, "jaxpr", body), "debug_info", None)
    where = getattr(info, "func_src_info", None)
    if not isinstance(where, str) or " at " not in where:
        return None
    return where.rsplit(" at ", 1)[1].rsplit(":", 1)[0]
