"""Byte budgets: the step's compiled peak device memory, and the plan that fits it.

Modules, lowest first:

* ``parse``: what a ``memory_budget`` means (:func:`parse_memory_budget`): a
  fraction in ``[0, 1]``, or bytes (``1.4e9``, ``"1.4GB"``, ``"512MiB"``);
* ``step_peak``: a plan's compiled peak, fused and split (:class:`StepPeak`,
  :func:`measure_step_peak`), compiled with plain ``jax.jit`` and cached;
* ``live_values``: the largest values live at the peak, by source line (:func:`peak_holders`);
* ``limits``: how many device bytes plan-time measurement may hold (:func:`measurement_limit`);
* ``search``: the fastest plan whose peak fits a byte budget (:func:`plan_under_peak`), or
  :class:`~jaxaot.errors.MemoryBudgetError`.

``docs/concepts/memory_planner.md`` ("Byte budgets") explains the search and its costs.
"""

from jaxaot._src.partition.budget.parse import MemoryBudget, format_bytes, parse_memory_budget
from jaxaot._src.partition.budget.step_peak import (
    StepPeak, compile_count, compiled_peak, fused_step, measure_step_peak, program_peak)
from jaxaot._src.partition.budget.live_values import peak_holders
from jaxaot._src.partition.budget.limits import bytes_in_use, measurement_limit
from jaxaot._src.partition.budget.search import plan_under_peak

__all__ = [
    "MemoryBudget",
    "StepPeak",
    "bytes_in_use",
    "compile_count",
    "compiled_peak",
    "format_bytes",
    "fused_step",
    "measure_step_peak",
    "measurement_limit",
    "parse_memory_budget",
    "peak_holders",
    "plan_under_peak",
    "program_peak",
]
