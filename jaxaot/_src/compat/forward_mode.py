"""Evaluating a traced program under forward mode, where ``jax.custom_vjp`` refuses ``jax.jvp``.

A ``custom_vjp`` whose backward rule is marked :data:`PRIMAL_IN_FORWARD_MODE`
(jaxaot's gradient hooks, identities whose rule only rewrites a cotangent) is
evaluated as its primal function, which forward mode differentiates; any other
``custom_vjp`` is bound as it is, so a user's refuses ``jax.jvp`` as under JAX.
"""

from __future__ import annotations

from typing import Any

from jax._src import core as _core
from jax._src import custom_derivatives as _cd

#: The attribute a ``custom_vjp`` backward rule carries (true) where forward mode may run its primal function.
PRIMAL_IN_FORWARD_MODE = "_jaxaot_primal_in_forward_mode"


def _primal_in_forward_mode(eqn: Any) -> bool:
    if eqn.primitive is not _cd.custom_vjp_call_p:
        return False
    bwd = eqn.params.get("bwd")
    return bool(getattr(getattr(bwd, "f", bwd), PRIMAL_IN_FORWARD_MODE, False))


def eval_forward_mode(closed: Any, *args: Any) -> list:
    """Evaluate the closed jaxpr ``closed`` on ``args`` (arrays or tracers, ``jax.jvp``'s among them), each marked
    ``custom_vjp`` at its top level as its primal function (module docstring)."""
    jaxpr = closed.jaxpr
    if not any(_primal_in_forward_mode(e) for e in jaxpr.eqns):
        return _core.eval_jaxpr(jaxpr, closed.consts, *args)
    env: dict = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, _core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if _primal_in_forward_mode(eqn):
            call = eqn.params["call_jaxpr"]
            outs = _core.eval_jaxpr(call.jaxpr, call.consts, *ins)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


__all__ = ["PRIMAL_IN_FORWARD_MODE", "eval_forward_mode"]
