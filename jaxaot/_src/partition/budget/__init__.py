"""Byte budgets: the step's compiled peak device memory, and the plan that fits it.

What a ``memory_budget`` means (:func:`parse_memory_budget`), a plan's compiled
peak (:class:`StepPeak`), the values that hold it (:func:`peak_holders`), the device
bytes plan-time timing may hold (:func:`measurement_limit`), and the fastest plan
whose peak fits (:func:`peak_search`) or a :class:`~jaxaot.errors.MemoryBudgetError`
(``docs/concepts/memory_planner.md``, "Byte budgets"), and the chosen plan's measuring
executable, held for the runtime to run (:mod:`.measured_executables`).
"""

from jaxaot._src.partition.budget import measured_executables

from jaxaot._src.partition.budget.parse import MemoryBudget, parse_memory_budget
from jaxaot._src.partition.budget.step_peak import (
    StepPeak, budget_of, compile_count, compiled_peak, fused_step, measure_step_peak, measured_layouts, program_peak,
    program_platform)
from jaxaot._src.partition.budget.live_values import peak_holders
from jaxaot._src.partition.budget.limits import bytes_in_use, measurement_limit, measuring_within
from jaxaot._src.partition.budget.search import peak_search

__all__ = [
    "MemoryBudget",
    "StepPeak",
    "budget_of",
    "bytes_in_use",
    "compile_count",
    "compiled_peak",
    "fused_step",
    "measure_step_peak",
    "measured_executables",
    "measured_layouts",
    "measurement_limit",
    "measuring_within",
    "parse_memory_budget",
    "peak_holders",
    "peak_search",
    "program_peak",
    "program_platform",
]
