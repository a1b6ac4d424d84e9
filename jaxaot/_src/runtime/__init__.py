"""Stage 4, runtime: ``aot_function`` and the per-signature programs it runs.

:class:`AOTFunction` keeps, per input signature, a :class:`SignaturePrograms`
(traced programs and executables, built lazily) and per differentiated mask a
:class:`TrainingPrograms` (joint graph, partition, forward and backward). Those
two are the interface the stages above use (export, pipelines, the fused step);
:class:`SignaturePrograms` lists what they may call and read.
"""

from jaxaot._src.runtime.shardings import default_device, is_abstract, is_multi_device, output_shardings, replicated
from jaxaot._src.runtime.vjp import SplitPrograms, custom_vjp_of, scatter, select_cotangents, shape_and_dtype_name
from jaxaot._src.runtime.signature import CacheEntryInfo, CacheInfo, FusedChoice, TraceKind, leaf_key, sharding_key
from jaxaot._src.runtime.reasons import ArgNames, inputs_change, log_compile
from jaxaot._src.runtime.training import TrainingPrograms, typed_grads
from jaxaot._src.runtime.hot_path import HotPath, hot_leaves, hot_path
from jaxaot._src.runtime.signature_programs import SignaturePrograms
from jaxaot._src.runtime.residuals import Residuals
from jaxaot._src.runtime.residual_table import ResidualRow, ResidualTable
from jaxaot._src.runtime.lowered import AOTCompiled, AOTLowered
from jaxaot._src.runtime.traced import AOTTraced
from jaxaot._src.runtime.function import AOTFunction, aot_function, closed_over_tracers

__all__ = [
    "AOTCompiled", "AOTTraced", "ArgNames", "inputs_change", "log_compile", "AOTFunction", "AOTLowered",
    "CacheEntryInfo", "CacheInfo",
    "FusedChoice", "HotPath", "ResidualRow",
    "ResidualTable", "Residuals", "SignaturePrograms", "SplitPrograms", "TraceKind", "TrainingPrograms", "aot_function",
    "closed_over_tracers", "default_device",
    "custom_vjp_of", "hot_leaves", "hot_path", "is_abstract", "is_multi_device", "leaf_key", "output_shardings", "replicated", "scatter",
    "select_cotangents", "shape_and_dtype_name", "sharding_key", "typed_grads",
]
