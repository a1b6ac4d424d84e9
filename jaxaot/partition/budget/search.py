"""The fastest plan whose compiled peak fits a byte budget.

A byte ``memory_budget`` asks for the step's compiled peak device memory
(:mod:`jaxaot.partition.budget.step_peak`) to stay at or below it. The planner
already has a knob that trades time for memory: the fraction budget, which
recomputes more as it falls, at the top level and in every ``lax.scan`` body
alike, and offloads before recomputing where offloading is on. Recomputing more
never makes a step faster, so the fastest plan that fits is the one at the
largest fraction that fits. :func:`plan_under_peak` finds it:

1. the fraction 1 plan: if its peak fits, nothing need be recomputed;
2. the fraction 0 plan, which recomputes everything recomputable, loops
   included. Where its peak is over the budget too, the fractions ``k / 8``
   are tried (peaks need not be monotone: recomputation adds temporaries to the
   backward), and where none fits, :class:`~jaxaot.errors.MemoryBudgetError`
   names the smallest peak measured and the largest values live at it
   (:func:`~jaxaot.partition.budget.live_values.peak_holders`);
3. bisection on the fraction between a plan that fits and one that does not.
   Fractions map to finitely many plans (knapsack prefixes), so a probe whose
   plan equals one already measured compiles nothing; bisection stops at
   :data:`RESOLUTION` or after :data:`MAX_MEASURED` measured plans;
4. where the budget forced recomputation (the plan found is below fraction 1, or
   there is none), plans shaped like JAX's ``dots_saveable``
   (:mod:`jaxaot.partition.mincut.save_families`): which values the backward
   recomputes decides which temporaries it holds at once, and on an H200
   16-head GPT-2 block these reached ``dots_saveable``'s peak where no fraction
   did. Of the plans that fit, the one whose recomputed eqns cost least (the
   knapsack's op costs) wins.

A plan fits when its fused step peaks within the budget: that is the step
``jaxaot.value_and_grad`` runs. The search first asks more: that the split
forward and backward (what ``jax.grad`` of an ``aot_function`` runs, and what
the fused step falls back to where it is slower) fit too, so the plan fits
however the function is run; only where no plan does that (XLA's split
backward can peak above the fused step) does it settle for the fused step
alone, and then the split step is never chosen for it (``step_peak`` shows
both). The split programs are compiled only for plans whose fused step fits.

Cost: a partition per probe (up to ``log2(1 / RESOLUTION) + 2``) and, per
distinct plan measured, one compile of the fused step plus two of the split
programs when it fits: typically 4 to 8 plans, 8 to 16 compiles, each cached
for the process. Peaks are not always monotone in the fraction (recomputation
adds temporaries to the backward): bisection keeps the largest fraction it saw
fit, which may miss a larger one beyond a plan that did not.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from jaxaot.errors import MemoryBudgetError
from jaxaot.partition.budget.live_values import peak_holders
from jaxaot.partition.budget.parse import format_bytes
from jaxaot.partition.budget.step_peak import StepPeak, measure_step_peak, on_mesh, program_peak, fused_step
from jaxaot.partition.core import Partition
from jaxaot.tracing import JointGraph

#: Bisection on the fraction stops when the interval is this narrow.
RESOLUTION = 1 / 256
#: ... or when this many distinct plans have been measured.
MAX_MEASURED = 10
#: Where neither the fraction 1 nor the fraction 0 plan fits, the fractions ``k / GRID`` are tried.
GRID = 8

#: ``plan_at(fraction, family)``: the planner at a fraction budget, ``family`` None or one of the
#: policy-shaped families (:mod:`jaxaot.partition.mincut.save_families`).
PlanAt = Callable[[float, "str | None"], Partition]


def _plan_key(part: Partition) -> tuple:
    """What makes two plans the same program pair: the residuals, where they live, the programs' text."""
    return (tuple((r.source, r.index, r.offloaded) for r in part.residuals), str(part.primal_plan),
            len(part.recomputed), str(part.forward), str(part.backward))


@dataclasses.dataclass
class _Probe:
    part: Partition
    fused: int | None
    fraction: float
    split: StepPeak | None = None


class _Search:
    """The probes of one search: plans by fraction, and each distinct plan's peaks, measured once."""

    def __init__(self, joint: JointGraph, budget: int, plan_at: PlanAt):
        self.joint, self.budget, self.plan_at = joint, budget, plan_at
        self.by_key: dict[tuple, _Probe] = {}
        self.split = not on_mesh(joint)

    def probe(self, fraction: float, family: str | None = None) -> tuple[tuple, _Probe]:
        part = self.plan_at(fraction, family)
        key = _plan_key(part)
        found = self.by_key.get(key)
        if found is None:
            fused = program_peak(fused_step(part, self.joint), self.joint.in_avals)
            found = self.by_key[key] = _Probe(part, fused, fraction)
        return key, found

    def peak(self, probe: _Probe) -> StepPeak:
        """The probe's full :class:`StepPeak` (compiles the split programs the first time)."""
        if probe.split is None:
            probe.split = measure_step_peak(probe.part, self.joint, split=self.split, budget=self.budget)
        return probe.split

    def fits(self, probe: _Probe, split: bool) -> bool:
        """Whether the probe's fused step fits the budget, and with ``split`` its split programs too."""
        if probe.fused is not None and probe.fused > self.budget:
            return False
        return not split or self.peak(probe).fits(self.budget)

    @property
    def measured(self) -> int:
        return len(self.by_key)


def plan_under_peak(joint: JointGraph, budget: int, plan_at: PlanAt, families: Sequence[str] = (),
                    seconds: Callable[[Partition], float] | None = None) -> Partition:
    """The fastest plan found whose compiled step peak is at most ``budget`` bytes.

    ``plan_at(fraction, family)`` is the planner at a fraction budget (the min-cut with its other
    options), ``family`` None for the fraction's own plans. Where the largest fraction that fits is
    below 1, each of ``families`` is measured too (its plan at fraction 1), and the fitting plan of
    least estimated recomputation ``seconds(part)`` wins (ties: the larger fraction). The returned
    partition carries its :class:`StepPeak` (``step_peak``, with ``budget`` set). Raises
    :class:`MemoryBudgetError` when no plan's fused step fits (module docstring).
    """
    search = _Search(joint, budget, plan_at)
    found = None
    for split in ((True, False) if search.split else (False,)):
        found = _bisect(search, split)
        if found is None or found.fraction < 1:
            others = [search.probe(1.0, family)[1] for family in families]
            fitting = [p for p in [found, *others] if p is not None and search.fits(p, split)]
            if fitting:
                rank = seconds or (lambda part: 0.0)
                found = min(fitting, key=lambda p: (rank(p.part), -p.fraction))
        if found is not None:
            break
    else:
        found = _grid(search)
        if found is None:
            raise _nothing_fits(search)
    return dataclasses.replace(found.part, step_peak=search.peak(found))


def _bisect(search: _Search, split: bool) -> _Probe | None:
    """The probe at the largest fraction found to fit (``split``: the split programs too), or None."""
    top_key, top = search.probe(1.0)
    if search.fits(top, split):
        return top
    low_key, low = search.probe(0.0)
    if not search.fits(low, split):
        return None
    lo, hi, lo_key, best, hi_key = 0.0, 1.0, low_key, low, top_key
    while hi - lo > RESOLUTION and search.measured < MAX_MEASURED:
        mid = (lo + hi) / 2
        key, probe = search.probe(mid)
        if key == lo_key or (key != hi_key and search.fits(probe, split)):
            lo, lo_key, best = mid, key, probe
        else:
            hi, hi_key = mid, key
    best.fraction = max(best.fraction, lo)
    return best


def _grid(search: _Search) -> _Probe | None:
    """Where neither end fits: the largest fraction of a :data:`GRID`-step grid whose fused step fits, or None.
    Peaks need not be monotone in the fraction: a plan between the ends may peak below both."""
    for k in range(1, GRID):
        _, probe = search.probe(1.0 - k / GRID)
        probe.fraction = max(probe.fraction, 1.0 - k / GRID)
        if search.fits(probe, split=False):
            return probe
    return None


def _nothing_fits(search: _Search) -> MemoryBudgetError:
    """The error naming the smallest peak measured and what is live there."""
    def reach(p: _Probe) -> int:
        return p.fused if p.fused is not None else 1 << 62

    smallest = min(search.by_key.values(), key=reach)
    peak = reach(smallest)
    _, holders = peak_holders(smallest.part)
    lines = "\n".join(f"  {format_bytes(n):>11}  {what}" for n, what in holders)
    budget = search.budget
    return MemoryBudgetError(
        f"memory_budget={budget} bytes ({format_bytes(budget)}) is below the smallest compiled peak the planner "
        f"reaches for this step: {peak} bytes ({format_bytes(peak)}), with {len(smallest.part.residuals)} "
        f"residuals ({format_bytes(smallest.part.device_saved_bytes)} on the device) and "
        f"{len(smallest.part.recomputed)} eqns recomputed. The largest values live at that peak (in program "
        f"order) are:\n{lines}\nRaise the budget to at least {peak} bytes, or shrink what holds the peak "
        f"(a smaller batch or sequence, fewer inputs on the device).",
        budget=budget, smallest_peak=peak, holders=tuple(holders))
