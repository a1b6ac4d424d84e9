"""Flax modules compiled ahead of time: ``aot_module`` for NNX and Linen, its signatures, and the optimizer."""

import typing as _typing

from jaxaot._src import deprecations as _deprecations
from jaxaot._src.nn import (
    aot_module as aot_module,
    AOTModule as AOTModule,
    AOTLinenModule as AOTLinenModule,
    ModuleLowered as ModuleLowered,
    aot_export_module as aot_export_module,
    CallMetadata as CallMetadata,
    InputInfo as InputInfo,
    OutputInfo as OutputInfo,
    GraphSignature as GraphSignature,
    BackwardSignature as BackwardSignature,
    Optimizer as Optimizer,
    LossCall as LossCall,
    PreparedLoss as PreparedLoss,
)

__all__ = [
    "aot_module", "AOTModule", "AOTLinenModule", "ModuleLowered", "aot_export_module", "CallMetadata",
    "InputInfo", "OutputInfo", "GraphSignature", "BackwardSignature", "Optimizer", "LossCall",
    "PreparedLoss",
]

# The old layout's paths, for one release: ``import jaxaot.nn.<module>`` and names its package exported.
__path__: list[str] = []
if not _typing.TYPE_CHECKING:
    __getattr__ = _deprecations.face_getattr("jaxaot.nn", "jaxaot._src.nn")
