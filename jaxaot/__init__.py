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
"""

from jaxaot import errors
from jaxaot.compile import compilers
from jaxaot.partition.default import Gradient, differentiate
from jaxaot.runtime import grad, value_and_grad
from jaxaot.errors import (
    CotangentMismatchError,
    InvalidInputError,
    InvalidOutputError,
    JaxaotError,
    NoDifferentiationRuleError,
    PartitionError,
    ResidualsMismatchError,
)
from jaxaot.partition.split import Partition, Residual
from jaxaot.partition.default import default_partition
from jaxaot.partition.min_cut import min_cut_rematerialization_partition
from jaxaot.runtime import AOTFunction, AOTLowered, CacheInfo, Residuals, aot_function
from jaxaot.tracing.joint import JointGraph, trace_joint
from jaxaot.loops import common as primitives  # while-loop primitives (public alias)
from jaxaot.loops.api import while_loop, while_loop_stack_output  # jaxaot.while_loop is the function
from jaxaot._config import config  # export/cache: jaxaot.config is the settings object
from jaxaot.errors import ArtifactError, ArtifactInputError, ArtifactVersionError, CacheWarning, NotExportableError
from jaxaot.artifacts import ExportedAOT, LoadedAOT, export, load
from jaxaot.errors import LossOutputError  # flax support

__version__ = "0.1.0"

# Flax support loads on first use: importing flax costs about as much as importing jax,
# and code that never touches a module should not pay for it.
_LAZY = {
    **{name: "jaxaot.nn" for name in (
        "AOTLinenModule", "AOTModule", "CallMetadata", "InputInfo", "ModuleLowered", "OutputInfo", "aot_module")},
    **{name: "jaxaot.nn" for name in ("BackwardSignature", "GraphSignature", "aot_export_module")},
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxaot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "primitives",
    "while_loop",
    "while_loop_stack_output",
    "AOTLinenModule",
    "AOTModule",
    "BackwardSignature",
    "CallMetadata",
    "LossOutputError",
    "GraphSignature",
    "InputInfo",
    "ModuleLowered",
    "OutputInfo",
    "aot_export_module",
    "aot_module",
    "AOTFunction",
    "AOTLowered",
    "CacheInfo",
    "CotangentMismatchError",
    "Gradient",
    "InvalidInputError",
    "InvalidOutputError",
    "JaxaotError",
    "JointGraph",
    "NoDifferentiationRuleError",
    "Partition",
    "PartitionError",
    "Residual",
    "Residuals",
    "ResidualsMismatchError",
    "aot_function",
    "compilers",
    "default_partition",
    "min_cut_rematerialization_partition",
    "differentiate",
    "errors",
    "grad",
    "value_and_grad",
    "trace_joint",
    # export / persistent cache
    "ArtifactError",
    "ArtifactInputError",
    "ArtifactVersionError",
    "CacheWarning",
    "ExportedAOT",
    "LoadedAOT",
    "NotExportableError",
    "config",
    "export",
    "load",
]
