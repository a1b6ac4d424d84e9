"""What the forward saves: the min-cut of a joint graph's forward, under a memory budget.

functorch's min-cut, for jaxprs: any set of values separating the primal inputs from
the backward can be saved, the rest recomputed, and the cheapest is a minimum cut of
:mod:`~jaxaot._src.partition.mincut.flow_graph`'s network (:func:`build_flow_graph`).
Expensive values, and values a convolution reads in both halves, are banned from
recomputation; among cuts of equal bytes the one closest to the sink wins, saving
values in memory anyway. On a mesh capacities are per-device bytes. Below
``memory_budget=1`` the knapsack unbans as few as reach the budget.

Example:
    >>> import functools, jax, jax.numpy as jnp, jaxaot
    >>> f = lambda w, x: jnp.sum(jnp.tanh(jnp.sin(x @ w)) ** 2)
    >>> w, x = jnp.ones((4, 4)), jnp.ones((8, 4))
    >>> joint = jaxaot.partition.trace_joint(f, w, x)
    >>> p = jaxaot.partition.min_cut_rematerialization_partition(joint)
    >>> p.saved_bytes <= jaxaot.partition.default_partition(joint).saved_bytes
    True
    >>> g = jaxaot.aot_function(f, partition_fn=functools.partial(
    ...     jaxaot.partition.min_cut_rematerialization_partition, memory_budget=0.5))
    >>> jax.grad(g)(w, x).shape
    (4, 4)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import device_nbytes as aval_nbytes
from jaxaot._src.partition.core import EqnKind, classify_eqns
from jaxaot._src.partition.costs import OpCosts, device_fractions, is_alias, materializes_operands
from jaxaot._src.partition.mincut import knapsack
from jaxaot._src.partition.mincut.flow_graph import CHEAP, EXPENSIVE, INPUT, NEVER, FlowGraph, FlowGraphBuilder, cut_value, min_cut
from jaxaot._src.partition.offload import OffloadPlan
from jaxaot._src.tracing import JointGraph


def build_flow_graph(joint: JointGraph, saveable: Callable[[Any], bool] | None = None,
                     costs: OpCosts | None = None, free: Callable[[Any], bool] | None = None) -> FlowGraph:
    """The :class:`~jaxaot._src.partition.mincut.flow_graph.FlowGraph` of ``joint``'s forward values.

    Nodes are the primal inputs and the forward eqns' outputs; the values the
    backward eqns (or the residual outputs) read are needed. A
    ``checkpoint_name`` is its operand (same kind, same producer). ``saveable(var)``
    may forbid saving some values (infinite capacity): the scan rewrite uses it to
    save only values it can name. ``costs`` prices the knapsack's items (default:
    FLOP estimates, :class:`~jaxaot._src.partition.costs.FlopCosts`). Inputs ``free(var)`` accepts cost no
    bytes to save (a scan body's consts and ``xs``: the scan's inputs hold them anyway).
    """
    jaxpr = C.jaxpr_of(joint.jaxpr)
    builder = FlowGraphBuilder()
    needed: set[int] = set()
    # Nodes read by an eqn that materializes its operands, in each half.
    materialized_by = {True: set(), False: set()}
    compared: dict[int, list[int]] = {}  # a float equality's node -> its float operands' nodes

    builder.add_inputs(jaxpr.invars[: joint.num_primals])
    for eqn, k in zip(jaxpr.eqns, classify_eqns(joint)):
        ins = builder.reads(eqn)
        is_forward = k is EqnKind.FORWARD
        if materializes_operands(eqn):
            materialized_by[is_forward].update(ins)
        if not is_forward:
            needed.update(ins)  # a backward eqn reads these forward values
            continue
        # checkpoint_name: the named value is its operand, banned as much as it is.
        builder.add_eqn(eqn, ins, like=ins[0] if is_alias(eqn) and ins else None)
        if eqn.primitive.name in ("eq", "ne") and not C.is_drop_var(eqn.outvars[0]):
            floats = [builder.index[v] for v in eqn.invars
                      if not C.is_literal(v) and v in builder.index and C.is_inexact(v.aval.dtype)]
            if floats:
                compared[builder.index[eqn.outvars[0]]] = floats
    index = builder.index
    for v in jaxpr.outvars[joint.num_outputs :]:
        if not C.is_literal(v) and v in index:
            needed.add(index[v])

    # The forward writes these to memory anyway and the backward would have to
    # write them again: recomputing them is an extra kernel, so they are banned
    # like expensive values (and unbanned first below memory_budget=1).
    for i in materialized_by[True] & materialized_by[False]:
        if builder.kinds[i] == CHEAP:
            builder.kinds[i] = EXPENSIVE
    values = builder.values
    n = len(values)
    kind = builder.kind
    # Per-device bytes: on a mesh the budget is what one device holds.
    fractions = device_fractions(joint.jaxpr, [getattr(a, "sharding", None) for a in joint.in_avals])
    if fractions is None:
        nbytes = np.fromiter((aval_nbytes(v.aval) for v in values), np.int64, n)
    else:
        nbytes = np.fromiter((math.ceil(aval_nbytes(v.aval) * fractions.get(v, 1.0)) for v in values), np.int64, n)
    if free is not None:
        nbytes[[i for i in np.flatnonzero(kind == INPUT) if free(values[i])]] = 0
    # Equal bytes: prefer values in memory anyway (inputs, outputs, unfused kernels' results) to
    # fusible copies of them (a transpose), which the forward would write a second time.
    preferred = (kind == INPUT) | (kind == EXPENSIVE) | (kind == NEVER)
    for v in jaxpr.outvars[: joint.num_outputs]:  # real outputs are alive anyway
        if not C.is_literal(v) and v in index:
            preferred[index[v]] = True
    unsaveable = () if saveable is None else [i for i, v in enumerate(values) if not saveable(v)]
    graph = builder.build(nbytes, needed, preferred, unsaveable, costs)
    _keep_compared(graph, builder, compared)
    return graph


_EXACT_LAYOUT = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose"})


def _keep_compared(graph: FlowGraph, builder: FlowGraphBuilder, compared: dict[int, list[int]]) -> None:
    """Never recompute a float that an equality the backward depends on compares. A recomputation need not match
    the forward bit for bit, and ``x == max(x)`` (how JAX's derivative of a max finds its argmax) against the
    forward's max would then find no element. Saved (the value a reshape or broadcast rearranges, which recomputes
    exactly), the comparison recomputes as the forward made it."""
    if not compared:
        return
    reach = graph.ancestors_of_needed
    for node, operands in compared.items():
        if reach[node]:
            for i in map(functools.partial(_through_layout, builder), operands):
                if graph.kind[i] in (CHEAP, EXPENSIVE):
                    graph.kind[i] = NEVER


def _through_layout(builder: FlowGraphBuilder, i: int) -> int:
    """The node whose value node ``i`` rearranges through exact layout eqns (a reshape, a broadcast), or ``i``."""
    while True:
        eqn = builder.producers[i]
        if eqn is None or eqn.primitive.name not in _EXACT_LAYOUT:
            return i
        operands = [v for v in eqn.invars if not C.is_literal(v) and v in builder.index]
        if len(operands) != 1:
            return i
        i = builder.index[operands[0]]


# --------------------------------------------------------------------------- budget
def _candidates(graph: FlowGraph, recompute_loops: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(never, candidates)``: the nodes never recomputed, and the banned ones a budget may unban."""
    never = (graph.kind == NEVER) | (graph.kind == INPUT)
    if not recompute_loops:
        # Recomputing a loop re-runs all of its iterations (for a scan of layers,
        # the whole forward again); a scan's per-iteration residuals are chosen
        # under this budget inside its body (scan_remat). Only budget 0, which
        # recomputes all it can, recomputes loops.
        never = never | (graph.loop & (graph.kind == EXPENSIVE))
    candidates = np.flatnonzero((graph.kind == EXPENSIVE) & ~never & graph.ancestors_of_needed)
    return never, candidates


def _ordered(graph: FlowGraph, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, seconds)``: ``candidates`` in knapsack order, cheapest seconds per byte saved first,
    and what recomputing each costs (costs are asked here only)."""
    seconds = graph.recompute_seconds(candidates)
    ranked = knapsack.recompute_order(graph.nbytes[candidates], seconds)
    return candidates[ranked], seconds[ranked]


def _banned(never: np.ndarray, order: np.ndarray, k: int) -> np.ndarray:
    """The ban set after unbanning the first ``k`` nodes of ``order``."""
    banned = never.copy()
    banned[order[k:]] = True
    return banned


@dataclasses.dataclass(frozen=True)
class BudgetPrefix:
    """What a budget recomputes, before its last step is chosen.

    Attributes:
      never: bool per node, never recomputed (inputs, collectives, loops above budget 0).
      order: the budget-unbannable nodes, in knapsack order (cheapest seconds per byte first).
      k: the smallest prefix of ``order`` whose cut meets the budget (0 at budget 1, all at budget 0).
      target: the budget's bytes, in the cut's scaled units (None at budgets 1 and 0: nothing priced, and
        ``order`` is not ranked).
      seconds: what recomputing each node of ``order`` costs (empty when unpriced).
    """

    never: np.ndarray
    order: np.ndarray
    k: int
    target: float | None = None
    seconds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    def banned(self, items=None) -> np.ndarray:
        """The ban set recomputing ``items`` (positions in ``order``; default: the first ``k``)."""
        if items is None:
            return _banned(self.never, self.order, self.k)
        banned = self.never.copy()
        banned[self.order] = True
        banned[self.order[list(items)]] = False
        return banned


def recompute_prefix(graph: FlowGraph, memory_budget: float) -> BudgetPrefix:
    """The knapsack order under ``memory_budget`` and its smallest prefix that meets the budget.

    At budget 1 every candidate stays banned, and at budget 0 every one is unbanned: neither asks what
    recomputing one costs. At 0 the cut closest to the sink recomputes only candidates that the least
    bytes need (one recomputed that the floor could do without would leave a cut of equal bytes nearer the
    sink), so the knapsack's ban of others, in any order, would leave this very cut.
    """
    never, order = _candidates(graph, recompute_loops=memory_budget <= 0)
    if memory_budget >= 1 or len(order) == 0:
        return BudgetPrefix(never, order, 0)  # all banned: the order does not matter, and nothing is priced
    if memory_budget <= 0:
        return BudgetPrefix(never, order, len(order))  # all unbanned: nothing is priced
    return _priced_prefix(graph, never, order, memory_budget)


def _priced_prefix(graph: FlowGraph, never: np.ndarray, order: np.ndarray, memory_budget: float) -> BudgetPrefix:
    """The knapsack's prefix: ``order`` priced and ranked, the smallest prefix reaching the budget's bytes."""
    order, seconds = _ordered(graph, order)
    optimal, floor = cut_value(graph, _banned(never, order, 0)), cut_value(graph, never)
    target = floor + memory_budget * (optimal - floor)
    k = knapsack.smallest_feasible_prefix(lambda k: cut_value(graph, _banned(never, order, k)), len(order), target)
    return BudgetPrefix(never, order, k, target, seconds)


def budget_bans(graph: FlowGraph, prefix: BudgetPrefix) -> np.ndarray:
    """The nodes the budget's cut may not recompute: ``prefix``'s, its last step the cheapest
    (:func:`jaxaot._src.partition.mincut.knapsack.cheapest_last_step`); unpriced, the first ``k``."""
    if prefix.target is None:
        return prefix.banned()
    chosen = knapsack.cheapest_last_step(lambda items: cut_value(graph, prefix.banned(items)),
                                         prefix.seconds, prefix.k, prefix.target)
    return prefix.banned(chosen)


def choose_saved_nodes(graph: FlowGraph, memory_budget: float = 1.0) -> np.ndarray:
    """Indices of the nodes to save under ``memory_budget`` (see the module doc).

    The budget interpolates, in bytes, between the cheapest cut that recomputes
    only cheap eqns (1.0) and the cheapest cut that recomputes every expensive
    eqn but loops (towards 0); at exactly 0 loops too may be recomputed, so it
    keeps only inputs, or smaller values derived from them. Expensive values are
    unbanned in knapsack order, as few as reach the target, the last of them the
    cheapest that does (:func:`budget_bans`); saved bytes never grow as the budget shrinks.
    """
    return min_cut(graph, budget_bans(graph, recompute_prefix(graph, memory_budget))).saved


def offloaded_saved_nodes(graph: FlowGraph, memory_budget: float, plan: Callable[[np.ndarray], OffloadPlan]
                          ) -> tuple[np.ndarray, OffloadPlan]:
    """The saved nodes and their offload ``plan`` that meet the budget with the least recomputation.

    Target: the device bytes of the budget's own cut (:func:`choose_saved_nodes`).
    The knapsack prefixes of a positive budget (loops banned) are tried in order,
    0 (nothing expensive recomputed) up to the budget's own (at budget 0: all of
    them, then the budget's cut); the first whose saved bytes less offloaded
    bytes reach the target wins. So offloading never adds device bytes, and as the
    targets shrink with the budget, so do the device bytes. Cost: one min-cut and
    one plan per prefix tried.
    """
    if memory_budget > 0:
        prefix = recompute_prefix(graph, memory_budget)
        final = min_cut(graph, budget_bans(graph, prefix)).saved
        never, order, k = prefix.never, prefix.order, prefix.k
    else:
        final = choose_saved_nodes(graph, memory_budget)
        never, order = _candidates(graph, recompute_loops=False)
        order, k = _ordered(graph, order)[0], len(order)
    target = int(graph.nbytes[final].sum())
    for j in range(k + 1):
        saved = final if memory_budget > 0 and j == k else min_cut(graph, _banned(never, order, j)).saved
        chosen = plan(saved)
        if int(graph.nbytes[saved].sum()) - chosen.nbytes <= target:
            return saved, chosen
    return final, plan(final)


def choose_saved_values(
    joint: JointGraph, memory_budget: float = 1.0, saveable: Callable[[Any], bool] | None = None,
    costs: OpCosts | None = None, free: Callable[[Any], bool] | None = None,
) -> list:
    """The joint-jaxpr vars the min-cut saves (what :func:`split_joint` takes)."""
    graph = build_flow_graph(joint, saveable, costs, free)
    return [graph.values[i] for i in choose_saved_nodes(graph, memory_budget)]
