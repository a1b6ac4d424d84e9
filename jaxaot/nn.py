"""Flax modules compiled ahead of time: ``aot_module`` for NNX and Linen, its signatures, and the optimizer."""

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
