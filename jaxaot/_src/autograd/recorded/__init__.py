"""Compiled autograd of eager JAX: the forward runs as written, each step's program compiled once per structure.

PyTorch's compiled autograd captures the backward graph at run time, compiles
it, and caches it by its structure. This package does the same for JAX code
run eagerly (outside ``jit``), where ``jax.grad`` would otherwise linearize the
forward and dispatch the backward one primitive at a time. It records the
forward (Python runs it; JAX operations are written down, and computed only
when Python looks at a value, under :class:`jaxaot._src.compat.RecordingTrace`),
and runs ``jit(value_and_grad)`` of the recording, compiled once per structure
(``docs/concepts/compiled_autograd.md``).

Modules, each one concept: ``hooks`` (:func:`grad_hook`, cotangent hooks as
identity ``custom_vjp``\\ s), ``param_hooks`` (post-accumulate hooks on whole
gradients), ``structure`` (the structural key of a recorded forward or a
backward jaxpr, and the trie that builds a forward's key as it is recorded),
``ops`` (array operators replayed from what ``jax.numpy`` recorded for the
same operand types), ``force`` (a value Python looks at, computed by one
compiled program), ``tape`` (one step's forward, recorded, with the values
Python looked at), ``reasons`` (why a step compiled, in words: the argument by
pytree path, the Python branch, the operation by source line), ``cache`` (the
process-wide, thread-safe cache of compiled programs, with
``stats``/``reset``), ``step`` (the compiled step of a recording),
``capture`` (the fallback: one step's backward as a jaxpr of its residuals),
``modules`` (Flax nnx module arguments), ``call`` (one call's arguments, split
once), ``replay`` (the compiled step of a recording proven static, run without
the forward's Python), ``plans`` (what one function keeps between calls) and
``api`` (:func:`compiled_grad`, :func:`compiled_value_and_grad`).
"""

from jaxaot._src.autograd.recorded import cache as compiled_autograd  # jaxaot.compiled_autograd.stats() / reset()
from jaxaot._src.autograd.recorded.api import compiled_grad, compiled_value_and_grad, nnx_compiled_grad
from jaxaot._src.autograd.recorded.cache import Stats, reset, stats
from jaxaot._src.autograd.recorded.hooks import grad_hook

__all__ = [
    "Stats", "compiled_autograd", "compiled_grad", "compiled_value_and_grad", "grad_hook", "nnx_compiled_grad",
    "reset", "stats",
]
