"""jaxaot: AOTAutograd for JAX.

Trace a function to a joint forward+backward jaxpr, split it with a partitioner
into a forward program (which also returns the residuals) and a backward
program, and compile each ahead of time into its own XLA executable.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
    >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
    >>> bool(jnp.allclose(jax.grad(f)(w, x), jax.grad(lambda w, x: jnp.tanh(x @ w).sum())(w, x)))
    True

The core lives here; each domain has one face: :mod:`jaxaot.partition`,
:mod:`jaxaot.compilers`, :mod:`jaxaot.loops`, :mod:`jaxaot.nn`,
:mod:`jaxaot.parallel`, :mod:`jaxaot.export`, :mod:`jaxaot.viz`,
:mod:`jaxaot.errors` and ``jaxaot.config``; :func:`compare` measures jaxaot's
training steps of a function next to JAX's. Names load on first use (PEP 562).
"""

from __future__ import annotations as _annotations

import importlib as _importlib
import typing as _typing
import warnings as _warnings

from jaxaot._src import deprecations as _deprecations
from jaxaot._src import display as _display

__version__ = "0.1.0"

_deprecations.install()  # the old layout's import paths resolve, for one release, with a warning

# The runtime's objects draw themselves in Jupyter through jaxaot._src.viz, which loads on the first display.
_display.add_loader(lambda: _importlib.import_module("jaxaot._src.viz"))

#: ``name -> module`` of the core's names, loaded on first use.
_CORE: dict[str, str] = {
    "config": "jaxaot._src.config",
    **dict.fromkeys(("aot_function", "AOTFunction", "AOTTraced", "AOTLowered", "AOTCompiled", "CacheInfo",
                     "CacheEntryInfo", "FusedChoice", "ResidualTable", "Residuals"), "jaxaot._src.runtime"),
    **dict.fromkeys(("value_and_grad", "grad", "patch_value_and_grad", "compiled_grad", "compiled_value_and_grad",
                     "nnx_compiled_grad", "grad_hook"), "jaxaot._src.autograd"),
    "compare": "jaxaot._src.compare",
}

#: The public faces, reachable as attributes (``jaxaot.loops``) and importable (``import jaxaot.loops``).
_FACES = ("errors", "partition", "compilers", "loops", "nn", "parallel", "export", "viz", "compiled_autograd")

__all__ = [*_FACES, *_CORE]


def _load(name: str) -> object:
    """The public name ``name``, imported on first use (PEP 562); an old name from its new face."""
    if name in _CORE:
        value = getattr(_importlib.import_module(_CORE[name]), name)
    elif name in _FACES:
        value = _importlib.import_module(f"jaxaot.{name}")
    else:
        return _deprecations.moved_name(name)  # a name's old home, with a warning; else AttributeError
    globals()[name] = value
    return value


if not _typing.TYPE_CHECKING:  # static tools see only the names bound below, not whatever this resolves
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted(__all__)


if _typing.TYPE_CHECKING:  # static tools see the names the table above loads lazily
    from jaxaot import (
        compiled_autograd as compiled_autograd, compilers as compilers, errors as errors, export as export,
        loops as loops, nn as nn,
        parallel as parallel, partition as partition, viz as viz,
    )
    from jaxaot._src.autograd import (
        compiled_grad as compiled_grad,
        compiled_value_and_grad as compiled_value_and_grad, grad as grad, grad_hook as grad_hook,
        nnx_compiled_grad as nnx_compiled_grad, patch_value_and_grad as patch_value_and_grad,
        value_and_grad as value_and_grad,
    )
    from jaxaot._src.compare import compare as compare
    from jaxaot._src.config import config as config
    from jaxaot._src.runtime import (
        AOTCompiled as AOTCompiled, AOTFunction as AOTFunction, AOTLowered as AOTLowered, AOTTraced as AOTTraced,
        CacheEntryInfo as CacheEntryInfo, CacheInfo as CacheInfo, FusedChoice as FusedChoice,
        ResidualTable as ResidualTable, Residuals as Residuals, aot_function as aot_function,
    )
