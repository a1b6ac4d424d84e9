"""``jaxaot.patch_value_and_grad``: ``nnx.value_and_grad`` / ``nnx.grad`` take the compiled step.

Code written against Flax's names gets :func:`jaxaot.value_and_grad`'s compiled
step without edits: inside the ``with`` block, ``flax.nnx.value_and_grad`` and
``flax.nnx.grad`` dispatch to it when the one differentiated argument is an
``aot_module`` with Flax's default options, and to Flax's own functions otherwise.
As with :func:`jaxaot.loops.patch_while_loop`, names bound before the block are
not reached, and the swap is process-wide while it lasts.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> with jaxaot.patch_value_and_grad():
    ...     loss, grads = nnx.value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))(model, jnp.ones((4, 3)))
    >>> grads["kernel"][...].shape
    (3, 2)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

from jaxaot._src.autograd.direct.dispatch import module_dispatch

_LOCK = threading.Lock()
_DEFAULTS = dict(holomorphic=False, allow_int=False, reduce_axes=(), graph=None, graph_updates=None)


def _dispatching(flax_fn: Callable[..., Any], flax_value_and_grad: Callable[..., Any],
                 value: bool) -> Callable[..., Any]:
    """``flax_fn`` (``nnx.value_and_grad`` if ``value`` else ``nnx.grad``), with the compiled step
    for an ``aot_module`` argument (dispatched by :func:`jaxaot._src.autograd.direct.dispatch.module_dispatch`)."""

    @functools.wraps(flax_fn)
    def transform(f: Any = None, *, argnums: Any = 0, has_aux: bool = False, **options: Any) -> Any:
        if f is None:  # used as a decorator factory: nnx.grad(argnums=...)
            return functools.partial(transform, argnums=argnums, has_aux=has_aux, **options)
        if not (set(options) <= set(_DEFAULTS) and all(options.get(k, d) == d for k, d in _DEFAULTS.items())):
            return flax_fn(f, argnums=argnums, has_aux=has_aux, **options)
        vg = module_dispatch(f, argnums, has_aux, True, flax_value_and_grad(f, argnums=argnums, has_aux=has_aux))
        if value:
            return vg

        @functools.wraps(f)
        def grad(*args: Any, **kwargs: Any) -> Any:
            out, grads = vg(*args, **kwargs)
            return (grads, out[1]) if has_aux else grads

        return grad

    return transform


@contextlib.contextmanager
def patch_value_and_grad() -> Iterator[None]:
    """Within the block, ``flax.nnx.value_and_grad`` and ``flax.nnx.grad`` run an ``aot_module``'s
    gradient as one compiled step (the module docstring says when); restored on exit, also when the
    block raises. Blocks nest."""
    from flax import nnx  # optional dependency: jaxaot._src.autograd loads without Flax

    # Deferred, within this package: binds Flax's own functions, before the first swap.
    from jaxaot._src.autograd.direct.flax_functions import FLAX_GRAD, FLAX_VALUE_AND_GRAD

    with _LOCK:
        previous = nnx.value_and_grad, nnx.grad
        nnx.value_and_grad = _dispatching(FLAX_VALUE_AND_GRAD, FLAX_VALUE_AND_GRAD, value=True)
        nnx.grad = _dispatching(FLAX_GRAD, FLAX_VALUE_AND_GRAD, value=False)
    try:
        yield
    finally:
        with _LOCK:
            nnx.value_and_grad, nnx.grad = previous


__all__ = ["patch_value_and_grad"]
