"""Fused or split: which step ``jaxaot.value_and_grad`` runs for a signature, decided once, and only its programs kept.

The fused step runs unless its compiled peak is over a byte ``memory_budget`` that
the split programs fit (:func:`budget_choice`), or, timed on the first call, it
takes more than :data:`STEP_TIME_SLACK` times the split step (:func:`choose_step`, on calls
taken until :func:`timing_settled`; timed only where that cannot run the device out of memory). The loser's
executables are dropped; the :class:`FusedChoice` says what was compiled, which
step runs and why. On an accelerator the split programs' compiles begin beside the fused step's
(:mod:`~jaxaot._src.fusion.prefetch`), and with a persistent cache the choice is kept for later
processes, which run it untimed (:mod:`~jaxaot._src.fusion.recalled`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Protocol, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.fusion.interface import TrainingLike
from jaxaot._src.fusion.prefetch import speculates
from jaxaot._src.fusion.recalled import recall, remember
from jaxaot._src.fusion.variants import described, fused_exe, fused_name, platform_of
from jaxaot._src.partition import budget_of, compiled_peak, layout_choice_platforms


@dataclasses.dataclass(frozen=True)
class FusedChoice:
    """How one fused training step was compiled, and whether it runs.

    Attributes:
      executable: its name among the signature's executables (``"fused[...]"``).
      layouts: ``"auto"`` (XLA's residual layouts) or ``"pinned"``.
      order: ``"xla"`` or ``"consume_first"`` (the backward's order).
      barrier: which residuals pass ``optimization_barrier``: ``"all"``, ``"recomputed"`` or ``"none"``.
      rederived: the residuals the step's backward derives again instead of taking them
        (the fused-step guide, ``docs/concepts/fused_step.md``), described as ``lower()``'s residual
        table does.
      runs: ``"fused"`` (the step is kept and runs), ``"split"`` (the split forward and backward run, and
        the fused executable is dropped), or None before the first call decides (a step compiled by
        ``lower(...).compile()``), or while the calls after it still weigh it (``jaxaot.config.tune_in_background``).
      why: the reason for ``runs``, in words.
    """

    executable: str
    layouts: str
    order: str
    barrier: str
    rederived: tuple[str, ...] = ()
    runs: str | None = None
    why: str = ""


def budget_choice(step_peak: Any, fused_peak: int | None) -> tuple[str, str] | None:
    """``("split", why)`` where the fused step's compiled peak is over the plan's byte budget and the split
    programs' is not (:class:`~jaxaot._src.partition.StepPeak`), else None (the fused step may run).

    Example:
        >>> from jaxaot._src.fusion import budget_choice
        >>> from jaxaot._src.partition import StepPeak
        >>> budget_choice(StepPeak(fused=900, forward=500, backward=800, budget=1000), 1100)[0]
        'split'
        >>> budget_choice(StepPeak(fused=900, forward=500, backward=800, budget=1000), 950) is None
        True
    """
    budget = getattr(step_peak, "budget", None)
    if budget is None or fused_peak is None or fused_peak <= budget:
        return None
    split = step_peak.split
    if split is None or split > budget:
        return None  # neither fits: the planner chose this plan for its fused step, which stays
    return "split", (f"the fused step's compiled peak ({fused_peak} bytes) is over memory_budget ({budget} bytes) "
                     f"and the split programs' ({split} bytes) is not")


#: How much slower than the split executables of the same plan the fused step may time and still run.
STEP_TIME_SLACK = 1.02
#: Interleaved timed calls of each (after one untimed call of each) before the choice is made, and the most taken
#: where the two steps time too close to :data:`STEP_TIME_SLACK` to tell apart (:func:`timing_settled`).
STEP_TIME_ROUNDS = 5
STEP_TIME_MAX_ROUNDS = 25
#: The fewest seconds of timed calls, both steps together, before the choice is made (short steps take more calls
#: than :data:`STEP_TIME_ROUNDS`, up to :data:`STEP_TIME_MAX_ROUNDS` of each: five calls' medians are noise).
STEP_TIME_MIN_SECONDS = 0.25
#: The most wall seconds a first call that decides spends timing past :data:`STEP_TIME_ROUNDS` rounds (its caller
#: waits for them; calls after a first call that returned time on at no cost, as the user's own steps).
FIRST_CALL_EXTRA_SECONDS = 1.0
#: Backends where the fused/split choice is timed without a :data:`step_timer` (CPU timing is noise).
TIME_CHOICE_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})
#: The timer of the choice: ``step_timer(which, run) -> seconds`` of one blocked call of ``run``
#: (``which``: ``"fused"`` or ``"split"``). None: wall-clock time on accelerators, and no timing on CPU,
#: where timing is noise. Tests set it to drive the choice.
step_timer: Callable[[str, Callable[[], Any]], float] | None = None


def _ratio(fused_seconds: Sequence[float], split_seconds: Sequence[float]) -> tuple[float, float]:
    """``(the ratio of the two steps' median times, its standard error)``, each median's error taken from its
    calls' median absolute deviation."""
    fused, split = statistics.median(fused_seconds), statistics.median(split_seconds)
    if fused <= 0 or split <= 0:
        return 1.0, 0.0

    def spread(xs: Sequence[float], med: float) -> float:  # a median's standard error, relative to it
        return 1.4826 * 1.2533 * statistics.median(abs(x - med) for x in xs) / med / len(xs) ** 0.5

    ratio = fused / split
    return ratio, ratio * (spread(fused_seconds, fused) ** 2 + spread(split_seconds, split) ** 2) ** 0.5


def _too_close(ratio: float, error: float, slack: float) -> bool:
    return abs(ratio - slack) <= 2 * error


def choose_step(fused_seconds: Sequence[float], split_seconds: Sequence[float],
                slack: float = STEP_TIME_SLACK) -> tuple[str, str]:
    """``("fused" or "split", why)``: the fused step unless its median time is more than ``slack`` times the
    split executables' (the same plan, the same inputs). Where the ratio lies within two standard errors of
    ``slack`` (:func:`timing_settled` gave up telling them apart), the fused step runs only if it timed no slower.

    Example:
        >>> from jaxaot._src.fusion import choose_step
        >>> choose_step([1.0, 1.01, 1.0], [1.0, 0.99, 1.0])[0], choose_step([1.1, 1.1], [1.0, 1.0])[0]
        ('fused', 'split')
        >>> runs, why = choose_step([1.0, 1.05, 0.98, 1.03], [1.0, 0.97, 1.02, 1.0])  # 1.015x: too close to call
        >>> runs, why.split(", ")[1:]
        ('split', ['too close to 1.02x to call', 'and not faster (4 calls of each)'])
    """
    ratio, error = _ratio(fused_seconds, split_seconds)
    calls = f"{min(len(fused_seconds), len(split_seconds))} calls of each"
    if _too_close(ratio, error, slack):
        if ratio <= 1.0:
            return "fused", f"timed at {ratio:.3f}x the split executables, too close to {slack}x to call ({calls})"
        return "split", (f"the fused step timed {ratio:.3f}x the split executables, too close to {slack}x to call, "
                         f"and not faster ({calls})")
    if ratio <= slack:
        return "fused", f"timed at {ratio:.3f}x the split executables ({calls})"
    return "split", f"the fused step timed {ratio:.3f}x the split executables (more than {slack}x; {calls})"


def timing_settled(fused_seconds: Sequence[float], split_seconds: Sequence[float],
                   slack: float = STEP_TIME_SLACK) -> bool:
    """Whether the calls timed so far decide :func:`choose_step`: :data:`STEP_TIME_ROUNDS` of each and
    :data:`STEP_TIME_MIN_SECONDS` in all at least, and the ratio of their medians farther from ``slack`` than
    twice its standard error; or :data:`STEP_TIME_MAX_ROUNDS` of each.

    One GPU step's single calls vary by a tenth from one to the next, so five of each put a step 1.05x the
    other on either side of a 1.02x slack; calls go on where the two are that close, and stop where
    they are not (``docs/benchmarks.md``, the fused training step).

    Example:
        >>> from jaxaot._src.fusion import timing_settled
        >>> noisy = [1.0, 1.1, 0.9, 1.0, 1.05], [1.0, 0.95, 1.08, 1.0, 0.97]
        >>> timing_settled([1.0] * 5, [1.1] * 5), timing_settled(*noisy), timing_settled(*(xs * 5 for xs in noisy))
        (True, False, True)
        >>> timing_settled([0.001] * 5, [0.0011] * 5)  # a hundredth of a second: too short to tell
        False
    """
    n = min(len(fused_seconds), len(split_seconds))
    if n < STEP_TIME_ROUNDS:
        return False
    if n >= STEP_TIME_MAX_ROUNDS:
        return True
    if sum(fused_seconds) + sum(split_seconds) < STEP_TIME_MIN_SECONDS:
        return False
    return not _too_close(*_ratio(fused_seconds, split_seconds), slack)


class SplitRunner(TrainingLike, Protocol):
    """What the split step needs of the runtime's training programs besides :class:`TrainingLike`."""

    def forward(self, leaves: Sequence[Any], concrete: bool | None = None) -> tuple[list, list]: ...

    def backward(self, residuals: Sequence[Any], cts: Sequence[Any], concrete_residuals: bool = False) -> list: ...

    def unit_cotangents(self, leaf: int) -> list: ...

    @property
    def forward_exe(self) -> Any: ...

    @property
    def backward_exe(self) -> Any: ...

    def drop_executables(self, names: set) -> None: ...

    def start_split_compiles(self) -> None: ...

    def drop_split_compiles(self) -> None: ...


def run_split(training: SplitRunner, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(outputs, grads)`` from the split forward and backward executables of the same plan."""
    outs, residuals = training.forward(leaves, concrete=True)
    return outs, training.backward(residuals, training.unit_cotangents(value_leaf), concrete_residuals=True)


def _wall_seconds(which: str, run: Callable[[], Any]) -> float:
    del which
    t = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - t


def free_device_bytes(exe: Any) -> int | None:
    """Bytes the executable's first device has free now (``memory_stats``: limit less in use), or None where the
    backend does not say (CPU)."""
    shardings = jax.tree.leaves(getattr(exe, "input_shardings", None))
    devices = sorted(next(iter(shardings)).device_set, key=lambda d: d.id) if shardings else []
    stats = devices[0].memory_stats() if devices and hasattr(devices[0], "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


#: The share of the device's free memory the split programs' extra peak may take to be timed.
FREE_MEMORY_SHARE = 0.5


def timing_refused(training: SplitRunner, exe: Any) -> tuple[str, str] | None:
    """``("fused", why)`` where the fused step ``exe`` and the split one are not timed (the platform, the step, or
    the device's room for the split programs, which this compiles), else None."""
    if step_timer is None and platform_of(exe) not in TIME_CHOICE_PLATFORMS:
        return "fused", "not timed: on CPU step times are noise"
    untimed = _untimed(training)
    if untimed is not None:
        return "fused", untimed
    split_peaks = [compiled_peak(training.forward_exe), compiled_peak(training.backward_exe)]
    fused_peak = compiled_peak(exe)
    if None not in split_peaks and fused_peak is not None and max(split_peaks) > fused_peak:
        free = free_device_bytes(exe)
        if free is None or max(split_peaks) - fused_peak > FREE_MEMORY_SHARE * free:
            # Timing them could run the device out of memory, and running them would raise the step's peak.
            return "fused", (f"not timed: the split programs peak higher ({max(split_peaks)} bytes, fused "
                             f"{fused_peak}) than the device has room for")
    return None


def timed(which: str, run: Callable[[], Any], inputs: Sequence[Any] = ()) -> tuple[float, Any]:
    """``(seconds, result)`` of one blocked call of ``run``, by :data:`step_timer` (wall-clock time without one).

    ``inputs`` (the step's arguments) are waited for first: where the caller's work before this call (an
    optimizer's update of the parameters, say) still runs on the device, it would otherwise count in the step's
    time, the same for both steps, and bring their ratio towards 1."""
    jax.block_until_ready(list(inputs))
    box: list = []
    seconds = (step_timer or _wall_seconds)(which, lambda: box.append(run()) or box[-1])
    return seconds, box[-1]


def timing_order(round_: int) -> tuple[str, str]:
    """Which step a timed round runs first: the fused one in even rounds, the split one in odd ones, so that
    neither always follows the other."""
    return ("fused", "split") if round_ % 2 == 0 else ("split", "fused")


def _timed_choice(training: SplitRunner, exe: Any, leaves: list, value_leaf: int) -> tuple[str, str]:
    """The fused step or the split one, by time (:func:`choose_step`, on calls taken until :func:`timing_settled`, for
    at most :data:`FIRST_CALL_EXTRA_SECONDS` past the fewest), or why they are not timed."""
    refused = timing_refused(training, exe)
    if refused is not None:
        return refused
    runs = {"fused": lambda: exe(*leaves), "split": lambda: run_split(training, leaves, value_leaf)}
    for run in runs.values():
        jax.block_until_ready(run())  # warms both
    times: dict[str, list[float]] = {"fused": [], "split": []}
    extra_until = None
    while not timing_settled(times["fused"], times["split"]):
        if len(times["split"]) == STEP_TIME_ROUNDS:
            extra_until = time.perf_counter() + FIRST_CALL_EXTRA_SECONDS
        elif extra_until is not None and time.perf_counter() > extra_until:
            break
        for which in timing_order(len(times["split"])):
            times[which].append(timed(which, runs[which], leaves)[0])
    return choose_step(times["fused"], times["split"])


def _untimed(training: SplitRunner) -> str | None:
    """Why fused and split are not timed, known before either compiles; None where they may be."""
    part = training.partition
    budget = budget_of(part)
    if budget is not None and (part.step_peak.split is None or part.step_peak.split > budget):
        return "the split programs' peak is over memory_budget"
    if getattr(training.programs, "donated_leaves", ()):
        return "not timed: the step donates its inputs"
    if C.jaxpr_of(part.forward).effects or C.jaxpr_of(part.backward).effects:
        return "not timed: the step has effects, which each timed call would repeat"
    return None


def _split_ahead(training: SplitRunner) -> bool:
    """Whether the first call's choice will compile the split programs on an accelerator (:func:`_untimed` and
    the platform read before compiling), so their compiles begin beside the fused step's."""
    return (speculates(training.options.fw_compiler, training.programs.in_avals, TIME_CHOICE_PLATFORMS)
            and training.options.bw_compiler is training.options.fw_compiler
            and _untimed(training) is None)


def fused_choice(training: SplitRunner, value_leaf: int = 0, leaves: list | None = None,
                 tune: Callable[[Any, Any, set], bool] | None = None) -> FusedChoice:
    """The signature's :class:`FusedChoice` for this gradient mask and loss, decided on first use.

    Compiles the fused step if it is not yet. With a byte budget the fused step overshoots and the split
    programs fit, the split step runs. Else, given the call's ``leaves``, the two are timed where
    :func:`_timed_choice` times them; without ``leaves`` (``lower(...).compile()``) an undecided choice
    (``runs=None``) is returned and the first call decides. Deciding drops the loser's executables.
    ``tune(weighing, program, before)``: given with a call's ``leaves`` and without a byte budget, where the
    variants compile on workers, it is offered the variants' :class:`~jaxaot._src.fusion.variants.Weighing`,
    the step's base program and the executables compiled before the split pair; where it takes them (returns
    True, holding them in ``p.tunings[name]``), the step is returned once it compiles, undecided, and the calls
    that follow decide.
    """
    p = training.programs
    name = fused_name(training, value_leaf)
    known = p.fused_choices.get(name)
    if known is not None and (known.runs is not None or leaves is None or name in p.tunings):
        return known
    recalled, program = (None, None) if name in p.executables else recall(
        training, value_leaf, layout_choice_platforms() | TIME_CHOICE_PLATFORMS)
    if recalled is not None and recalled.runs == "split":  # the split pair runs: the fused step is not compiled
        v, why = recalled.variant, f"{recalled.why} (recalled from the persistent cache)"
        p.fused_choices[name] = FusedChoice(name, v.layouts, v.order, v.barrier, described(training, v.rederived),
                                            "split", why)
        return p.fused_choices[name]
    ahead = (training.start_split_compiles if leaves is not None and recalled is None and _split_ahead(training)
             else None)
    later = None
    if tune is not None and leaves is not None and recalled is None and (
            budget_of(training.partition) is None):
        def later(weighing: Any) -> bool:
            return tune(weighing, program, set(p.executables))
    try:
        exe = fused_exe(training, value_leaf, meanwhile=ahead,
                        variant=recalled.variant if recalled is not None else None, program=program, later=later)
        if name in p.tunings:  # decided over the calls that follow, the split programs' compiles going on
            return settle(training, value_leaf, exe, (None, "weighed over the calls that follow the first"), None,
                          set(p.executables))
        before = set(p.executables)
        chosen = budget_choice(training.partition.step_peak, compiled_peak(exe))
        if chosen is None and recalled is not None:
            chosen = recalled.runs, f"{recalled.why} (recalled from the persistent cache)"
        if chosen is None and leaves is not None:
            chosen = _timed_choice(training, exe, leaves, value_leaf)
    finally:
        if name not in p.tunings:
            training.drop_split_compiles()
    return settle(training, value_leaf, exe, chosen, program if recalled is None else None, before)


def settle(training: SplitRunner, value_leaf: int, exe: Any, chosen: tuple[str, str] | None, program: Any,
           before: set) -> FusedChoice:
    """Record the fused step ``exe``'s choice (``chosen``: ``(runs, why)``, ``runs`` None or ``chosen`` None:
    undecided), kept in the persistent cache where ``program`` (its base program) is given, and drop the loser's
    executables (of the split pair, those not in ``before``)."""
    p = training.programs
    name = fused_name(training, value_leaf)
    runs, why = chosen if chosen is not None else (None, "")
    if runs is not None:
        remember(training, value_leaf, program, exe, runs, why)
    v = exe.variant
    choice = p.fused_choices[name] = FusedChoice(name, v.layouts, v.order, v.barrier, exe.rederived, runs, why)
    if runs == "split":
        training.drop_executables({name})
    elif runs == "fused":
        training.drop_executables(set(p.executables) - before)  # the split programs compiled for the timing alone
    return choice


def is_decided(programs: Any, name: str) -> bool:
    """Whether the fused step ``name`` of a signature's ``programs`` has its choice (no lock needed to run it)."""
    choice = programs.fused_choices.get(name)
    return choice is not None and choice.runs is not None


def fused_outputs(training: SplitRunner, exe: Any, leaves: list) -> tuple[list, list]:
    """``(the function's outputs, grads)`` of one call of the fused executable ``exe``."""
    p = training.programs
    outs = exe(*leaves)
    n = len(p.computed_outputs)
    return p.splice(leaves, outs[:n]), list(outs[n:])
