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

The public names below are listed in pipeline order and load on first use
(PEP 562): ``import jaxaot`` costs nothing until a name is used, so the
``jaxaot`` command answers ``--help`` without importing JAX, and Flax loads
only for the module APIs.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from jaxaot import _display

__version__ = "0.1.0"

#: ``(module, names)`` in pipeline order: errors and settings, then trace -> partition ->
#: compile -> runtime, the while-loop primitives, the front-ends, and the eager gradients.
_EXPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("jaxaot.errors", (
        "JaxaotError", "InvalidInputError", "InvalidValueError", "InvalidOutputError", "StaticArgumentError",
        "ResidualsMismatchError",
        "CotangentMismatchError", "NoDifferentiationRuleError", "PartitionError", "MemoryBudgetError",
        "LoopFunctionError", "LoopCarryMismatchError", "InvalidLoopOptionError", "ReverseModeBoundError",
        "LoopOverflowError", "LoopRewriteError", "XlaCompileError",
        "LossOutputError", "NotExportableError", "ArtifactError", "ArtifactVersionError", "ArtifactInputError",
        "HookOutputError", "ShardingMismatchError", "ScheduleError", "StageMismatchError", "PipelineMemoryError",
        "CacheWarning")),
    ("jaxaot._config", ("config",)),
    # stage 1: trace
    ("jaxaot.tracing", ("JointGraph", "trace_joint")),
    # stage 2: partition
    ("jaxaot.partition", ("Partition", "Partitioner", "Residual", "default_partition", "Gradient", "differentiate",
                          "min_cut_rematerialization_partition", "remat_policy", "RematPolicy", "DeviceModel")),
    # stage 3: compile
    ("jaxaot.compile", ("Compiler",)),
    # stage 4: runtime
    ("jaxaot.runtime", ("aot_function", "AOTFunction", "AOTLowered", "AOTCompiled", "ResidualTable", "Residuals",
                        "CacheInfo")),
    # reverse-mode while loops
    ("jaxaot.loops", ("while_loop", "while_loop_stack_output", "patch_while_loop")),
    # front-ends: export, pipelines, Flax
    ("jaxaot.artifacts", ("export", "load", "ExportedAOT", "LoadedAOT")),
    ("jaxaot.parallel", ("pipeline", "Pipeline", "PipelineReport", "Schedule", "Action", "OpTimes", "Simulation",
                         "make_schedule", "simulate", "simulate_lockstep", "StageParams")),
    ("jaxaot.nn", ("aot_module", "AOTModule", "AOTLinenModule", "CallMetadata", "InputInfo", "OutputInfo",
                   "ModuleLowered", "aot_export_module", "GraphSignature", "BackwardSignature")),
    # eager gradients: straight to the compiled programs, and compiled autograd of eager code
    ("jaxaot.autograd", ("value_and_grad", "grad", "patch_value_and_grad", "compiled_grad",
                         "compiled_value_and_grad", "nnx_compiled_grad", "grad_hook", "compiled_autograd")),
)

#: Public modules reachable as attributes: ``jaxaot.errors``, ``jaxaot.compilers``, ...
_MODULES = {
    "errors": "jaxaot.errors",
    "compilers": "jaxaot.compile.compilers",
    "primitives": "jaxaot.loops.common",
    "loops": "jaxaot.loops",
    "viz": "jaxaot.viz",
    "nn": "jaxaot.nn",
    "parallel": "jaxaot.parallel",
}

# Jupyter's pictures of the runtime's objects are drawn by jaxaot.viz, which registers them in
# jaxaot._display; the runtime sits below viz, so this face loads viz on the first display.
_display.add_loader(functools.partial(importlib.import_module, "jaxaot.viz"))

_WHERE = {name: module for module, names in _EXPORTS for name in names}

__all__ = [name for _, names in _EXPORTS for name in names] + list(_MODULES)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'jaxaot' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static tools see the names the table above loads lazily
    from jaxaot import errors, loops, nn, parallel  # noqa: F401
    from jaxaot._config import config  # noqa: F401
    from jaxaot.artifacts import ExportedAOT, LoadedAOT, export, load  # noqa: F401
    from jaxaot.autograd import (  # noqa: F401
        compiled_autograd, compiled_grad, compiled_value_and_grad, grad, grad_hook, nnx_compiled_grad,
        patch_value_and_grad, value_and_grad,
    )
    from jaxaot.compile import Compiler, compilers  # noqa: F401
    from jaxaot.partition import (  # noqa: F401
        Gradient, Partition, Partitioner, Residual, default_partition, differentiate,
        min_cut_rematerialization_partition,
    )
    from jaxaot.runtime import (  # noqa: F401
        AOTCompiled, AOTFunction, AOTLowered, CacheInfo, ResidualTable, Residuals, aot_function,
    )
    from jaxaot.tracing import JointGraph, trace_joint  # noqa: F401
