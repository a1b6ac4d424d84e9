"""The fastest plan found whose compiled peak fits a byte budget, measuring few plans.

Only XLA knows a plan's peak, and measuring one costs a compile of the step. So :func:`peak_search`
measures the fraction 1 plan (where its floor is over the budget, only a cheaper preview, or nothing on a
platform without one), predicts the others' peaks from their saved bytes (:func:`predict_peak`), measures the
least-recomputing plan that may fit (predicted to, or shaped like ``dots_saveable``), and refines with secant
and bisection steps, up to :data:`MAX_MEASURED`. Past the fraction 1 plan, one whose floor (the bytes held at
the hand-over to the backward, never above its peak) is over the budget is compiled only where nothing fits.
Compiles run on worker threads, ahead where cores are spare (:data:`AHEAD_FROM_THREADS`), but decisions read
the peaks one at a time. A cheap peak (:data:`~.step_peak.INEXACT`) may lie on either side of the runtime's: the
plan chosen is measured again as the runtime compiles it (its executable held for the runtime), and before
a :class:`~jaxaot.errors.MemoryBudgetError` names what is live at the smallest peak, the lowest peaks are too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Generator, Sequence

from jaxaot._src import workers
from jaxaot._src.config import config
from jaxaot._src.partition.budget import measured_executables
from jaxaot._src.partition.budget.predict import interpolate, predict_peak
from jaxaot._src.partition.budget.refused import nothing_fits
from jaxaot._src.partition.budget.step_peak import (
    INEXACT, MEASURE_SLACK, PendingPeak, StepPeak, fused_step, measure_options, previews,
    program_platform, sharding_devices, start_peak)
from jaxaot._src.partition.core import Partition
from jaxaot._src.partition.costs import OpCosts
from jaxaot._src.tracing import JointGraph

#: Fractions are planned on this grid (``k / GRID``).
GRID = 32
#: At most this many plans are compiled while some plan fits (more only while none does).
MAX_MEASURED = 4
#: After the first plan that fits, at most this many more are compiled to find a faster one.
MORE_AFTER_FIT = 1
#: Where nothing fits, at most this many plans are compiled before the budget is refused.
MAX_MEASURED_REFUSING = 10
#: Looking for the plan next above one on the budget's edge, at most this many grid fractions are planned.
NEXT_PLAN_STEPS = 8

#: With at least this many compile threads (:func:`jaxaot._src.workers.threads`) the search works ahead, on cores
#: to spare: while the fraction 1 plan compiles, it makes and prices the plans compared with it and, on a platform
#: of :data:`COMPILES_AHEAD_ON`, compiles the fraction 0 plan, before that plan's peak says whether they are
#: needed; where nothing fits, it compiles the next plan in line alongside each. One compile goes unread at most.
AHEAD_FROM_THREADS = 4
#: Platforms whose compiles run side by side on the host's cores alone. A GPU compile autotunes its kernels on
#: the device, so two contend there: a plan begun ahead and never read slowed the ones read (memory planner docs).
COMPILES_AHEAD_ON = frozenset({"cpu"})
#: Whether the search may work ahead; the plans asked for, measured and chosen are the same either way.
_CONCURRENT = True

#: What the search asks its driver for, ``(fraction, family)``: the min-cut's plan at a fraction budget,
#: ``family`` None or one of the policy-shaped families (:mod:`jaxaot._src.partition.mincut.save_families`).
Request = tuple[float, "str | None"]
#: :func:`peak_search`: yields requests, is sent each one's plan, returns the plan chosen.
PeakSearch = Generator[Request, Partition, Partition]


def _plan_key(part: Partition) -> tuple:
    """What tells two plans apart cheaply (residuals, where they live, the primal's plan, recomputed count); plans
    alike in it are one program pair where their programs' text is alike too (:meth:`_Search.plan` compares)."""
    return (tuple((r.source, r.index, r.offloaded) for r in part.residuals), str(part.primal_plan),
            len(part.recomputed))


@dataclasses.dataclass
class _Candidate:
    part: Partition
    fraction: float
    family: str | None
    seconds: float | None  # its recomputation priced (None: not yet, :meth:`_Search.rank` prices it)
    peak: int | None = None
    measured: bool = False
    program: Any = None  # the fused step measured, whose executable may be held for the runtime
    pending: PendingPeak | None = None  # its compile, begun (:meth:`_Search.start`) and not yet read
    near: bool = False  # measured cheaply just over the budget: fits until measured exactly (:meth:`_Search.exact`)
    inexact: bool = False  # measured cheaply (an INEXACT option set): measured exactly before it is chosen
    previewed: bool = False  # its peak a preview's (:meth:`_Search.start`): for predictions alone, never a fit
    spread: int = 1  # the devices the step's inputs span (:func:`_spread`)

    @property
    def saved(self) -> int:
        """Saved device bytes per device, as if spread evenly (a budget and a compiled peak are per device)."""
        return int(self.part.device_saved_bytes) // self.spread


class _Search:
    """The candidates of one search, each plan once, and the measured ones' peaks."""

    def __init__(self, joint: JointGraph, budget: int, costs: OpCosts | None):
        self.joint, self.budget, self.costs = joint, budget, costs
        self.by_key: dict[tuple, _Candidate] = {}
        self.fractions: dict[float, _Candidate] = {}  # fraction -> its plan (family None)
        self.slack = MEASURE_SLACK if measure_options(joint.in_avals)[0] in INEXACT else 0  # cheap peaks' excess
        self.spread = _spread(joint.in_avals)

    def plan(self, fraction: float, family: str | None = None, priced: bool = True
             ) -> Generator[Request, Partition, _Candidate]:
        """The candidate of the plan at ``fraction`` (in ``family``), asked of the driver unless planned already;
        its recomputation priced now, or with ``priced`` False when first ranked."""
        if family is None and fraction in self.fractions:
            return self.fractions[fraction]
        part = yield fraction, family
        key = _plan_key(part)
        found = self.by_key.get(key)
        if found is not None and found.part is not part and (str(found.part.forward), str(found.part.backward)) != (
                str(part.forward), str(part.backward)):
            key = (*key, str(part.forward), str(part.backward))
            found = self.by_key.get(key)
        if found is None:
            found = self.by_key[key] = _Candidate(part, fraction, family, self.seconds(part) if priced else None,
                                                  spread=self.spread)
        elif family is None and found.family is None:
            found.fraction = max(found.fraction, fraction)
        if family is None:
            self.fractions[fraction] = found
        return found

    def start(self, c: _Candidate, preview: bool = False, runtime: bool = False) -> None:
        """Begin measuring the candidate: its fused step lowered here, compiled on a worker thread. Whether
        it counts as measured is :meth:`measure`'s to say: a compile begun and never read changes nothing
        but the cache of peaks. With ``preview`` (``step_peak.PREVIEW_OPTIONS``), for the fraction 1 plan where its
        floor is over the budget, the peak only anchors the predictions: the executable is never held, and the
        autotuning of a cold compile is left to a plan that may run. With ``runtime``, compiled as the runtime does."""
        if not c.measured and c.pending is None:
            c.program = fused_step(c.part, self.joint)
            c.pending = start_peak(c.program, self.joint.in_avals, preview=preview, runtime=runtime)
            c.previewed, c.inexact = preview, bool(self.slack) and not (preview or runtime)

    def measure(self, c: _Candidate, last: bool = False) -> None:
        """The candidate's fused peak, measured cheaply. Where that lies just over the budget (within the cheap
        measurement's :data:`~jaxaot._src.partition.budget.step_peak.MEASURE_SLACK`) the candidate is ``near``:
        it counts as fitting until it is about to be chosen, and only then measured exactly (:meth:`exact`), so
        that a better plan measured meanwhile spares that compile; so is any plan measured cheaply that is about to be
        chosen (:func:`peak_search`). With ``last`` (the search ends with it where it
        fits), a platform measuring cheaply compiles it as the runtime does, which takes that executable (not under
        ``jaxaot.config.provisional_steps``: the cheaper executable runs while the runtime compiles)."""
        if not c.measured:
            cheap = bool(measure_options(self.joint.in_avals)[0])
            self.start(c, runtime=last and cheap and not config.provisional_steps)
            c.peak, c.pending = c.pending.peak(keep=not c.previewed), None
            c.near = not c.previewed and c.peak is not None and self.budget < c.peak <= self.budget + self.slack
            c.measured = True

    def exact(self, c: _Candidate) -> None:
        """Measure the candidate measured cheaply again, exactly: the runtime's own compile, held for it."""
        c.peak = start_peak(c.program, self.joint.in_avals, runtime=True).peak(keep=True)  # taken if chosen
        c.near = c.inexact = False

    def release(self, chosen: _Candidate | None) -> None:
        """Stop holding the executables of the plans measured but not ``chosen``, and let go of the compiles
        begun and not read (their executables were never held), once they end: none runs on beside the
        runtime's compile and first step, holding device memory there."""
        measured_executables.release(c.program for c in self.measured if c is not chosen)
        for c in self.by_key.values():
            if c.pending is not None:
                c.pending.settle()
            c.pending = None

    def seconds(self, part: Partition) -> float:
        """The plan's recomputation, priced by ``costs`` (0 without: all plans rank alike)."""
        return 0.0 if self.costs is None else float(sum(self.costs.seconds(e) for e in part.recomputed.eqns))

    def fits(self, c: _Candidate) -> bool:
        return c.measured and not c.previewed and (c.peak is None or c.peak <= self.budget or c.near)

    @property
    def measured(self) -> list[_Candidate]:
        return [c for c in self.by_key.values() if c.measured]

    def predicted(self, c: _Candidate) -> float:
        if c.measured:
            return -math.inf if c.peak is None else c.peak
        return predict_peak(c.saved, self.anchors(c.family is not None))

    def anchors(self, families: bool = False) -> list[tuple[int, int]]:
        """``(saved bytes, peak)`` of the plans measured: the fractions' alone, or (``families``) all. A family
        plan's peak is off the fractions' curve: read as one of its points, it bends the curve where no fraction
        plan lies."""
        return [(m.saved, m.peak) for m in self.measured if m.peak is not None and (families or m.family is None)]

    def floor_fits(self, c: _Candidate) -> bool:
        """Whether the plan's floor fits: the bytes every fused step of it holds at the hand-over to the backward
        (``held_bytes``, never above its compiled peak). A plan whose floor is over cannot fit, whatever the
        predictions say."""
        return c.part.held_bytes <= self.budget * self.spread  # on a mesh, a lower bound: each device holds a share

    def may_fit(self, c: _Candidate) -> bool:
        """Whether the unmeasured candidate is worth a compile: its floor fits (:meth:`floor_fits`), and it is
        predicted to fit or is a family plan. A family plan's peak is not on the fractions' curve (what it
        recomputes decides which temporaries the backward holds at once), so only its floor rules it out."""
        return self.floor_fits(c) and (c.family is not None or self.predicted(c) <= self.budget)

    def rank(self, c: _Candidate) -> tuple:
        if c.seconds is None:
            c.seconds = self.seconds(c.part)
        return (c.seconds, -c.fraction)

    def next_fraction(self, below: float, above: float) -> float | None:
        """The largest grid fraction strictly between ``above`` and ``below`` whose plan's saved bytes,
        read off the fractions planned so far, are predicted to fit (None if none is)."""
        known = sorted((f, c.saved) for f, c in self.fractions.items())
        for k in range(math.ceil(below * GRID) - 1, math.floor(above * GRID), -1):
            f = k / GRID
            if f in self.fractions:
                continue
            saved = interpolate(known, f)
            if predict_peak(saved, self.anchors()) <= self.budget:
                return f
        return None


def peak_search(joint: JointGraph, budget: int, families: Sequence[str] = (),
                costs: OpCosts | None = None) -> PeakSearch:
    """The fastest plan found whose compiled fused-step peak is at most ``budget`` bytes (module docstring).

    A generator: it yields each plan it needs as a :data:`Request` ``(fraction, family)``, ``family`` None
    for the fraction's own plans and each of ``families`` at the fraction 1, and is sent that plan (the
    min-cut with its other options); it never asks twice for a fraction's own plan. ``costs`` prices a
    plan's recomputation (the rank among plans that fit; None: all equal, the larger fraction wins). Its
    return value is the plan chosen, carrying its :class:`StepPeak` (``step_peak``: the fused peak
    measured, with ``budget``). Raises :class:`MemoryBudgetError` when no plan measured fits.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> from jaxaot._src.partition.budget import peak_search
        >>> joint = jaxaot.partition.trace_joint(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) ** 2), jnp.ones(1000))
        >>> search, asked = peak_search(joint, 10**6), []
        >>> request = next(search)
        >>> while True:
        ...     asked.append(request)
        ...     plan = jaxaot.partition.min_cut_rematerialization_partition(joint, memory_budget=request[0])
        ...     try:
        ...         request = search.send(plan)
        ...     except StopIteration as done:
        ...         chosen = done.value
        ...         break
        >>> asked, chosen.step_peak.peak <= 10**6
        ([(1.0, None)], True)
    """
    search = _Search(joint, budget, costs)
    chosen = None
    try:
        chosen = yield from _choose(search, families)
        # Measured exactly only now that it would be chosen: a cheap peak may lie on either side of the runtime's
        # (a gather's, by a quarter); under provisional_steps the cheap executable runs, its peak as measured.
        while chosen.near or (chosen.inexact and not config.provisional_steps):
            search.exact(chosen)
            if not search.fits(chosen):
                chosen = yield from _settled(search)
    finally:  # the runtime may take the chosen plan's executable; the others are released here
        search.release(chosen)
    return _found(chosen, budget)


def _choose(search: _Search, families: Sequence[str]) -> Generator[Request, Partition, _Candidate]:
    """:func:`peak_search`'s choice among the candidates of ``search``."""
    top = yield from search.plan(1.0, priced=False)
    ahead = _ahead()
    # A plan whose floor is over cannot fit: its peak only anchors predictions, worth a preview, not a compile.
    may_fit = search.floor_fits(top)
    preview = not may_fit and previews(search.joint.in_avals)
    measured = preview or may_fit
    if preview:
        search.start(top, preview=True)
    elif ahead and measured:
        search.start(top)
    search.rank(top)  # priced while it compiles (on accelerators, at the device's measured rates)
    if ahead:  # planned while the top plan compiles (on accelerators the op timings run now): needed unless it fits
        yield from _plan_alternatives(search, families, begun=search.start if _compiles_ahead(search) else None)
    if measured:
        search.measure(top)
    if search.fits(top):
        return top
    if not ahead:
        yield from _plan_alternatives(search, families)
    return (yield from _settled(search))


def _settled(search: _Search) -> Generator[Request, Partition, _Candidate]:
    """The best-ranked plan measured that fits, else the search goes on until one fits (or refuses the budget): after
    the top plan, and again where a ``near`` plan proved over the budget."""
    best = min((c for c in search.measured if search.fits(c)), key=search.rank, default=None)
    if best is None:
        best = yield from _improve(search, None)
    if best is None:
        best = yield from _refusing(search)
    return best


def _plan_alternatives(search: _Search, families: Sequence[str], begun: Callable[[_Candidate], None] | None = None
                       ) -> Generator[Request, Partition, None]:
    """Plan what the search compares with the top plan once it does not fit: the fraction 0 plan and the
    family plans. ``begun`` (working ahead: :meth:`_Search.start`) is handed the fraction 0 plan as soon as
    it is made, the one measured next where no other plan is predicted to fit."""
    bottom = yield from search.plan(0.0)
    if begun is not None:
        begun(bottom)
    for family in families:
        yield from search.plan(1.0, family)


def _ahead() -> bool:
    """Whether the search works ahead (:data:`AHEAD_FROM_THREADS`)."""
    return _CONCURRENT and workers.threads() >= AHEAD_FROM_THREADS


def _compiles_ahead(search: _Search) -> bool:
    """Whether the search also compiles plans before it knows it needs them (:data:`COMPILES_AHEAD_ON`)."""
    return _ahead() and program_platform(search.joint.in_avals) in COMPILES_AHEAD_ON


def _improve(search: _Search, best: _Candidate | None) -> Generator[Request, Partition, _Candidate | None]:
    """Until a plan fits: measure the best candidate that may fit (the fraction 0 plan where none may).
    Then at most :data:`MORE_AFTER_FIT` more, each the best-ranked of the fraction plan above (predicted to
    fit, else :func:`_improvement_fraction`'s) and the family plans that may fit; at most
    :data:`MAX_MEASURED` plans in all, and none whose floor is over the budget (:meth:`_Search.floor_fits`)."""
    tries_after_fit = 0
    while len(search.measured) < MAX_MEASURED and (best is None or tries_after_fit < MORE_AFTER_FIT):
        if best is None:
            yield from _plan_next_fraction(search, None)
            pool = [c for c in search.by_key.values() if not c.measured and search.may_fit(c)]
            bottom = yield from search.plan(0.0)
            if not pool and not bottom.measured:
                pool = [bottom]
        else:
            f = yield from _improvement_fraction(search, best)
            pool = [c for c in search.by_key.values() if not c.measured and c.family is not None and search.may_fit(c)]
            if f is not None:
                pool.append((yield from search.plan(f)))
            pool = [c for c in pool if not c.measured and search.floor_fits(c) and search.rank(c) < search.rank(best)]
        if not pool:
            return best
        chosen = min(pool, key=search.rank)
        search.measure(chosen, last=best is None and len(search.measured) == MAX_MEASURED - 1)
        if best is not None:
            tries_after_fit += 1
        if search.fits(chosen) and (best is None or search.rank(chosen) < search.rank(best)):
            best = chosen
    return best


def _lowest_failing(search: _Search) -> float:
    return min((c.fraction for c in search.measured if not search.fits(c) and c.family is None), default=1.0)


def _plan_next_fraction(search: _Search, best: _Candidate | None) -> Generator[Request, Partition, float | None]:
    """Plan grid fractions from the top of the gap between ``best`` and the lowest failing plan down, until
    one's plan, not measured yet, is predicted to fit (its saved bytes read off the plans made so far); that
    fraction, or None."""
    below = _lowest_failing(search)
    above = best.fraction if best is not None and best.family is None else -1.0 / GRID
    while True:
        f = search.next_fraction(below, above)
        if f is None:
            return None
        c = yield from search.plan(f)
        if not c.measured and search.may_fit(c):
            return f
        below = f
        if best is not None and best.family is None:
            above = best.fraction  # raised where this fraction's plan is best's


def _improvement_fraction(search: _Search, best: _Candidate) -> Generator[Request, Partition, float | None]:
    """The fraction to try above ``best``: the largest predicted to fit (the secant between the plan that fits
    and the lowest failing one), else, where ``best`` is ``near``, the next plan above it (:func:`_next_plan_above`),
    else the grid fraction halfway to the lowest failing one; None where no grid fraction lies between."""
    predicted = yield from _plan_next_fraction(search, best)
    if predicted is not None or best.family is not None:
        return predicted
    failing = _lowest_failing(search)
    if best.near:
        above = yield from _next_plan_above(search, best, failing)
        if above is not None:
            return above
    halfway = math.floor((best.fraction + failing) / 2 * GRID) / GRID
    return halfway if best.fraction < halfway < failing else None


def _next_plan_above(search: _Search, best: _Candidate, failing: float
                     ) -> Generator[Request, Partition, float | None]:
    """The smallest grid fraction above ``best`` (below ``failing``, within :data:`NEXT_PLAN_STEPS`) whose plan is
    another, not measured yet, or None.
    Tried where ``best`` lies on the budget's edge (``near``): peaks flatten towards the least-saving plans, so
    the plan next to one that about fits is the likeliest better plan to fit, and fitting, it spares ``best``'s
    exact measurement."""
    first = math.floor(best.fraction * GRID) + 1
    for k in range(first, min(math.ceil(failing * GRID), first + NEXT_PLAN_STEPS)):
        c = yield from search.plan(k / GRID)
        if c is not best:
            return None if c.measured else k / GRID
    return None


def _refusing(search: _Search) -> Generator[Request, Partition, _Candidate]:
    """Where no plan is predicted to fit: measure the plans predicted lowest, among the family plans and the grid's
    fractions ``k / 8``, until one fits (then improve on it) or :data:`MAX_MEASURED_REFUSING` were measured.
    Among equal predictions the family plans go first: a fraction plan's peak is read off its neighbours on the
    same curve, a family plan's off a curve that is not its own (a flat one says least about them)."""
    for k in range(8, -1, -1):
        yield from search.plan(k / 8)
    while len(search.measured) < MAX_MEASURED_REFUSING:
        pool = [c for c in search.by_key.values() if not c.measured]
        if not pool:
            break
        order = sorted(pool, key=lambda c: (search.predicted(c), c.family is None, search.rank(c)))
        chosen = order[0]
        if len(order) > 1 and len(search.measured) + 1 < MAX_MEASURED_REFUSING and _compiles_ahead(search):
            search.start(order[1])  # measured next unless this one fits or its peak reorders the rest
        search.measure(chosen)
        if search.fits(chosen):
            return (yield from _improve(search, chosen)) or chosen
    for c in sorted((c for c in search.measured if c.inexact and c.peak is not None), key=lambda c: c.peak)[:2]:
        search.exact(c)  # the lowest cheap peaks over the budget, exactly: a cheap peak may lie above the runtime's
        if search.fits(c):
            return c
    reach = lambda c: 1 << 62 if c.peak is None else c.peak  # noqa: E731
    while True:  # the smallest peak named is the runtime's: asking for it finds that plan
        smallest = min(search.measured, key=lambda c: (c.previewed, reach(c)))  # a preview's peak is approximate
        if not smallest.inexact or smallest.peak is None:
            raise nothing_fits(search.budget, smallest.part, reach(smallest), search.spread)
        search.exact(smallest)
        if search.fits(smallest):
            return smallest


def _spread(avals: Sequence[Any]) -> int:
    """How many devices the inputs span (1 off a mesh): a plan's bytes, whole arrays, held over that many devices
    are at least that share on each, which is all the search assumes before XLA says where each value lives."""
    return max((len(sharding_devices(getattr(a, "sharding", None))) for a in avals), default=1) or 1


def _found(c: _Candidate, budget: int) -> Partition:
    return dataclasses.replace(c.part, step_peak=StepPeak(c.peak, budget=budget))
