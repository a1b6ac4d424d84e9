"""The names and import paths of the layout before the public faces: each still resolves for one
release, with a ``DeprecationWarning`` once per name or path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
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


#: The packages ``jaxaot`` had before its implementation moved under ``jaxaot._src``.
OLD_PACKAGES = frozenset({"artifacts", "autograd", "cli", "compile", "fusion", "loops", "nn", "parallel",
                          "partition", "runtime", "tracing", "viz"})


class _OldModule(types.ModuleType):
    """``jaxaot.<old path>``: forwards every attribute to the module now under ``jaxaot._src``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__dict__["_target"]), name)


class _OldPathLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        target = "jaxaot._src." + spec.name.split(".", 1)[1]
        real = importlib.import_module(target)  # an ImportError here names the module that is missing
        warn_once(spec.name, f"importing {spec.name} is deprecated and will stop working in the next release: "
                             f"import from the public faces (jaxaot, jaxaot.partition, jaxaot.loops, ...).",
                  stacklevel=6)
        module = _OldModule(spec.name, real.__doc__)
        module.__dict__["_target"] = target
        if hasattr(real, "__path__"):
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds ``jaxaot.runtime.function`` and the like, the deep paths of the old layout, as aliases of their
    modules under ``jaxaot._src`` (after the regular finders, which find every public face first)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != "jaxaot" or parts[1] not in OLD_PACKAGES:
            return None
        if importlib.util.find_spec("jaxaot._src." + ".".join(parts[1:])) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _OldPathLoader(), is_package=True)


def face_getattr(face: str, package: str) -> Any:
    """A face's module ``__getattr__``: a name its old package exported resolves there, warning once."""

    def __getattr__(name: str) -> Any:
        old = importlib.import_module(package)
        if name.startswith("__") or not hasattr(old, name):
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        warn_once(f"{face}.{name}", f"{face}.{name} is not public and will stop resolving in the next release.",
                  stacklevel=2)
        return getattr(old, name)

    return __getattr__


def install() -> None:
    """Put :class:`OldPathFinder` on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, OldPathFinder) for f in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
