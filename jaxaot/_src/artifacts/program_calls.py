"""Calls of exported programs, differentiable as deep as the artifact holds vjp programs, then typed errors.

``jax.export``'s own call differentiates a program through its vjp program and
raises a bare ``ValueError`` where a deserialized one has none. Here each order
is a ``jax.custom_vjp`` whose backward runs the next vjp program, and past the
last one an :class:`~jaxaot.errors.ArtifactError` names the limit.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.artifacts.manifest import VJP_ORDER
from jaxaot.errors import ArtifactError


def differentiable_call(program: Any, name: str, what: str, order: int = 0) -> Callable[..., tuple]:
    """``program.call`` whose vjp runs ``program.vjp()``; ``order``: how many vjps deep ``program`` is."""

    @jax.custom_vjp
    def run(*args):
        return tuple(program.call(*args))

    def forward(*args):
        return run(*args), args

    def backward(args, cts):
        if not program.has_vjp():
            raise ArtifactError(
                f"{name}, a loaded artifact, cannot be differentiated {order + 2} times: its {what} program holds "
                f"no vjp program of order {order + 1}. A saved artifact holds the vjp programs of its forward and "
                f"backward {VJP_ORDER} order deep (jax.grad of jax.grad), where jax.export can differentiate "
                "them (not through a while loop). For higher derivatives, export the differentiated function "
                "(jaxaot.export.export(jax.grad(f), ...)) and differentiate that.")
        vjp = program.vjp()
        cts = [C.zeros_float0(np.shape(ct)) if aval.dtype == jax.dtypes.float0 else ct
               for ct, aval in zip(cts, vjp.in_avals[len(args):])]
        return differentiable_call(vjp, name, f"{what}'s vjp", order + 1)(*args, *cts)

    run.defvjp(forward, backward)
    return run
