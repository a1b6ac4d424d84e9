"""Which variant of the fused step to keep: each compiled, the one with the lowest compiled peak memory kept.

The options of :func:`~jaxaot.fusion.program.fused_program` (residual layouts,
backward order, barrier, reductions derived again) each help on some models and
cost on others, and which one is decided only by XLA's compiled program. So on
an accelerator (:data:`LAYOUT_CHOICE_PLATFORMS`), :func:`fused_exe` compiles
the step with XLA's layouts, then in turn:

1. with the residuals' layouts pinned, kept by :func:`choose_layouts` unless
   its peak is above XLA's choice by more than :data:`LAYOUT_PEAK_SLACK`;
2. where the backward reads a recomputed matmul operand, in the consume-first
   order (:mod:`jaxaot.fusion.ordering`), kept by :func:`choose_order` when it
   lowers the peak by more than :data:`ORDER_PEAK_GAIN`;
3. where the plan recomputes, without the barrier, kept by
   :func:`choose_barrier` when its peak is no higher: the barrier exists for
   memory, and where XLA's own schedule needs no more it only forbids fusions;
4. where the backward can derive a saved reduction again
   (:mod:`jaxaot.fusion.rederive`), doing so, kept by :func:`choose_rederive`
   when it lowers the peak by more than :data:`REDERIVE_PEAK_GAIN`.

The rules weigh peak memory only (:func:`compiled_peak`): step times of two
compiles of one program differ by up to 1.6% on an H100, about as much as the
variants move them, while the peaks they trade are deterministic. Under a byte
``memory_budget`` (the partition's ``step_peak``) no variant over the budget is
kept, and where the step is over the budget (the variants above change the
program the planner measured) the planned program itself, without residual
slices, is compiled and kept if it fits.

Whether the fused step runs at all is decided by peak and by time
(:func:`choose_step`): where its compiled peak is over a byte budget that the
split programs fit, or where, timed on the first call (an accelerator, or any
backend with :data:`step_timer` set), it runs more than :data:`STEP_TIME_SLACK`
times the split executables of the same plan, :func:`run_fused` runs the split
forward and backward instead. The split step is timed only where its
programs' compiled peak is at most the fused step's (and a byte budget's), so
timing never raises the process's peak above the step's own, and inputs a call
donates or effects it would repeat are never timed. The executable's ``runs``
(``"fused"`` or ``"split"``) and ``why`` attributes say which and why. What each
rule gained and cost on the zoo's models is in ``docs/concepts/fused_step.md``.
The executable's ``layouts``, ``order``, ``barrier`` and ``rederived``
attributes say which variant was kept (the runtime reports them as
``FusedChoice``). On CPU, whose layouts are row-major anyway, the step compiles
once.

Cost: one compilation per signature, up to five on an accelerator, and there
the two split executables for the timing, whose ``STEP_TIME_ROUNDS`` interleaved
calls of each step run once, on the first call. Functions with a ``jaxaot.while_loop`` whose stack the runtime sizes
keep the split executables: the runtime checks the loop's trip count between
the two.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Protocol, Sequence

import jax

from jaxaot import _compat as C
from jaxaot import _progress
from jaxaot.fusion.interface import TrainingLike
from jaxaot.fusion.ordering import ordered_eqns
from jaxaot.fusion.program import barred_residuals, fused_program
from jaxaot.fusion.rederive import rederive_backward
from jaxaot.partition import compiled_peak, default_partition


def default_barrier(training: TrainingLike) -> str:
    """``"recomputed"`` for the default partition, else ``"all"``.

    The default partition saves what ``jax.vjp`` saves and recomputes only
    constants; behind a full barrier its residuals measured 1.19x
    ``jit(value_and_grad)``'s step time and 1.35x its peak on an H200 Llama
    block, against 1.04x and 1.00x with ``"recomputed"``. For other partitions,
    letting XLA see the residuals the recomputation does not read measured worse
    (1.039x against 1.010x on the same block), so every one passes the barrier.
    """
    return "recomputed" if training.options.partition_fn is default_partition else "all"


#: Backends whose layout assignment can differ from row-major inside one program (CPU's does not).
LAYOUT_CHOICE_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})
#: How much more peak memory the row-major step may need and still be chosen (see :func:`choose_layouts`).
LAYOUT_PEAK_SLACK = 0.005


def choose_layouts(auto_peak: int | None, pinned_peak: int | None) -> str:
    """``"pinned"`` unless pinning the residuals' layouts costs more than
    :data:`LAYOUT_PEAK_SLACK` of XLA's own choice in peak memory (or a peak is unknown): ``"auto"``.

    Inside one program XLA picks the residuals' layouts for forward and backward together. On an
    H200 ViT block it picked batch-minor layouts for the residual stream and paid nine more
    transpose kernels than the two split executables (fused min-cut 1.075x ``jit(value_and_grad)``,
    pinned 0.953x, peak 0.97x); on the Llama block 1.056x against 0.953x at equal peak. Where XLA's
    layouts serve a consumer (the MoE's dispatch einsums) pinning costs a transposed copy, which
    shows as peak memory (1.14x there), so that case keeps XLA's choice
    (``docs/concepts/fused_step.md``, "Residual layouts").

    Example:
        >>> from jaxaot.fusion import choose_layouts
        >>> choose_layouts(1000, 1004), choose_layouts(1000, 1100), choose_layouts(None, 10)
        ('pinned', 'auto', 'auto')
    """
    if auto_peak is None or pinned_peak is None:
        return "auto"
    return "pinned" if pinned_peak <= auto_peak * (1 + LAYOUT_PEAK_SLACK) else "auto"


def _platform(exe: Any) -> str | None:
    shardings = jax.tree.leaves(getattr(exe, "input_shardings", None))
    devices = next(iter(shardings)).device_set if shardings else set()
    return next(iter(devices)).platform if devices else None


#: How much lower the consume-first step's compiled peak must be to be chosen (see :func:`choose_order`).
ORDER_PEAK_GAIN = 0.01


def choose_order(xla_peak: int | None, ordered_peak: int | None) -> str:
    """``"consume_first"`` when that backward order (:mod:`jaxaot.fusion.ordering`) lowers the
    compiled peak by more than :data:`ORDER_PEAK_GAIN`, else ``"xla"``.

    The order costs one more read of the residuals it sequences, so it is kept only where
    XLA's own order (a recomputed matmul operand merged into a later kernel) raised the peak.

    Example:
        >>> from jaxaot.fusion import choose_order
        >>> choose_order(1000, 995), choose_order(1000, 900), choose_order(None, 10)
        ('xla', 'consume_first', 'xla')
    """
    if xla_peak is None or ordered_peak is None:
        return "xla"
    return "consume_first" if ordered_peak < xla_peak * (1 - ORDER_PEAK_GAIN) else "xla"


def choose_barrier(barrier: str, barriered_peak: int | None, free_peak: int | None) -> str:
    """``"none"`` when the step without the optimization barrier compiles to a peak no higher than
    with it, else ``barrier``.

    The barrier is there so that XLA keeps no more than the plan saves. Where XLA's own schedule of
    the same step, free to merge recomputation with the forward, needs no more memory at its peak,
    the barrier buys nothing and costs the fusions it forbids: on an H100 ConvNet with batch norm the
    barriered min-cut step ran 1.045x ``jit(value_and_grad)`` at 1.055x its peak, the free one ran as
    ``jit(value_and_grad)`` (``docs/concepts/fused_step.md``, "The barrier, weighed").

    Example:
        >>> from jaxaot.fusion import choose_barrier
        >>> choose_barrier("all", 1000, 950), choose_barrier("all", 1000, 1001), choose_barrier("all", None, 5)
        ('none', 'all', 'all')
    """
    if barriered_peak is None or free_peak is None:
        return barrier
    return "none" if free_peak <= barriered_peak else barrier


#: How much lower the compiled peak must be for the step that derives reductions again (see
#: :func:`choose_rederive`).
REDERIVE_PEAK_GAIN = 0.005


def choose_rederive(peak: int | None, rederived_peak: int | None) -> bool:
    """Whether to keep the step whose backward derives order-free reductions again
    (:mod:`jaxaot.fusion.rederive`): when its compiled peak is lower by more than
    :data:`REDERIVE_PEAK_GAIN`.

    Deriving a max again is one more pass over a value the backward recomputes anyway, free where
    XLA fuses it into that value's readers and a read where it does not; kept only for memory. On
    an H100 16-head GPT-2 block the peak fell from 1.001x to 0.983x ``dots_saveable``'s, and the
    2-head block's rose 1.060x (``docs/concepts/fused_step.md``, "Reductions derived again").

    Example:
        >>> from jaxaot.fusion import choose_rederive
        >>> choose_rederive(1000, 980), choose_rederive(1000, 998), choose_rederive(None, 10)
        (True, False, False)
    """
    if peak is None or rederived_peak is None:
        return False
    return rederived_peak < peak * (1 - REDERIVE_PEAK_GAIN)


def _compile_variant(training: TrainingLike, name: str, value_leaf: int, barrier: str, returned: set,
                     layouts: str, order: str, rederived: tuple[int, ...] = (), slices: bool = True) -> Any:
    """The step compiled with this ``barrier``, ``layouts``, ``order``, residual positions
    ``rederived`` (which it carries as attributes, the last as the residuals' descriptions) and
    ``slices``, or None where the backend refuses it."""
    p = training.programs
    key = f"{name}:{layouts}:{order}:{barrier}:{len(rederived)}:{slices}"
    _progress.step("compiling fused variant", total=4, key=name, owner=p,
                   detail=f"{layouts} layouts, {order} order, barrier {barrier}" + ", rederived" * bool(rederived))
    try:
        exe = p.compile(key, training.options.fw_compiler,
                        fused_program(training, value_leaf, barrier=barrier, layouts=layouts, order=order,
                                      slices=slices, rederive=bool(rederived)),
                        p.in_avals, aliased=returned)
    except Exception:  # noqa: BLE001  (a layout this backend cannot pin: keep XLA's choice)
        return None
    finally:
        p.executables.pop(key, None)
    exe.layouts, exe.order, exe.barrier = layouts, order, barrier
    exe.rederived = tuple(str(training.partition.residuals[k]) for k in rederived)
    return exe


def fused_exe(training: TrainingLike, value_leaf: int = 0) -> Any:
    """The fused step's executable for output ``value_leaf`` as the loss, compiled (through the
    persistent cache) on first use and stored in ``training.programs.executables``.

    On an accelerator (:data:`LAYOUT_CHOICE_PLATFORMS`) the variants of the module docstring are
    compiled in turn, each weighed against the one kept so far, none kept over a byte budget. The
    executable's ``layouts`` (``"auto"`` or ``"pinned"``), ``order`` (``"xla"`` or
    ``"consume_first"``), ``barrier`` (``"all"``, ``"recomputed"`` or ``"none"``) and ``rederived``
    (the residuals derived again) attributes say which was kept; ``runs`` is ``"split"`` (and
    ``why`` says so) where its peak is over the budget and the split programs' is not
    (:func:`budget_choice`), else None until :func:`run_fused` times it.
    """
    p = training.programs
    name = "fused" + training.name_suffix + ("" if value_leaf == 0 else f"@{value_leaf}")
    exe = p.executables.get(name)
    if exe is None:
        returned = {i for i in p.output_is_input if i is not None}  # handed back as outputs: never donated
        barrier, part = default_barrier(training), training.partition
        exe = p.compile(name, training.options.fw_compiler, fused_program(training, value_leaf, barrier=barrier),
                        p.in_avals, aliased=returned)
        exe.layouts, exe.order, exe.barrier, exe.rederived = "auto", "xla", barrier, ()
        budget = getattr(part.step_peak, "budget", None)

        def fits(v: Any) -> bool:
            peak = compiled_peak(v) if v is not None else None
            return v is not None and (budget is None or peak is None or peak <= budget)

        if _platform(exe) in LAYOUT_CHOICE_PLATFORMS:
            variant = functools.partial(_compile_variant, training, name, value_leaf, returned=returned)
            pinned = variant(barrier, layouts="pinned", order="xla")
            if fits(pinned) and choose_layouts(compiled_peak(exe), compiled_peak(pinned)) == "pinned":
                exe = pinned
            if part.recomputed and ordered_eqns(part.backward, len(part.cotangent_outputs)):
                ordered = variant(barrier, layouts=exe.layouts, order="consume_first")
                if fits(ordered) and choose_order(compiled_peak(exe), compiled_peak(ordered)) != "xla":
                    exe = ordered
            if barred_residuals(part, barrier):
                free = variant("none", layouts=exe.layouts, order="xla")
                if fits(free) and choose_barrier(barrier, compiled_peak(exe), compiled_peak(free)) == "none":
                    exe = free
            rederived = rederive_backward(part, len(part.cotangent_outputs)).rederived if part.recomputed else ()
            if rederived:
                lean = variant(exe.barrier, layouts=exe.layouts, order="xla", rederived=rederived)
                if fits(lean) and choose_rederive(compiled_peak(exe), compiled_peak(lean)):
                    exe = lean
        if not fits(exe):
            # Over the budget: the program the planner measured (no residual slices, XLA's layouts and order).
            planned = _compile_variant(training, name, value_leaf, barrier, returned, "auto", "xla", slices=False)
            if fits(planned):
                exe = planned
        exe.runs, exe.why = None, ""
        chosen = budget_choice(part.step_peak, compiled_peak(exe))
        if chosen is not None:
            exe.runs, exe.why = chosen
        p.executables[name] = exe
    return exe


def budget_choice(step_peak: Any, fused_peak: int | None) -> tuple[str, str] | None:
    """``("split", why)`` where the fused step's compiled peak is over the plan's byte budget and the split
    programs' is not (:class:`~jaxaot.partition.StepPeak`), else None (the fused step may run).

    Example:
        >>> from jaxaot.fusion import budget_choice
        >>> from jaxaot.partition import StepPeak
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


# --------------------------------------------------------------------------- fused or split, by time
#: How much slower than the split executables of the same plan the fused step may time and still run.
STEP_TIME_SLACK = 1.02
#: Interleaved timed calls of each (after one untimed call of each), on the first call of a signature.
STEP_TIME_ROUNDS = 5
#: Backends where the fused/split choice is timed without a :data:`step_timer` (CPU timing is noise).
TIME_CHOICE_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})
#: The timer of :func:`run_fused`'s choice: ``step_timer(which, run) -> seconds`` of one blocked call of
#: ``run`` (``which``: ``"fused"`` or ``"split"``). None: wall-clock time on accelerators, and no timing on
#: CPU, where timing is noise. Tests set it to drive the choice.
step_timer: Callable[[str, Callable[[], Any]], float] | None = None


def choose_step(fused_seconds: Sequence[float], split_seconds: Sequence[float],
                slack: float = STEP_TIME_SLACK) -> tuple[str, str]:
    """``("fused" or "split", why)``: the fused step unless its median time is more than ``slack`` times the
    split executables' (the same plan, the same inputs).

    Example:
        >>> from jaxaot.fusion import choose_step
        >>> choose_step([1.0, 1.01, 1.0], [1.0, 0.99, 1.0])[0], choose_step([1.1, 1.1], [1.0, 1.0])[0]
        ('fused', 'split')
    """
    fused, split = statistics.median(fused_seconds), statistics.median(split_seconds)
    ratio = fused / split if split > 0 else 1.0
    if ratio <= slack:
        return "fused", f"timed at {ratio:.3f}x the split executables"
    return "split", f"the fused step timed {ratio:.3f}x the split executables (more than {slack}x)"


class SplitRunner(TrainingLike, Protocol):
    """What the split step needs of the runtime's training programs besides :class:`TrainingLike`."""

    def forward(self, leaves: Sequence[Any], concrete: bool | None = None) -> tuple[list, list]: ...

    def backward(self, residuals: Sequence[Any], cts: Sequence[Any], concrete_residuals: bool = False) -> list: ...

    def unit_cotangents(self, leaf: int) -> list: ...

    @property
    def forward_exe(self) -> Any: ...

    @property
    def backward_exe(self) -> Any: ...


def run_split(training: SplitRunner, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(outputs, grads)`` from the split forward and backward executables of the same plan."""
    outs, residuals = training.forward(leaves, concrete=True)
    return outs, training.backward(residuals, training.unit_cotangents(value_leaf), concrete_residuals=True)


def _wall_seconds(which: str, run: Callable[[], Any]) -> float:
    del which
    t = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - t


def _timed_choice(training: SplitRunner, exe: Any, leaves: list, value_leaf: int) -> tuple[str, str]:
    """The fused step or the split one, by time (:func:`choose_step`), or why they are not timed."""
    timer = step_timer
    if timer is None:
        if _platform(exe) not in TIME_CHOICE_PLATFORMS:
            return "fused", "not timed: on CPU step times are noise"
        timer = _wall_seconds
    part = training.partition
    budget = getattr(part.step_peak, "budget", None)
    if budget is not None and (part.step_peak.split is None or part.step_peak.split > budget):
        return "fused", "the split programs' peak is over memory_budget"
    if getattr(training.programs, "donated_leaves", ()):
        return "fused", "not timed: the step donates its inputs"
    if C.jaxpr_of(training.joint.jaxpr).effects:
        return "fused", "not timed: the step has effects, which each timed call would repeat"
    split_peaks = [compiled_peak(training.forward_exe), compiled_peak(training.backward_exe)]
    fused_peak = compiled_peak(exe)
    if None not in split_peaks and fused_peak is not None and max(split_peaks) > fused_peak:
        # Timing it would raise the process's peak above the step's; running it would raise the step's.
        return "fused", f"not timed: the split programs peak higher ({max(split_peaks)} bytes, fused {fused_peak})"
    runs = {"fused": lambda: exe(*leaves), "split": lambda: run_split(training, leaves, value_leaf)}
    for run in runs.values():
        jax.block_until_ready(run())  # compiles the split executables; warms both
    times: dict[str, list[float]] = {"fused": [], "split": []}
    for _ in range(STEP_TIME_ROUNDS):
        for which, run in runs.items():
            times[which].append(timer(which, run))
    return choose_step(times["fused"], times["split"])


def run_fused(training: SplitRunner, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(the function's outputs, grads of the differentiated inputs)`` from one fused call, or from the
    split executables where the fused step cannot win (:func:`budget_choice`, :func:`choose_step`: decided
    on the first call and kept in the executable's ``runs`` and ``why``)."""
    p = training.programs
    exe = fused_exe(training, value_leaf)
    if getattr(exe, "runs", None) is None:
        exe.runs, exe.why = _timed_choice(training, exe, leaves, value_leaf)
    if exe.runs == "split":
        return run_split(training, leaves, value_leaf)
    outs = exe(*leaves)
    n = len(p.computed_outputs)
    return p.splice(leaves, outs[:n]), list(outs[n:])
