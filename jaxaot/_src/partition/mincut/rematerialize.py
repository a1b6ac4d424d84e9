"""The min-cut rematerialization partitioner: the cut, scan bodies and offload put together.

:func:`min_cut_rematerialization_partition` cuts the joint graph under the budget
(:mod:`jaxaot._src.partition.mincut.saved_values`), plans each top-level ``lax.scan``
body with the same cut (:mod:`jaxaot._src.partition.mincut.scan_remat`), and with
``offload`` moves what can hide its copies to host memory, offloading before
recomputing to meet the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable, overload

import numpy as np

from jaxaot.errors import InvalidInputError, PartitionError
from jaxaot._src import compat as C
from jaxaot._src import workers
from jaxaot._src.partition.budget import MemoryBudget, measuring_within, parse_memory_budget, peak_search
from jaxaot._src.partition.core import Partition, check_joint, split_joint
from jaxaot._src.partition.costs import DeviceModel, MeasuredCosts, OpCosts, resolve_costs
from jaxaot._src.partition.mincut import scan_remat
from jaxaot._src.partition.mincut.save_families import FAMILIES, restricted
from jaxaot._src.partition.mincut.plan_memo import PlanMemo, memoized
from jaxaot._src.partition.mincut.saved_values import build_flow_graph, choose_saved_nodes, offloaded_saved_nodes
from jaxaot._src.partition.offload import (
    OffloadPlan, Timeline, apply_offload, check_offload, plan_body_offload, plan_offload, resolve_model, saved_vars)
from jaxaot._src.tracing import JointGraph
from jaxaot._src.units import format_bytes


@overload
def min_cut_rematerialization_partition(
    joint: JointGraph, *, memory_budget: float | int | str = ..., rematerialize_scans: bool = ...,
    offload: bool | str = ..., device_model: DeviceModel | None = ..., op_costs: str | OpCosts = ...,
) -> Partition: ...


@overload  # without a joint graph: the configured partitioner, to pass as partition_fn
def min_cut_rematerialization_partition(
    joint: None = None, *, memory_budget: float | int | str = ..., rematerialize_scans: bool = ...,
    offload: bool | str = ..., device_model: DeviceModel | None = ..., op_costs: str | OpCosts = ...,
) -> MinCutOptions: ...


def min_cut_rematerialization_partition(
    joint: JointGraph | None = None, *, memory_budget: float | int | str = 1.0, rematerialize_scans: bool = True,
    offload: bool | str = False, device_model: DeviceModel | None = None, op_costs: str | OpCosts = "auto",
) -> Partition | MinCutOptions:
    """Save the fewest bytes that let the backward recompute only cheap, fusible eqns.

    Args:
      joint: the joint graph (``aot_function`` passes it). Without it, the options are
        checked now and the configured partitioner (a :class:`MinCutOptions`) is returned, to pass
        as ``partition_fn``.
      memory_budget: a fraction in ``[0, 1]``, or bytes, read by
        :func:`~jaxaot.partition.parse_memory_budget`. A fraction: 1 bans recomputing
        expensive eqns (matmuls, convolutions, large reductions, loops), 0 recomputes all it can
        and saves only inputs (or smaller values derived from them); in between, a knapsack
        (``docs/concepts/memory_planner.md``, "The memory budget") picks which expensive values to recompute,
        cheapest seconds per saved byte first (``op_costs``). Bytes (an int, a whole float such
        as ``1.4e9``, or a string such as ``"1.4GB"`` or ``"512MiB"``): the training step's
        compiled peak device memory per device; the plan is the one at the largest fraction
        whose compiled peak fits (``docs/concepts/memory_planner.md``, "Byte budgets: the step's
        compiled peak"), and
        :class:`~jaxaot.errors.MemoryBudgetError` says when none does.
      rematerialize_scans: choose the per-iteration residuals of each top-level
        ``lax.scan`` with the same min-cut on its body (``docs/concepts/memory_planner.md``, "Loops of layers").
      offload: False, True or ``"auto"``: also move saved values to host memory
        where the copies overlap compute (``docs/concepts/memory_planner.md``, "Offloading to host memory"); the
        budget then counts device bytes and is met offloading before recomputing.
        Without host memory (the CPU backend) nothing moves and ``offload_note`` says why.
      device_model: the :class:`~jaxaot.partition.DeviceModel` to plan
        with (default: measured on the default device, once per process).
      op_costs: what recomputing an eqn costs, for the knapsack and the offload
        timeline: ``"auto"`` (default: measured on GPUs and TPUs, FLOP estimates
        on CPUs or at a given ``device_model``'s rates), ``"measured"`` (each distinct expensive eqn timed once per
        device kind and cached, :class:`~jaxaot.partition.MeasuredCosts`),
        ``"flops"`` (:class:`~jaxaot.partition.FlopCosts`), or an :class:`~jaxaot.partition.OpCosts`. At
        ``memory_budget=1`` without offload nothing is priced (nothing is traded).
        ``Partition.cost_note`` says which were used. Timing ops holds at most as many
        device bytes as the step's largest expensive eqn, or the byte budget
        (``docs/concepts/memory_planner.md``, "Measuring within the budget").

    Raises:
      InvalidValueError: a budget that means neither a fraction nor bytes: negative, NaN or
        infinite, a float above 1 with a fractional part (``1.5``: ``"1.5GB"``?), zero bytes, an
        unreadable string.
      InvalidInputError: a budget that is neither a number nor a string; ``rematerialize_scans`` not a bool.
      PartitionError: an unknown ``offload``, a ``device_model`` that is not a DeviceModel, an unknown ``op_costs``.
      MemoryBudgetError: no plan's compiled peak fits a byte budget.

    Example:
        >>> import functools, jax.numpy as jnp, jaxaot
        >>> f = lambda x: jnp.sum(jnp.exp(jnp.sin(x)) ** 2)
        >>> joint = jaxaot.partition.trace_joint(f, jnp.ones(1000))
        >>> [r.source for r in jaxaot.partition.min_cut_rematerialization_partition(joint).residuals]
        ['input']
        >>> len(jaxaot.partition.default_partition(joint).residuals)
        3
        >>> pf = jaxaot.partition.min_cut_rematerialization_partition(memory_budget="64KiB")  # checked now
        >>> pf(joint).step_peak.peak <= 64 * 1024
        True
    """
    options = MinCutOptions(memory_budget, rematerialize_scans, offload, device_model, op_costs)  # parsed there
    return options if joint is None else options(joint)


@dataclasses.dataclass(frozen=True)
class MinCutOptions:
    """The min-cut partitioner with its options, checked once: what
    ``min_cut_rematerialization_partition(**options)`` returns without a joint graph, and what
    :func:`as_partitioner` makes of ``functools.partial(min_cut_rematerialization_partition, **options)``.
    Calling it on a joint graph plans; its fields key the persistent cache."""

    memory_budget: MemoryBudget
    rematerialize_scans: bool = True
    offload: bool | str = False
    device_model: DeviceModel | None = None
    op_costs: str | OpCosts = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_budget", parse_memory_budget(self.memory_budget))  # 0.5, "1GB" as given
        check_rematerialize_scans(self.rematerialize_scans)
        if self.offload is None:  # not one of the three values the docstring names
            raise PartitionError("offload must be False, True or 'auto', got None (no offload: offload=False).")
        check_offload(self.offload, self.device_model)
        check_op_costs(self.op_costs)

    def __call__(self, joint: JointGraph) -> Partition:
        check_joint(joint, "min_cut_rematerialization_partition")
        budget = self.memory_budget  # read as data from here on: fraction or nbytes, parsed at construction
        if budget.nbytes is not None and C.in_manual_context():
            raise PartitionError(
                f"a byte memory_budget ({format_bytes(budget.nbytes)}) is met by compiling and measuring "
                "the step, but this function is traced inside jax.shard_map, whose per-device programs compile only "
                "as part of it. Give a fraction (memory_budget=0.5), or make the aot_function of the whole "
                "shard_map (jaxaot.aot_function(jax.shard_map(...))), whose byte budget is measured per device.")
        model = resolve_model(self.offload, self.device_model)
        costs = resolve_costs(self.op_costs, model, model_given=self.device_model is not None)
        memo = PlanMemo() if budget.nbytes is not None else None  # a byte budget plans several fractions

        def plan_at(fraction: float, family: str | None = None) -> Partition:
            return _at_fraction(joint, fraction, rematerialize_scans=self.rematerialize_scans, model=model,
                                costs=costs, family=family, memo=memo)

        priced = isinstance(costs, MeasuredCosts) and (budget.nbytes is not None or 0 < budget.fraction < 1)
        with measuring_within(joint, budget.nbytes):
            rates = costs.start_rates() if priced else None  # the device's rate probes run beside the cuts
            try:
                if budget.nbytes is None:
                    return plan_at(budget.fraction)
                families = FAMILIES if model is None else ()  # offloading plans meet the budget their own way
                search = peak_search(joint, budget.nbytes, families, costs)
                request = next(search)
                while True:  # the search decides which plans to make; they are made here and handed to it
                    try:
                        request = search.send(plan_at(*request))
                    except StopIteration as done:
                        return done.value
            finally:  # the probes end within the allowance, before any step runs
                workers.settle([rates] if rates is not None else [])


def as_partitioner(partition_fn: Any) -> Any:
    """``partition_fn`` as ``aot_function`` keeps it: ``functools.partial(min_cut_rematerialization_partition,
    **options)`` becomes its :class:`MinCutOptions`, its options checked now, before any joint graph
    exists; every other partitioner is returned as it is.

    Example:
        >>> import functools, jaxaot
        >>> from jaxaot._src.partition import as_partitioner
        >>> as_partitioner(functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
        ...                                  memory_budget="1GB")).memory_budget
        MemoryBudget(nbytes=1000000000)
        >>> as_partitioner(functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
        ...                                  memory_budget=-1))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        jaxaot.errors.InvalidValueError: memory_budget=-1 is negative: ...
    """
    if isinstance(partition_fn, functools.partial) and partition_fn.func is min_cut_rematerialization_partition:
        if partition_fn.args:
            raise InvalidInputError("functools.partial(min_cut_rematerialization_partition, ...) takes its options "
                                    "as keywords (memory_budget=..., offload=...), not positional arguments.")
        return min_cut_rematerialization_partition(**partition_fn.keywords)
    return partition_fn


def check_rematerialize_scans(rematerialize_scans: Any) -> None:
    """Refuse a ``rematerialize_scans`` that is not a bool (``"yes"`` would read as True)."""
    if not isinstance(rematerialize_scans, (bool, np.bool_)):
        raise InvalidInputError(
            f"rematerialize_scans must be True or False, got {type(rematerialize_scans).__name__} "
            f"{rematerialize_scans!r}: True (default) plans each top-level lax.scan body with the same min-cut, "
            f"False keeps the per-iteration residuals the scan's own rule saves.")


def check_op_costs(op_costs: Any) -> None:
    """Refuse an ``op_costs`` that :func:`~jaxaot._src.partition.costs.resolve_costs` would refuse, before any work."""
    if isinstance(op_costs, str) and op_costs in ("auto", "measured", "flops"):
        return
    if isinstance(op_costs, str) or not (hasattr(op_costs, "seconds") and hasattr(op_costs, "note")):
        raise PartitionError(f"op_costs must be 'auto', 'measured', 'flops' or an OpCosts (an object with "
                             f"seconds(eqn) and note), got {op_costs!r}.")


def _at_fraction(joint: JointGraph, memory_budget: float, *, rematerialize_scans: bool, model: DeviceModel | None,
                 costs: OpCosts, family: str | None = None, memo: PlanMemo | None = None) -> Partition:
    """The min-cut at the fraction ``memory_budget`` (see :func:`min_cut_rematerialization_partition`), its
    saved values restricted to ``family``'s (:mod:`jaxaot._src.partition.mincut.save_families`) if given.
    ``memo`` keeps what plans of ``joint`` at other fractions share (:mod:`~jaxaot._src.partition.mincut.plan_memo`)."""

    def saved_values(g: JointGraph, saveable: Callable[[Any], bool] | None = None,
                     free: Callable[[Any], bool] | None = None) -> list:
        graph = memoized(memo, "flow_graph", g, family,
                         lambda: build_flow_graph(g, restricted(saveable, g, family), costs, free))
        return [graph.values[i] for i in choose_saved_nodes(graph, memory_budget)]

    part = split_joint(joint, saved_values(joint))
    source, plan = joint, None
    if rematerialize_scans:
        in_body: Callable = saved_values
        if model is not None and not model.scan_offload_note:
            in_body = functools.partial(choose_body, memory_budget=memory_budget, model=model, costs=costs)
        _, plan = _plan_scans(scan_remat.plan_scans(joint.primal, memo=memo, retrace=False), in_body)
        rejoint = None
        if plan:
            rejoint = memoized(memo, "replayed", joint, json.dumps(plan, sort_keys=True),
                               lambda: scan_remat.replay_joint(joint, plan))
        if rejoint is not None and (rejoint.differentiable, rejoint.needs_cotangent) == (
                joint.differentiable, joint.needs_cotangent):  # the rewrite keeps avals: always equal
            repart = split_joint(rejoint, saved_values(rejoint))
            # Scan bodies may only save values they can name (not JAX's linearization
            # temporaries), which is almost never worse; keep whichever holds less (inputs saved are alive anyway).
            if repart.held_bytes <= part.held_bytes:
                part, source = repart, rejoint
        if source is joint:
            plan = None
    if model is not None:
        part = _offload(source, part, memory_budget, model, costs)
    if 0 < memory_budget < 1 or model is not None:  # only between 0 and 1 does the knapsack price eqns
        part = dataclasses.replace(part, cost_note=costs.note)
    return part if plan is None else dataclasses.replace(part, primal_plan=plan, split_from=source)


def _plan_scans(planning: scan_remat.ScanPlanning, choose: Callable) -> tuple[Any, dict]:
    """Run the scan planning, answering each body it asks for with ``choose(joint, saveable=...)``; its
    result. An exception choosing raises goes back to the planning, which leaves that scan alone."""
    try:
        request = next(planning)
        while True:  # the planning rewrites the scans; their bodies are cut here, under the budget
            try:
                chosen = choose(request.joint, saveable=request.saveable, free=request.free)
            except Exception as e:  # noqa: BLE001 - handed back, as the planning decides
                request = planning.throw(e)
            else:
                request = planning.send(chosen)
    except StopIteration as done:
        return done.value


def _offloading_cut(joint: JointGraph, memory_budget: float, model: DeviceModel, planner: Callable,
                    saveable: Callable[[Any], bool] | None = None, costs: OpCosts | None = None,
                    free: Callable[[Any], bool] | None = None) -> tuple[list, OffloadPlan]:
    """The saved vars of ``joint`` meeting the budget offloading before recomputing, and the offload plan.

    ``planner(timeline, saved vars, model, sizes) -> OffloadPlan`` decides what may go
    (:func:`~jaxaot._src.partition.offload.plan_offload` between the programs,
    :func:`~jaxaot._src.partition.offload.plan_body_offload` per scan iteration).
    """
    costs = model.flop_costs if costs is None else costs
    graph = build_flow_graph(joint, saveable, costs, free)
    timeline = Timeline.of(joint, model, costs)
    sizes = dict(zip(graph.values, graph.nbytes.tolist()))
    saved, chosen = offloaded_saved_nodes(
        graph, memory_budget, lambda nodes: planner(timeline, [graph.values[i] for i in nodes], model, sizes))
    return [graph.values[i] for i in saved], chosen


def _offload(source: JointGraph, part: Partition, memory_budget: float, model: DeviceModel,
             costs: OpCosts | None = None) -> Partition:
    """``source``'s partition meeting the budget, offloading what overlaps compute (:func:`offloaded_saved_nodes`)."""
    if model.offload_note:
        return dataclasses.replace(part, offload_note=model.offload_note)
    saved, chosen = _offloading_cut(source, memory_budget, model, plan_offload, costs=costs)
    split = split_joint(source, saved)
    position = {v: j for j, v in enumerate(saved_vars(split))}
    note = "" if any(r.offloaded for r in split.residuals) else chosen.note  # scan bodies offloaded some
    return apply_offload(split, [position[v] for v in chosen.offloaded if v in position], note)


def choose_body(joint: JointGraph, *, memory_budget: float, model: DeviceModel,
                saveable: Callable[[Any], bool] | None = None, costs: OpCosts | None = None,
                free: Callable[[Any], bool] | None = None) -> scan_remat.BodyChoice:
    """A scan body's saved values and those it offloads per iteration (:mod:`jaxaot._src.partition.offload.scan_offload`).

    The budget's device bytes are met offloading before recomputing, as at the top level.
    """
    saved, chosen = _offloading_cut(joint, memory_budget, model, plan_body_offload, saveable, costs, free)
    return scan_remat.BodyChoice(tuple(saved), chosen.offloaded)
