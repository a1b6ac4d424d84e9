"""Flax support: ``aot_module`` and module export (imports flax)."""

from jaxaot.nn.api import AOTLinenModule, AOTModule, CallMetadata, InputInfo, ModuleLowered, OutputInfo, aot_module
from jaxaot.nn.export_module import BackwardSignature, GraphSignature, aot_export_module

__all__ = [
    "AOTLinenModule", "AOTModule", "BackwardSignature", "CallMetadata", "GraphSignature", "InputInfo",
    "ModuleLowered", "OutputInfo", "aot_export_module", "aot_module",
]
