"""Which variant of the fused step to keep: each compiled, the one with the lowest compiled peak memory kept.

The options of :func:`fused_program` (the partition's step program) each help on some
models and cost on others, and only XLA's compiled program tells which. On an
accelerator :func:`fused_exe` compiles the step, then each variant in turn (pinned
layouts, consume-first order, no barrier, reductions derived again), keeping one
by compiled peak, never one over a byte ``memory_budget``. Under a byte budget the
step is the search's, which already fits with pinned layouts, and only the barrier,
which may also speed it up, is weighed. On CPU, whose layouts are row-major anyway,
the step compiles once.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Generator

import jax

from jaxaot._src import progress as _progress
from jaxaot._src.fusion.interface import TrainingLike
from jaxaot._src.fusion.prefetch import Prefetch, Variant, speculates
from jaxaot._src.partition import (
    barred_residuals, budget_of, compiled_peak, default_partition, layout_choice_platforms, measured_executables,
    measured_layouts, ordered_eqns, rederive_backward, step_program)


def fused_program(training: TrainingLike, value_leaf: int = 0, barrier: str = "all", layouts: str = "auto",
                  order: str = "xla", slices: bool = True, rederive: bool = False) -> Any:
    """:func:`~jaxaot._src.partition.step.step_program` of one gradient mask's programs (``training``): its
    partition, inputs and computed outputs, the loss at ``value_leaf``, the gradients where the placement
    pins them, and the variant's options."""
    p = training.programs
    pins = [p.out_shardings[i] for i in p.computed_outputs]
    return step_program(training.partition, p.in_avals, training.out_avals, computed_outputs=p.computed_outputs,
                        value_leaf=value_leaf, grad_pins=training.placement.grad_pins(),
                        out_pins=pins if any(s is not None for s in pins) else None, barrier=barrier,
                        layouts=layouts, order=order, slices=slices, rederive=rederive)


def default_barrier(training: TrainingLike) -> str:
    """``"recomputed"`` for the default partition, else ``"all"``.

    The default partition saves what ``jax.vjp`` saves and recomputes only
    constants; behind a full barrier its residuals cost step time and peak
    memory that ``"recomputed"`` does not. For other partitions, letting XLA
    see the residuals the recomputation does not read ran slower, so every one
    passes the barrier.
    """
    return "recomputed" if training.options.partition_fn is default_partition else "all"


def base_variant(training: TrainingLike) -> Variant:
    """The variant the chain compiles first, and the persistent cache keys its choice by: the default barrier,
    in XLA's own layouts, or under a byte budget in those the search measured the step with (the executable
    the runtime takes from it)."""
    budgeted = budget_of(training.partition) is not None
    return Variant(default_barrier(training), measured_layouts(training.programs.in_avals) if budgeted else "auto")


#: How much more peak memory the row-major step may need and still be chosen (see :func:`choose_layouts`).
LAYOUT_PEAK_SLACK = 0.005


def choose_layouts(auto_peak: int | None, pinned_peak: int | None) -> str:
    """``"pinned"`` unless pinning the residuals' layouts costs more than
    :data:`LAYOUT_PEAK_SLACK` of XLA's own choice in peak memory (or a peak is unknown): ``"auto"``.

    Inside one program XLA picks the residuals' layouts for forward and backward together, and on
    some models pays for its choice in transpose kernels the split executables do not run. Where
    XLA's layouts serve a consumer (an MoE's dispatch einsums) pinning costs a transposed copy,
    which shows as peak memory, so that case keeps XLA's choice (``docs/concepts/fused_step.md``,
    "Residual layouts").

    Example:
        >>> from jaxaot._src.fusion import choose_layouts
        >>> choose_layouts(1000, 1004), choose_layouts(1000, 1100), choose_layouts(None, 10)
        ('pinned', 'auto', 'auto')
    """
    if auto_peak is None or pinned_peak is None:
        return "auto"
    return "pinned" if pinned_peak <= auto_peak * (1 + LAYOUT_PEAK_SLACK) else "auto"


def platform_of(exe: Any) -> str | None:
    """The platform (``"cpu"``, ``"gpu"``, ...) of a compiled executable's devices, or None if unknown."""
    shardings = jax.tree.leaves(getattr(exe, "input_shardings", None))
    devices = next(iter(shardings)).device_set if shardings else set()
    return next(iter(devices)).platform if devices else None


#: How much lower the consume-first step's compiled peak must be to be chosen (see :func:`choose_order`).
ORDER_PEAK_GAIN = 0.01


def choose_order(xla_peak: int | None, ordered_peak: int | None) -> str:
    """``"consume_first"`` when that backward order (:mod:`jaxaot._src.partition.step.ordering`) lowers the
    compiled peak by more than :data:`ORDER_PEAK_GAIN`, else ``"xla"``.

    The order costs one more read of the residuals it sequences, so it is kept only where
    XLA's own order (a recomputed matmul operand merged into a later kernel) raised the peak.

    Example:
        >>> from jaxaot._src.fusion import choose_order
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
    the barrier buys nothing and costs the fusions it forbids (``docs/concepts/fused_step.md``,
    "The barrier, weighed").

    Example:
        >>> from jaxaot._src.fusion import choose_barrier
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
    (:mod:`jaxaot._src.partition.step.rederive`): when its compiled peak is lower by more than
    :data:`REDERIVE_PEAK_GAIN`.

    Deriving a max again is one more pass over a value the backward recomputes anyway, free where
    XLA fuses it into that value's readers and a read where it does not; kept only for memory, as
    it lowers the peak on some blocks and raises it on others (``docs/concepts/fused_step.md``,
    "Reductions derived again").

    Example:
        >>> from jaxaot._src.fusion import choose_rederive
        >>> choose_rederive(1000, 980), choose_rederive(1000, 998), choose_rederive(None, 10)
        (True, False, False)
    """
    if peak is None or rederived_peak is None:
        return False
    return rederived_peak < peak * (1 - REDERIVE_PEAK_GAIN)


def variant_program(training: TrainingLike, value_leaf: int, v: Variant) -> Any:
    """:func:`fused_program` of the options of ``v``: the one place a variant becomes a program, so the chain's
    compiles and the persistent cache's key (:mod:`~jaxaot._src.fusion.recalled`) are the same program."""
    return fused_program(training, value_leaf, barrier=v.barrier, layouts=v.layouts, order=v.order,
                         slices=v.slices, rederive=bool(v.rederived))


def _compile_variant(training: TrainingLike, name: str, value_leaf: int, v: Variant, returned: set,
                     prefetch: Prefetch | None = None) -> Generator[Any, None, Any]:
    """The step of variant ``v`` compiled (carrying ``v`` as its ``variant`` and the residuals it derives again,
    described, as ``rederived``), or None where the backend refuses it: a generator that yields its compile's
    future while that runs on a worker (begun with ``prefetch``, where there is one) and returns the executable."""
    p = training.programs
    key = f"{name}:{v.layouts}:{v.order}:{v.barrier}:{len(v.rederived)}:{v.slices}"
    _progress.step("compiling fused variant", total=4, key=name, owner=p,
                   detail=f"{v.layouts} layouts, {v.order} order, barrier {v.barrier}"
                   + ", rederived" * bool(v.rederived))
    program, pending = None, None
    if prefetch is not None:
        prefetch.begin([v])
        program, pending = prefetch.take(v)
    if pending is not None and not pending.done():
        yield pending
    try:
        exe = p.compile(key, training.options.fw_compiler,
                        program if program is not None else variant_program(training, value_leaf, v),
                        p.in_avals, aliased=returned, pending=pending)
    except Exception:  # noqa: BLE001  (a layout this backend cannot pin: keep XLA's choice)
        return None
    finally:
        p.executables.pop(key, None)
    exe.variant, exe.rederived = v, described(training, v.rederived)
    return exe


def described(training: TrainingLike, rederived: tuple[int, ...]) -> tuple[str, ...]:
    """The residuals at positions ``rederived`` as ``lower()``'s residual table describes them."""
    return tuple(str(training.partition.residuals[k]) for k in rederived)


def _weighed(part: Any, base: Variant, budgeted: bool = False) -> tuple[bool, bool, bool, tuple[int, ...]]:
    """Which variants the chain weighs against ``base``: pinned layouts (unless ``base`` has them), the
    consume-first order, no barrier, and the residual positions derived again (empty: none). Under a byte
    budget (``budgeted``) the step already fits it, so the two that only lower the peak, at a cost in step
    time (the order, reductions derived again), are not weighed: their compiles would lengthen the first step
    for memory the budget does not ask for."""
    peaky = part.recomputed and not budgeted
    ordered = bool(peaky and ordered_eqns(part.backward, len(part.cotangent_outputs)))
    rederived = rederive_backward(part, len(part.cotangent_outputs)).rederived if peaky else ()
    return base.layouts != "pinned", ordered, bool(barred_residuals(part, base.barrier)), tuple(rederived)


def _still_weighed(kept: Variant, barrier: str, weighed: tuple, after: int) -> list[Variant]:
    """The variants the chain asks for from its step ``after`` on (0: pinned layouts, 1: order, 2: barrier,
    3: reductions derived again), ``kept`` the step kept so far, where each later comparison goes as its rule
    goes on equal peaks (:data:`_ON_EQUAL_PEAKS`): the likely way, as a variant mostly changes the peak little."""
    pinned, ordered, free, rederived = weighed
    layouts, kept_barrier, out = kept.layouts, kept.barrier, []
    if after <= 0 and pinned:
        out.append(Variant(barrier, "pinned", "xla"))
        layouts = _ON_EQUAL_PEAKS["layouts"]
    if after <= 1 and ordered:
        out.append(Variant(barrier, layouts, "consume_first"))  # the order kept shapes no later variant
    if after <= 2 and free:
        out.append(Variant("none", layouts, "xla"))
        kept_barrier = "none" if _ON_EQUAL_PEAKS["barrier"] == "none" else kept_barrier
    if after <= 3 and rederived:
        out.append(Variant(kept_barrier, layouts, "xla", rederived))
    return out


#: What the layout and barrier rules choose where the variant's peak equals the kept step's.
_ON_EQUAL_PEAKS = {"layouts": choose_layouts(1, 1), "barrier": choose_barrier("all", 1, 1)}


def fused_name(training: TrainingLike, value_leaf: int = 0) -> str:
    """The fused step's name among the signature's executables: ``"fused"`` plus the gradient mask's suffix,
    plus ``@leaf`` where the loss is not the first output."""
    return "fused" + training.name_suffix + ("" if value_leaf == 0 else f"@{value_leaf}")


def fused_exe(training: TrainingLike, value_leaf: int = 0, meanwhile: Callable[[], None] | None = None,
              variant: Variant | None = None, program: Any = None,
              later: Callable[["Weighing"], bool] | None = None) -> Any:
    """The fused step's executable for output ``value_leaf`` as the loss, compiled (through the
    persistent cache) on first use and stored in ``training.programs.executables``. Under a byte budget
    the first compile is the search's own of the chosen plan, where it measured this very program
    with the backend's own options (:func:`~jaxaot._src.compile.cached_compile`).

    On an accelerator (:func:`~jaxaot._src.partition.layout_choice_platforms`) the variants of the module
    docstring are compiled in turn, each weighed against the one kept so far, none kept over a byte budget. The
    executable's ``variant`` (its :class:`~jaxaot._src.fusion.prefetch.Variant`: layouts, order, barrier,
    residual positions derived again, slices) and ``rederived`` (those residuals, described) say which was
    kept. There the compiles are begun together on
    worker threads (:mod:`~jaxaot._src.fusion.prefetch`), the chain of choices unchanged.
    ``meanwhile()`` is called once the step's own compiles are begun, before they are waited for (the
    first call begins the split programs' compiles there). ``variant``: the one a process kept before
    (:mod:`~jaxaot._src.fusion.recalled`), compiled alone where it fits; ``program``: the step's base program,
    where the caller built it. ``later``: where given and the variants' compiles run on workers, the step
    is returned as soon as it compiles where ``later`` takes the :class:`Weighing` of its variants (returns
    True), which the calls that follow go on with (:mod:`~jaxaot._src.fusion.tuning`).
    """
    p = training.programs
    name = fused_name(training, value_leaf)
    exe = p.executables.get(name)
    if exe is None:
        returned = {i for i in p.output_is_input if i is not None}  # handed back as outputs: never donated
        compiler = training.options.fw_compiler
        prefetch = None
        if speculates(compiler, p.in_avals, layout_choice_platforms()):
            prefetch = Prefetch(functools.partial(variant_program, training, value_leaf),
                                functools.partial(p.start_compile, compiler, avals=p.in_avals, aliased=returned))
        weighing = Weighing(prefetch, lambda kept: _chain(training, name, value_leaf, returned, prefetch, meanwhile,
                                                           kept, variant, program))
        try:
            weighing.poll(wait=later is None or prefetch is None)
            if not weighing.done and not later(weighing):
                weighing.poll(wait=True)
        except BaseException:
            weighing.close()
            raise
        exe = p.executables[name] = weighing.exe
    elif meanwhile is not None:
        meanwhile()
    return exe


class Weighing:
    """A fused step's variant chain (:func:`fused_exe`), driven to its end at once or over several calls.

    ``chain(self)`` makes the chain, which writes the step it keeps to :attr:`exe` as it goes.

    Attributes:
      exe: the step kept so far; the chain's choice once :attr:`done`.
      done: whether every variant is weighed.
    """

    def __init__(self, prefetch: Prefetch | None, chain: Callable[["Weighing"], Generator[Any, None, Any]]):
        self.exe: Any = None
        self.done = False
        self._prefetch, self._pending = prefetch, None
        self._chain = chain(self)

    def poll(self, wait: bool = False) -> bool:
        """Go on with the chain while the compile it waits for has finished (every one, with ``wait``);
        whether it is :attr:`done`. The compiles nobody took are dropped when it is."""
        if self.done:
            return True
        try:
            while True:
                if self._pending is not None:
                    if not wait and not self._pending.done():
                        return False
                    self._pending.exception()  # waits; its error is raised, or passed over, where it is taken
                self._pending = self._chain.send(None)
        except StopIteration as stop:
            self.exe, self.done = stop.value, True
            self.close()
        except BaseException:
            self.done = True  # the chain ended in an error, raised here once: the step kept so far stays
            self.close()
            raise
        return True

    def close(self) -> None:
        """Drop the compiles begun that the chain did not take (waiting for running ones)."""
        self._chain.close()
        if self._prefetch is not None:
            self._prefetch.close()


def _chain(training: TrainingLike, name: str, value_leaf: int, returned: set, prefetch: Prefetch | None,
           meanwhile: Callable[[], None] | None, kept: Weighing, variant: Variant | None = None,
           program: Any = None) -> Generator[Any, None, Any]:
    """The fused step :func:`fused_exe` keeps: compiled, then weighed against each variant in turn (``variant``:
    the one kept before, alone where it fits). A generator: it yields each compile's future it waits for
    (``kept.exe``: the step kept meanwhile) and returns the step kept."""
    p, part = training.programs, training.partition
    base = base_variant(training)
    barrier, budget = base.barrier, budget_of(part)

    def fits(v: Any) -> bool:
        peak = compiled_peak(v) if v is not None else None
        return v is not None and (budget is None or peak is None or peak <= budget)

    if variant is not None and variant != base:
        recalled = yield from _compile_variant(training, name, value_leaf, variant, returned)
        if fits(recalled):
            if program is not None:  # a byte budget's measurement of the base step, which this step does not take
                measured_executables.release([program])
            return recalled
    # The step compiles alone first: its GEMMs autotune once, on an idle device, and the variants' and split
    # programs' compiles, begun together after it, find them tuned (begun together from the start, each
    # autotuned the same GEMMs beside the others, and the whole took longer than compiling in turn).
    exe = kept.exe = p.compile(name, training.options.fw_compiler,
                               program if program is not None else variant_program(training, value_leaf, base),
                               p.in_avals, aliased=returned)
    exe.variant, exe.rederived = base, ()
    if variant is not None and fits(exe):
        return exe  # the base step, kept before
    choosing = platform_of(exe) in layout_choice_platforms()
    weighed = _weighed(part, base, budget is not None) if choosing else None
    if prefetch is not None and choosing:
        prefetch.begin(_still_weighed(base, barrier, weighed, 0))
    if meanwhile is not None:
        meanwhile()

    if choosing:
        weigh = functools.partial(_compile_variant, training, name, value_leaf, returned=returned, prefetch=prefetch)

        def ahead(step: int) -> None:  # where a choice went another way, the later variants it now asks for
            if prefetch is not None:
                prefetch.begin(_still_weighed(exe.variant, barrier, weighed, step))

        if weighed[0]:
            pinned = yield from weigh(Variant(barrier, "pinned"))
            if fits(pinned) and choose_layouts(compiled_peak(exe), compiled_peak(pinned)) == "pinned":
                exe = kept.exe = pinned
        if weighed[1]:
            ahead(1)
            ordered = yield from weigh(Variant(barrier, exe.variant.layouts, "consume_first"))
            if fits(ordered) and choose_order(compiled_peak(exe), compiled_peak(ordered)) != "xla":
                exe = kept.exe = ordered
        if weighed[2]:
            ahead(2)
            free = yield from weigh(Variant("none", exe.variant.layouts))
            if fits(free) and choose_barrier(barrier, compiled_peak(exe), compiled_peak(free)) == "none":
                exe = kept.exe = free
        if weighed[3]:
            ahead(3)
            lean = yield from weigh(Variant(exe.variant.barrier, exe.variant.layouts, rederived=weighed[3]))
            if fits(lean) and choose_rederive(compiled_peak(exe), compiled_peak(lean)):
                exe = kept.exe = lean
    if not fits(exe):
        # Over the budget: the step without residual slices, in XLA's own layouts and order.
        planned = yield from _compile_variant(training, name, value_leaf, Variant(barrier, slices=False), returned)
        if fits(planned):
            exe = kept.exe = planned
    return exe
