"""Eager gradients: code run outside ``jit`` differentiated through compiled programs.

Eagerly, ``jax.grad`` dispatches the backward one primitive at a time, which on
small and medium programs costs more than the computation. ``direct`` runs the
compiled programs of an ``aot_function`` or ``aot_module`` loss straight away
(:func:`value_and_grad`, :func:`grad`, :func:`patch_value_and_grad`);
``recorded`` is compiled autograd of arbitrary eager code (:func:`compiled_grad`
and its kin), compiled once per structure. Importing it does not import Flax.
"""

from jaxaot._src.autograd.argnums import as_index
from jaxaot._src.autograd.direct import grad, patch_value_and_grad, value_and_grad
from jaxaot._src.autograd.recorded import (
    Stats, compiled_grad, compiled_value_and_grad, grad_hook, nnx_compiled_grad, reset, stats,
)

__all__ = [
    "Stats", "as_index", "compiled_grad", "compiled_value_and_grad", "grad", "grad_hook",
    "nnx_compiled_grad", "patch_value_and_grad", "reset", "stats", "value_and_grad",
]
