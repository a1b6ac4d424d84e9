"""``nnx.capture`` on an ``aot_module``: the wrapped module's own Python runs, as the capture reads it.

``nnx.capture(module, ...)`` sets a ``__captures__`` attribute on every module of the graph, and with
``method_outputs`` it swaps the public methods of their classes (each class's own ``__dict__``) for wrappers
that ``sow`` each output. Neither is visible to a compiled program's cache, so an ``aot_module`` under a
capture calls its wrapped module directly (:func:`run_direct`). The capture reaches the wrapper's class,
not the wrapped module's: the wrapper's ``__call__`` (which calls none of its swapped public methods) sows
the call's output under ``'__call__'``, and :func:`run_direct` gives the wrapped module's class the same
wrappers for the methods the call runs inside.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> class Foo(nnx.Module):
    ...     def __init__(self):
    ...         self.lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    ...     def features(self, x):
    ...         return self.lin(x)
    ...     def __call__(self, x):
    ...         return self.features(x).sum()
    >>> model = jaxaot.nn.aot_module(Foo())
    >>> _, inter = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(jnp.ones((1, 2)))
    >>> sorted(inter.keys())
    ['__call__', 'features', 'lin']
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

from flax import nnx

from jaxaot._src.nn.pure import invoke

#: The attribute ``nnx.capture`` sets on each module while it collects.
CAPTURES = "__captures__"


def method_outputs_type(cls: type) -> type | None:
    """The Variable type ``nnx.capture(..., method_outputs=...)`` sows ``cls.__call__``'s outputs as, while it
    has swapped that method for its sowing wrapper; None otherwise."""
    fn = cls.__dict__.get("__call__")
    if not getattr(fn, "_does_capturing", False):
        return None
    try:
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        value = cells["variable_type"].cell_contents
    except (AttributeError, KeyError, ValueError):  # Flax's wrapper laid out otherwise: the call's output is sown
        return None
    return value if isinstance(value, type) and issubclass(value, nnx.Variable) else None


def _capturing(name: str, method: Any, variable_type: type) -> Any:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        self.sow(variable_type, name, result)
        return result

    wrapper._does_capturing = True
    return wrapper


@contextlib.contextmanager
def _sowing_methods(cls: type, variable_type: type) -> Iterator[None]:
    """Within the block, ``cls``'s public methods (its own, and ``__call__``) sow their outputs as
    ``nnx.capture(..., method_outputs=variable_type)`` makes them; a class the capture swapped already stays."""
    own = dict(cls.__dict__)
    if any(getattr(fn, "_does_capturing", False) for fn in own.values()):
        yield
        return
    swapped = [(name, fn) for name, fn in own.items()
               if callable(fn) and (not name.startswith("_") or name == "__call__")]
    for name, fn in swapped:
        setattr(cls, name, _capturing(name, fn, variable_type))
    try:
        yield
    finally:
        for name, fn in swapped:
            setattr(cls, name, fn)


def run_direct(wrapper_type: type, module: nnx.Module, method: Any, args: tuple, kwargs: dict) -> Any:
    """``module.method(*args, **kwargs)``, run as Python. When a capture with ``method_outputs`` swapped
    ``wrapper_type.__call__`` (which sows the call's output itself), the methods of ``module``'s class sow
    theirs during the call, the method called first excepted: its output is the one the wrapper sows."""
    variable_type = method_outputs_type(wrapper_type)
    if variable_type is None:
        return invoke(module, method, args, kwargs)
    cls = type(module)
    with _sowing_methods(cls, variable_type):
        fn = cls.__dict__.get(method) if isinstance(method, str) else None
        if getattr(fn, "_does_capturing", False):
            return fn.__wrapped__(module, *args, **kwargs)
        return invoke(module, method, args, kwargs)


__all__ = ["CAPTURES", "method_outputs_type", "run_direct"]
