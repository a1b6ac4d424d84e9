"""Flax support: ``aot_module`` and module export (imports flax).

A Flax module's call becomes a pure function of its parameters and state, compiled
with :func:`jaxaot.aot_function`, its changed state written back after each call, so
a wrapped module behaves as eager Flax would and mixes with plain Flax state.
Besides the wrappers (``nnx``, ``linen``): module export (``aot_export_module``),
the loss of a module prepared as one more call (for :func:`jaxaot.value_and_grad`),
and :class:`Optimizer`, whose eager update is one compiled call.
"""

from jaxaot._src.nn.wrap_module import aot_module
from jaxaot._src.nn.export_module import BackwardSignature, GraphSignature, aot_export_module
from jaxaot._src.nn.graph_changes import check_unchanged, layout
from jaxaot._src.nn.linen import AOTLinenModule
from jaxaot._src.nn.loss_call import LossCall, PreparedLoss, has_numbers
from jaxaot._src.nn.module_call import READS_A_NUMBER
from jaxaot._src.nn.metadata import CallMetadata, InputInfo, ModuleLowered, OutputInfo
from jaxaot._src.nn.nnx import AOTModule
from jaxaot._src.nn.optimizer import Optimizer

__all__ = [
    "READS_A_NUMBER", "AOTLinenModule", "AOTModule", "BackwardSignature", "CallMetadata", "GraphSignature",
    "InputInfo", "LossCall", "ModuleLowered", "Optimizer", "OutputInfo", "PreparedLoss", "aot_export_module",
    "aot_module", "check_unchanged", "has_numbers", "layout",
]
