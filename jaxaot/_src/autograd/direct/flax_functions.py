"""Flax's gradient transformations, bound once, before :func:`jaxaot.patch_value_and_grad` first swaps them.

:func:`jaxaot.patch_value_and_grad` swaps the attributes ``flax.nnx.value_and_grad``
and ``flax.nnx.grad`` for a block; jaxaot's own fallbacks to Flax call these
bindings, so they never reach the swapped attributes (and never call themselves).
The patch imports this module before its first swap, so the bindings are Flax's.
"""

from __future__ import annotations

from flax import nnx

#: ``flax.nnx.value_and_grad`` as Flax defines it.
FLAX_VALUE_AND_GRAD = nnx.value_and_grad
#: ``flax.nnx.grad`` as Flax defines it.
FLAX_GRAD = nnx.grad

__all__ = ["FLAX_GRAD", "FLAX_VALUE_AND_GRAD"]
