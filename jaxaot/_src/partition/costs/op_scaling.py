"""An eqn at smaller shapes, for timing it within a byte limit.

Timing must not raise the device peak above the step's own or a byte budget
(:func:`~jaxaot._src.allowance.byte_limit`). An eqn too large is timed at smaller shapes:
:func:`shrunk` shrinks one dimension size everywhere it occurs among the inputs (a
batch axis, so operands stay compatible), re-traces the eqn and returns the FLOP
ratio to scale its time by. Eqns whose params name sizes are estimated instead.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.costs import op_scaling
    >>> eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((4096, 64)), jnp.ones((64, 64))).jaxpr.eqns[0]
    >>> small, factor = op_scaling.shrunk(eqn, 2**18)  # 2 MiB of operands and result, timed in 256 KiB
    >>> small.invars[0].aval.shape, op_scaling.footprint(small) <= 2**18, round(factor, 2)
    ((480, 64), True, 8.53)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.partition.costs import cost_model

def footprint(eqn: Any) -> int:
    """Bytes of ``eqn``'s array inputs and outputs: what one run of it holds."""
    return int(sum(v.aval.size * v.aval.dtype.itemsize for v in (*eqn.invars, *eqn.outvars) if not C.is_literal(v)))


def _retrace(eqn: Any, avals: list) -> Any | None:
    """``eqn`` bound on inputs of ``avals`` (non-literal inputs, in order), or None where it does not bind."""
    literals = {i: v.val for i, v in enumerate(eqn.invars) if C.is_literal(v)}

    def run(*xs):
        it = iter(xs)
        return C.bind_eqn(eqn, [literals[i] if i in literals else next(it) for i in range(len(eqn.invars))])

    try:
        closed = jax.make_jaxpr(run)(*avals)
    except Exception:  # noqa: BLE001 - params that name sizes: not re-traceable at these shapes
        return None
    eqns = C.jaxpr_of(closed).eqns
    return eqns[0] if len(eqns) == 1 and eqns[0].primitive is eqn.primitive else None


def _scale(eqn: Any, small: Any) -> float:
    big, little = cost_model.flops(eqn), cost_model.flops(small)
    if big > 0 and little > 0:
        return float(big / little)
    return footprint(eqn) / max(footprint(small), 1)


def shrunk(eqn: Any, max_bytes: int) -> tuple[Any | None, float]:
    """``(eqn at smaller shapes whose footprint is at most max_bytes, how many times longer the original runs)``;
    ``(None, 0.0)`` when no single dimension size shrinks it enough (see the module docstring)."""
    ins = [v.aval for v in eqn.invars if not C.is_literal(v)]
    sizes = sorted({d for a in ins for d in a.shape if isinstance(d, (int, np.integer)) and d > 1}, reverse=True)
    total = footprint(eqn)
    for size in sizes:
        new = max(1, int(size * max_bytes / max(total, 1)))
        for _ in range(8):
            if new >= size:
                break
            avals = [jax.ShapeDtypeStruct(tuple(new if d == size else d for d in a.shape), a.dtype) for a in ins]
            small = _retrace(eqn, avals)
            if small is None:
                break
            held = footprint(small)
            if held <= max_bytes:
                return small, _scale(eqn, small)
            new = max(1, min(new - 1, int(new * max_bytes / held)))
    return None, 0.0
