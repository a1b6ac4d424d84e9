"""``grad`` from ``value_and_grad``: the one wrapper both eager-gradient families return.

Example:
    >>> vg = lambda x: ((x * x, "aux"), 2 * x)
    >>> vg.cache_info = lambda: None
    >>> grad_of(vg, None, has_aux=True)(3.0)
    (6.0, 'aux')
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from jaxaot._src import compat as C
from jaxaot._src.names import named_as_gradient
from jaxaot.errors import LoopOverflowError


def grad_of(vg: Callable, fun: Any, *, has_aux: bool, argnums: Any = 0) -> Any:
    """The gradients of ``vg``'s ``(value, grads)`` (with ``aux`` beside them under ``has_aux``), sharing its cache
    and, where ``vg`` has them, its stages (``lower``); named after ``fun`` (where given) as ``jax.grad`` names its
    result."""

    def picked(out: tuple) -> Any:
        value, g = out
        return (g, value[1]) if has_aux else g

    @C.api_boundary  # an error in the user's function shows the user's lines, as under jit
    def grad(*args: Any, **kwargs: Any):
        try:
            return picked(vg(*args, **kwargs))
        except LoopOverflowError as err:  # its outputs, as this call returns them
            if err.outputs is not None:
                err.outputs = picked(err.outputs)
            raise

    grad.cache_info = vg.cache_info
    if hasattr(vg, "lower_running"):  # an aot_function's: its stages, whose compiled stage returns the gradients
        grad.lower = vg.lower_running(grad)
    elif hasattr(vg, "lower"):  # jax.value_and_grad's, whose stages are jit's: jit's of the gradients too
        grad.lower = jax.jit(lambda *args, **kwargs: grad(*args, **kwargs)).lower
    return grad if fun is None else named_as_gradient(grad, fun, "Gradient", argnums)
