"""Eager gradients: code run outside ``jit`` differentiated through compiled programs.

Eagerly, ``jax.grad`` linearizes the forward and dispatches the backward one
primitive at a time, which on small and medium programs costs more than the
computation. This package gives the two ways jaxaot avoids that, one
sub-package each, layered above the runtime and the Flax front-end:

* ``direct``: :func:`value_and_grad` / :func:`grad` of an ``aot_function``
  (its compiled forward and backward, run directly on concrete arguments) or of
  a loss of an ``aot_module`` (the loss compiled with the module into one step),
  and :func:`patch_value_and_grad` (Flax's ``nnx.value_and_grad`` /
  ``nnx.grad`` take that step); ``docs/concepts/modules.md``;
* ``recorded``: compiled autograd of arbitrary eager code
  (:func:`compiled_grad`, :func:`compiled_value_and_grad`,
  :func:`nnx_compiled_grad`, :func:`grad_hook`): the forward runs as written,
  each step's program is compiled once per structure;
  ``docs/concepts/compiled_autograd.md``.

Importing this package imports JAX but not Flax.
"""

from jaxaot._src.autograd.direct import grad, patch_value_and_grad, value_and_grad
from jaxaot._src.autograd.recorded import (
    Stats, compiled_autograd, compiled_grad, compiled_value_and_grad, grad_hook, nnx_compiled_grad, reset, stats,
)

__all__ = [
    "Stats", "compiled_autograd", "compiled_grad", "compiled_value_and_grad", "grad", "grad_hook",
    "nnx_compiled_grad", "patch_value_and_grad", "reset", "stats", "value_and_grad",
]
