"""How reverse mode differentiates a loop: the one decision the JVP and partial-eval rules read.

A loop's options and the platform (``jaxaot.config`` and the backend) pick one
:data:`MODES` entry; each names the module that carries it out.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxaot._src.loops import offline, segments
from jaxaot._src.loops.capacity import is_bounded
from jaxaot._src.loops.common import Loop, while_loop_p

#: mode -> what it does (and where)
MODES = {
    "nested": "max_steps with checkpoints as nested scans of static lengths, differentiated by JAX (offline)",
    "checkpointed": "checkpoints=k: snapshots and recomputation, online or bounded binomial (checkpointed)",
    "segments": "max_steps on CPUs: the first steps stacked, the rest in recomputed segments (segments)",
    "stack": "every iteration's residuals stacked, to max_steps, the loop's length or a run-time capacity",
    "unbounded": "no bound: linearized whole, as lax.while_loop is; transposing it is an error (capacity)",
}


def reverse_mode(loop: Loop, residual_avals: Sequence[Any] | None = None) -> str:
    """The :data:`MODES` entry ``loop`` is differentiated with. ``residual_avals`` (a step's residuals,
    once partial evaluation knows them) decide between ``"segments"`` and ``"stack"``; without them a
    stacking loop is ``"stack"``."""
    checkpointed_while = loop.prim is while_loop_p and loop.checkpoints is not None
    if checkpointed_while and loop.max_steps is not None and offline.nested(loop):
        return "nested"
    if not is_bounded(loop):
        return "unbounded"
    if checkpointed_while:
        return "checkpointed"
    if residual_avals is not None and segments.applies(loop, residual_avals) is not None:
        return "segments"
    return "stack"
