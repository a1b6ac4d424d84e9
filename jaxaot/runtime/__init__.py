"""Stage 4, runtime: ``aot_function`` and the per-signature programs it runs.

Modules, each one concept: ``signature`` (what selects a program, why a call
recompiled), ``arguments`` (static values apart, the rest flattened),
``programs`` (per-signature and per-gradient programs and executables),
``vjp`` (the ``custom_vjp`` wiring shared with loaded artifacts), ``residuals``,
``checks`` (what ``backward`` checks), ``lowered`` (``AOTLowered``),
``function`` (``AOTFunction``, ``aot_function``) and ``eager`` (the fast
eager ``value_and_grad``/``grad``).
"""

from jaxaot.runtime.signature import CacheEntryInfo, CacheInfo, FusedChoice
from jaxaot.runtime.residuals import Residuals
from jaxaot.runtime.residual_table import ResidualRow, ResidualTable
from jaxaot.runtime.lowered import AOTCompiled, AOTLowered
from jaxaot.runtime.function import AOTFunction, aot_function
from jaxaot.runtime.eager import DifferentiatesItself, grad, self_differentiating, value_and_grad

__all__ = [
    "AOTCompiled", "AOTFunction", "AOTLowered", "CacheEntryInfo", "CacheInfo", "DifferentiatesItself", "FusedChoice",
    "ResidualRow", "ResidualTable", "Residuals", "aot_function", "grad", "self_differentiating", "value_and_grad",
]
