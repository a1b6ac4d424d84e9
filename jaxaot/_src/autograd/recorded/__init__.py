"""Compiled autograd of eager JAX: the forward runs as written, each step's program compiled once per structure.

As PyTorch's compiled autograd does, this records the forward as it runs (JAX
operations written down under :class:`jaxaot._src.compat.RecordingTrace`, computed
only when Python looks at a value), and runs ``jit(value_and_grad)`` of the
recording, compiled once per structure and cached, where eager ``jax.grad``
would dispatch the backward one primitive at a time
(``docs/concepts/compiled_autograd.md``).
"""

from jaxaot._src.autograd.recorded.driver import compiled_grad, compiled_value_and_grad, nnx_compiled_grad
from jaxaot._src.autograd.recorded.step_cache import Stats, reset, stats
from jaxaot._src.autograd.recorded.hooks import grad_hook

__all__ = [
    "Stats", "compiled_grad", "compiled_value_and_grad", "grad_hook", "nnx_compiled_grad",
    "reset", "stats",
]
