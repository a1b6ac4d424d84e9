"""What the gradient functions jaxaot returns are, for type checkers: called as ``jax.value_and_grad``'s result
is, with ``cache_info()`` of the programs they compiled, and for an ``aot_function`` JAX's first stage, ``lower``.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> g: Gradient = jaxaot.compiled_grad(lambda x: jnp.sum(x ** 2))
    >>> g(jnp.arange(2.0)).tolist(), len(g.cache_info().entries)
    ([0.0, 2.0], 1)
"""

from __future__ import annotations

from typing import Any, Protocol

from jaxaot._src.runtime import AOTLowered, CacheInfo


class Gradient(Protocol):
    """A gradient of a function, called with the function's arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def cache_info(self) -> CacheInfo: ...


class StagedGradient(Gradient, Protocol):
    """The gradient of an ``aot_function``: also its programs' stages, lowered for one call's arguments
    (where ``holomorphic`` or ``allow_int`` runs JAX's autodiff, ``jax.jit``'s stages of it, with the same
    ``compile`` and ``as_text``)."""

    def lower(self, *args: Any, **kwargs: Any) -> AOTLowered: ...
