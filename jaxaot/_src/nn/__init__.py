"""Flax support: ``aot_module`` and module export (imports flax).

Modules, bottom up: ``state`` (state in transit, write-back delta, dotted
names), ``metadata`` (:class:`CallMetadata`), ``call`` (one prepared call),
``pure`` (the module call as a pure function), ``module_programs`` (an
``aot_module``'s compiled programs and options), ``proxy`` (a module that is
another module's attributes, state and graph: how an ``aot_module`` mixes with
plain Flax state), ``split_cache`` (a module's split, kept while its structure
is unchanged), ``traversal`` (the parameters a compiled gradient found, reused
by the optimizer), ``loss_call`` (a loss function of the module prepared as one
more call of it: :class:`PreparedLoss`, which the compiled eager step of
:func:`jaxaot.value_and_grad` in :mod:`jaxaot._src.autograd` runs), ``nnx`` /
``linen`` (the two wrappers), ``api`` (``aot_module``), ``export_module``
(``aot_export_module``), ``update_cache`` (what the optimizer's update compiled:
its ``cache_info()``) and ``optimizer`` (:class:`Optimizer`, its compiled eager
update).
"""

from jaxaot._src.nn.api import aot_module
from jaxaot._src.nn.export_module import BackwardSignature, GraphSignature, aot_export_module
from jaxaot._src.nn.linen import AOTLinenModule
from jaxaot._src.nn.loss_call import LossCall, PreparedLoss
from jaxaot._src.nn.metadata import CallMetadata, InputInfo, ModuleLowered, OutputInfo
from jaxaot._src.nn.nnx import AOTModule
from jaxaot._src.nn.optimizer import Optimizer

__all__ = [
    "AOTLinenModule", "AOTModule", "BackwardSignature", "CallMetadata", "GraphSignature", "InputInfo", "LossCall",
    "ModuleLowered", "Optimizer", "OutputInfo", "PreparedLoss", "aot_export_module", "aot_module",
]
