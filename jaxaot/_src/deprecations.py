"""Names the ``jaxaot`` package held before each domain had one face: they still resolve, for one
release, to their one public home, with a ``DeprecationWarning`` once per name."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: ``old top-level name -> its public face``.
MOVED: dict[str, str] = {
    **dict.fromkeys((
        "JaxaotError", "InvalidInputError", "InvalidValueError", "InvalidOutputError", "StaticArgumentError",
        "ResidualsMismatchError", "CotangentMismatchError", "NoDifferentiationRuleError", "PartitionError",
        "MemoryBudgetError", "LoopFunctionError", "LoopCarryMismatchError", "InvalidLoopOptionError",
        "ReverseModeBoundError", "LoopOverflowError", "LoopRewriteError", "XlaCompileError", "LossOutputError",
        "NotExportableError", "ArtifactError", "ArtifactVersionError", "ArtifactInputError", "HookOutputError",
        "ShardingMismatchError", "ScheduleError", "StageMismatchError", "PipelineMemoryError", "CacheWarning"),
        "jaxaot.errors"),
    **dict.fromkeys((
        "JointGraph", "trace_joint", "Partition", "Partitioner", "Residual", "default_partition", "Gradient",
        "differentiate", "min_cut_rematerialization_partition", "remat_policy", "RematPolicy", "DeviceModel"),
        "jaxaot.partition"),
    "Compiler": "jaxaot.compilers",
    **dict.fromkeys(("while_loop", "while_loop_stack_output", "patch_while_loop"), "jaxaot.loops"),
    **dict.fromkeys(("load", "ExportedAOT", "LoadedAOT"), "jaxaot.export"),
    **dict.fromkeys(("pipeline", "Pipeline", "PipelineReport", "Schedule", "Action", "OpTimes", "Simulation",
                     "make_schedule", "simulate", "simulate_lockstep", "StageParams"), "jaxaot.parallel"),
    **dict.fromkeys(("aot_module", "AOTModule", "AOTLinenModule", "CallMetadata", "InputInfo", "OutputInfo",
                     "ModuleLowered", "aot_export_module", "GraphSignature", "BackwardSignature"), "jaxaot.nn"),
}

_WARNED: set[str] = set()


def warn_once(key: str, message: str, stacklevel: int) -> None:
    """A ``DeprecationWarning`` with ``message``, the first time ``key`` is used in this process."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


def moved_name(name: str) -> Any:
    """The object an old top-level ``jaxaot.<name>`` meant, from its public face (warning once);
    an ``AttributeError`` for a name jaxaot never had."""
    face = MOVED.get(name)
    if face is None:
        raise AttributeError(f"module 'jaxaot' has no attribute {name!r}")
    warn_once(name, f"jaxaot.{name} is deprecated and will be removed in the next release: "
                    f"use {face}.{name}.", stacklevel=3)
    return getattr(importlib.import_module(face), name)
