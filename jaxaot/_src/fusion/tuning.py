"""A fused step weighed over the calls that follow its first, while its variants compile on workers.

On an accelerator the variants of :mod:`~jaxaot._src.fusion.variants` and the split
programs each compile for seconds after the step's own compile. With
``jaxaot.config.tune_in_background`` the first call runs the step once it compiles and
leaves those compiles on worker threads. Each later call takes the compiles that
finished and makes the chain's choices with them (the same choices, in the same order),
running the step kept so far; then the calls that follow run fused and split in turn (each first in
every other round), timed until :func:`~jaxaot._src.fusion.timing_settled`, and
:func:`~jaxaot._src.fusion.choose_step` decides. Under a byte budget, or where the device lacks room for an
autotuning compile beside the running step, the first call decides.
"""

from __future__ import annotations

from typing import Any

from jaxaot._src.config import config
from jaxaot._src.fusion.step_choice import (
    FusedChoice, SplitRunner, budget_choice, choose_step, free_device_bytes, fused_choice, fused_outputs, run_split,
    settle, timed, timing_order, timing_refused, timing_settled)
from jaxaot._src.fusion.variants import Weighing, fused_exe, fused_name, platform_of
from jaxaot._src.partition import compiled_peak
from jaxaot._src.partition.costs import compile_bytes

#: The first calls that run the two steps once both are compiled, untimed; the rest are timed in rounds of one
#: call of each (:func:`~jaxaot._src.fusion.step_choice.timing_order`) until
#: :func:`~jaxaot._src.fusion.timing_settled`.
_UNTIMED = ("fused", "split")


class Tuning:
    """One fused step's choices, made over the calls that follow its first (see the module docstring).

    Attributes:
      weighing: the variant chain, going on as its compiles finish.
      calls: the calls run since the chain and the split programs were ready (timed ones included).
    """

    def __init__(self, training: SplitRunner, value_leaf: int, weighing: Weighing, program: Any, before: set):
        self.training, self.value_leaf, self.weighing = training, value_leaf, weighing
        self.name = fused_name(training, value_leaf)
        self._program, self._before = program, before
        self._times: dict[str, list[float]] = {"fused": [], "split": []}
        self._timing = False
        self.calls = 0

    def run(self, leaves: list) -> tuple[list, list]:
        """This call's ``(outputs, grads)``, from the step kept so far, or from the fused or split step timed;
        the choice is made, and this tuning ends, where the last of them is in."""
        tr, exe = self.training, self.weighing.exe
        if not self.weighing.poll():
            return fused_outputs(tr, exe, leaves)
        exe = tr.programs.executables[self.name] = self.weighing.exe
        if not self._timing:
            if not tr.split_begun.ready():
                return fused_outputs(tr, exe, leaves)  # the split programs still compile
            chosen = budget_choice(tr.partition.step_peak, compiled_peak(exe)) or timing_refused(tr, exe)
            if chosen is not None:
                return run_decided(tr, self._settle(chosen), leaves, self.value_leaf)
            self._timing = True
        k = self.calls - len(_UNTIMED)  # the timed call's number
        untimed = k < 0
        which = _UNTIMED[self.calls] if untimed else timing_order(k // 2)[k % 2]
        run = (lambda: fused_outputs(tr, exe, leaves)) if which == "fused" else (
            lambda: run_split(tr, leaves, self.value_leaf))
        if untimed:
            out = run()
        else:
            seconds, out = timed(which, run, leaves)
            self._times[which].append(seconds)
        self.calls += 1
        fused, split = self._times["fused"], self._times["split"]
        if not untimed and len(fused) == len(split) and timing_settled(fused, split):
            self._settle(choose_step(fused, split))
        return out

    def wait(self) -> None:
        """Wait for the compiles this tuning's choices need (the variants', the split programs'), so that the
        calls that follow make them without running the step kept meanwhile."""
        self.weighing.poll(wait=True)
        self.training.split_begun.wait()

    def _settle(self, chosen: tuple[str, str]) -> FusedChoice:
        tr = self.training
        del tr.programs.tunings[self.name]
        tr.drop_split_compiles()
        return settle(tr, self.value_leaf, self.weighing.exe, chosen, self._program, self._before)


def has_room(exe: Any) -> bool:
    """Whether the device has room for the step ``exe`` running beside a compile's autotuning (the bytes
    :func:`~jaxaot._src.partition.costs.compile_bytes` reads off its program): where it has not,
    the first call makes the choices, as a compile then never runs beside the step. True where the backend
    reports no free memory (CPU, whose compiles hold no device memory)."""
    free = free_device_bytes(exe)
    if free is None:
        return True
    return (compiled_peak(exe) or 0) + compile_bytes(exe.program, platform_of(exe) or "") <= free


def run_decided(training: SplitRunner, choice: FusedChoice, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(outputs, grads)`` of the step ``choice`` decided on: one fused call, or the split executables."""
    if choice.runs == "split":
        return run_split(training, leaves, value_leaf)
    return fused_outputs(training, fused_exe(training, value_leaf), leaves)


def run_fused(training: SplitRunner, leaves: list, value_leaf: int = 0) -> tuple[list, list]:
    """``(the function's outputs, grads of the differentiated inputs)``: one fused call, or the split
    executables where :func:`~jaxaot._src.fusion.fused_choice` chose them: on the first call, or over the calls
    that follow it where ``jaxaot.config.tune_in_background`` lets them (:class:`Tuning`)."""
    p = training.programs

    def tune(weighing: Weighing, program: Any, before: set) -> bool:
        if not has_room(weighing.exe):
            return False
        p.tunings[fused_name(training, value_leaf)] = Tuning(training, value_leaf, weighing, program, before)
        return True

    choice = fused_choice(training, value_leaf, leaves, tune=tune if config.tune_in_background else None)
    tuning = p.tunings.get(choice.executable)
    if tuning is not None:
        return tuning.run(leaves)
    return run_decided(training, choice, leaves, value_leaf)
