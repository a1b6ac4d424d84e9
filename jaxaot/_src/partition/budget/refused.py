"""The error of a byte budget no plan meets: the smallest peak measured and what is live there."""

from __future__ import annotations

from typing import Any

from jaxaot.errors import MemoryBudgetError
from jaxaot._src.partition.budget.live_values import peak_holders
from jaxaot._src.units import format_bytes


def nothing_fits(budget: int, part: Any, peak: int, spread: int) -> MemoryBudgetError:
    """The error for ``budget``, naming the smallest ``peak`` measured, of the plan ``part``, and its largest
    live values (``spread``: the devices the step's inputs span)."""
    _, holders = peak_holders(part)
    lines = "\n".join(f"  {format_bytes(n):>11}  {what}" for n, what in holders)
    where = "on the device" if spread == 1 else f"whole, over {spread} devices"
    return MemoryBudgetError(
        f"memory_budget={budget} bytes ({format_bytes(budget)}) is below the smallest compiled peak the planner "
        f"reaches for this step: {peak} bytes ({format_bytes(peak)}), with {len(part.residuals)} "
        f"residuals ({format_bytes(part.device_saved_bytes)} {where}) and "
        f"{len(part.recomputed)} eqns recomputed. The largest values live at that peak (in program "
        f"order, as the step runs op by op: XLA's fusion keeps fewer, so they may add up to more) are:\n"
        f"{lines}\nRaise the budget to at least {peak} bytes, or shrink what holds the peak "
        f"(a smaller batch or sequence, fewer inputs on the device).",
        budget=budget, smallest_peak=peak, holders=tuple(holders))
