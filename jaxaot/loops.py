"""Reverse-mode ``while_loop``: the loop primitives, the rewrite of ``lax.while_loop``, and overflow checks."""

import typing as _typing

from jaxaot._src import deprecations as _deprecations
from jaxaot._src.loops import (
    while_loop as while_loop,
    while_loop_stack_output as while_loop_stack_output,
    differentiable as differentiable,
    patch_while_loop as patch_while_loop,
    dynamic_capacity as dynamic_capacity,
    overflow_check_max_steps as overflow_check_max_steps,
    reraise_overflow as reraise_overflow,
)

__all__ = [
    "while_loop", "while_loop_stack_output", "differentiable", "patch_while_loop", "dynamic_capacity",
    "overflow_check_max_steps", "reraise_overflow",
]

# The old layout's paths, for one release: ``import jaxaot.loops.<module>`` and names its package exported.
__path__: list[str] = []
if not _typing.TYPE_CHECKING:
    __getattr__ = _deprecations.face_getattr("jaxaot.loops", "jaxaot._src.loops")
