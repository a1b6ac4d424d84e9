"""Flax support: ``aot_module`` and module export (imports flax).

Modules, bottom up: ``state`` (state in transit, write-back delta, dotted
names), ``metadata`` (:class:`CallMetadata`), ``call`` (one prepared call),
``nnx`` / ``linen`` (the two wrappers), ``api`` (``aot_module``) and
``export_module`` (``aot_export_module``); ``eager_grad`` (the compiled eager
step of :func:`jaxaot.value_and_grad`) and ``optimizer`` (:class:`Optimizer`,
its compiled eager update); ``traversal`` (the parameters a compiled gradient
found, reused by the optimizer), ``flax_functions`` (Flax's gradient
transformations, bound at import) and ``patch`` (:func:`patch_value_and_grad`).
"""

from jaxaot.nn.api import aot_module
from jaxaot.nn.export_module import BackwardSignature, GraphSignature, aot_export_module
from jaxaot.nn.linen import AOTLinenModule
from jaxaot.nn.metadata import CallMetadata, InputInfo, ModuleLowered, OutputInfo
from jaxaot.nn.nnx import AOTModule
from jaxaot.nn.optimizer import Optimizer
from jaxaot.nn.patch import patch_value_and_grad

__all__ = [
    "AOTLinenModule", "AOTModule", "BackwardSignature", "CallMetadata", "GraphSignature", "InputInfo",
    "ModuleLowered", "Optimizer", "OutputInfo", "aot_export_module", "aot_module", "patch_value_and_grad",
]
