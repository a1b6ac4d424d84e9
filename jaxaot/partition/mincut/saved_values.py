"""The min-cut behind the rematerialization partitioner (functorch's, for jaxprs; assembled in ``rematerialize``).

Which forward values should the forward save? Any set that separates the
primal inputs from the backward works: the backward recomputes the rest. The
cheapest such set is a minimum cut of a flow network with

* a vertex pair ``v_in -> v_out`` per forward value, of capacity = its bytes
  (cutting it = saving ``v``);
* ``u_out -> v_in`` of infinite capacity when ``v``'s eqn reads ``u``;
* ``source -> v_in`` (infinite) for primal inputs and for values whose
  recomputation is banned (:mod:`jaxaot.partition.cost_model`): they can only be saved.
  Besides expensive eqns, that bans values that a convolution reads in both
  halves (:func:`jaxaot.partition.cost_model.materializes_operands`): the forward writes
  them to memory anyway, and recomputing them would cost the backward a kernel;
* ``v_out -> sink`` (infinite) for values the backward reads.

Among the cuts of minimum bytes we take the one closest to the sink (fewest
recomputed eqns), and among equal bytes we prefer saving values that are in
memory anyway: inputs, outputs, and the outputs of unfused kernels (a matmul's
result rather than its transpose, which the forward would write a second time). On a mesh, capacities are per-device bytes
(:mod:`jaxaot.partition.device_bytes`): the budget is what one device holds,
and collectives are never recomputed. Capacities are scaled to int32 because that is what
``scipy.sparse.csgraph.maximum_flow`` computes in.

Below ``memory_budget=1`` the banned-but-recomputable values are unbanned in
:func:`jaxaot.partition.knapsack.recompute_order` (seconds per saved byte, by
:mod:`jaxaot.partition.op_costs`), as few as reach the budget, the last step the
cheapest that does (:func:`jaxaot.partition.knapsack.cheapest_last_step`). Loops are
not among them (only budget 0 recomputes a loop): recomputing a scan of layers
would run the whole forward again, and the budget already reaches into each
scan's body, where the same knapsack picks what each iteration recomputes.

Example:
    >>> import functools, jax, jax.numpy as jnp, jaxaot
    >>> f = lambda w, x: jnp.sum(jnp.tanh(jnp.sin(x @ w)) ** 2)
    >>> w, x = jnp.ones((4, 4)), jnp.ones((8, 4))
    >>> joint = jaxaot.trace_joint(f, w, x)
    >>> p = jaxaot.min_cut_rematerialization_partition(joint)
    >>> p.saved_bytes <= jaxaot.default_partition(joint).saved_bytes
    True
    >>> g = jaxaot.aot_function(f, partition_fn=functools.partial(
    ...     jaxaot.min_cut_rematerialization_partition, memory_budget=0.5))
    >>> jax.grad(g)(w, x).shape
    (4, 4)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from jaxaot import _compat as C
from jaxaot._pytrees import device_nbytes as aval_nbytes
from jaxaot.partition import cost_model
from jaxaot.partition import knapsack
from jaxaot.partition import offload as host_offload
from jaxaot.partition.cost_model import Recompute
from jaxaot.partition.device_bytes import device_fractions
from jaxaot.partition.op_costs import FlopCosts, OpCosts
from jaxaot.errors import PartitionError
from jaxaot.partition.split import EqnKind, classify_eqns
from jaxaot.tracing.joint import JointGraph

# maximum_flow computes in int32: finite capacities sum to at most _LIMIT and
# "infinite" is one more, so no flow and no cut overflows.
_LIMIT = 2**30 - 1
INF = _LIMIT + 1

# Node kinds: the Recompute classes plus primal inputs.
CHEAP, EXPENSIVE, NEVER, INPUT = 0, 1, 2, 3
_KIND_CODE = {Recompute.CHEAP: CHEAP, Recompute.EXPENSIVE: EXPENSIVE, Recompute.NEVER: NEVER}


# --------------------------------------------------------------------------- graph
@dataclasses.dataclass(frozen=True)
class FlowGraph:
    """The forward values of a joint graph as arrays (node ``i`` is ``values[i]``).

    Vertex ``2i`` is ``v_in``, ``2i + 1`` is ``v_out``, then source and sink.
    """

    values: tuple
    kind: np.ndarray  # int8 node kind (CHEAP, EXPENSIVE, NEVER, INPUT)
    nbytes: np.ndarray  # int64
    loop: np.ndarray  # bool: an output of a loop (scan, while): recomputing it re-runs every iteration
    capacity: np.ndarray  # int64 scaled v_in -> v_out capacity, INF if unsaveable
    dep_src: np.ndarray  # u of each deduplicated u -> v dependency
    dep_dst: np.ndarray
    needed: np.ndarray  # bool: read directly by the backward
    # The eqn that recomputing each node runs (None for inputs; a checkpoint_name's
    # is its operand's), and what it costs: asked only for the knapsack's items.
    producers: tuple = ()
    costs: OpCosts = dataclasses.field(default_factory=FlopCosts)

    def recompute_seconds(self, nodes: np.ndarray) -> np.ndarray:
        """What recomputing each of ``nodes`` costs (:attr:`costs`; 0 without a producer)."""
        eqns = [self.producers[i] if i < len(self.producers) else None for i in nodes]
        return np.fromiter((0.0 if e is None else self.costs.seconds(e) for e in eqns), np.float64, len(eqns))

    @property
    def num_nodes(self) -> int:
        return len(self.values)

    @property
    def source(self) -> int:
        return 2 * self.num_nodes

    @property
    def sink(self) -> int:
        return 2 * self.num_nodes + 1

    @functools.cached_property
    def base_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, capacities) of every edge except the ban edges."""
        n = np.arange(self.num_nodes)
        need = np.flatnonzero(self.needed)
        rows = np.concatenate([2 * n, 2 * self.dep_src + 1, 2 * need + 1])
        cols = np.concatenate([2 * n + 1, 2 * self.dep_dst, np.full(len(need), self.sink)])
        caps = np.concatenate([self.capacity, np.full(len(self.dep_src) + len(need), INF)])
        return rows, cols, caps

    @functools.cached_property
    def ancestors_of_needed(self) -> np.ndarray:
        """bool per node: the backward may need it recomputed (or saved)."""
        n = self.num_nodes
        if n == 0:
            return np.zeros(0, bool)
        # Reverse dependency graph plus a virtual root pointing at every needed node.
        rows = np.concatenate([self.dep_dst, np.full(int(self.needed.sum()), n)])
        cols = np.concatenate([self.dep_src, np.flatnonzero(self.needed)])
        g = csr_array((np.ones(len(rows), np.int8), (rows, cols)), shape=(n + 1, n + 1))
        reach = breadth_first_order(g, n, directed=True, return_predecessors=False)
        mask = np.zeros(n + 1, bool)
        mask[reach] = True
        return mask[:n]


def scaled_capacities(nbytes: np.ndarray, preferred: np.ndarray) -> np.ndarray:
    """int32-safe capacities: bytes first, then a tie-break against non-preferred nodes.

    Exact (one unit per byte, tie-breaks summing below a byte) when the graph
    fits; otherwise bytes are rounded up to a common unit and the tie-break is
    half a unit.

    Example:
        >>> import numpy as np
        >>> from jaxaot.partition.min_cut import scaled_capacities
        >>> scaled_capacities(np.array([4, 4]), np.array([True, False])).tolist()
        [12, 13]
    """
    n = len(nbytes)
    total = int(nbytes.sum())
    k = n + 1
    if (total + n) * k + n > _LIMIT:
        k = 2
    unit = 1
    if (total + n) * k + n > _LIMIT:
        unit = -(-total // ((_LIMIT - n) // k - n))
    units = -(-nbytes.astype(np.int64) // unit)
    return units * k + (~preferred.astype(bool)).astype(np.int64)


def build_flow_graph(joint: JointGraph, saveable: Callable[[Any], bool] | None = None,
                     costs: OpCosts | None = None) -> FlowGraph:
    """The :class:`FlowGraph` of ``joint``'s forward values.

    ``saveable(var)`` may forbid saving some values (infinite capacity): the
    scan rewrite uses it to save only values it can name. ``costs`` prices the
    knapsack's items (default: FLOP estimates, :class:`~jaxaot.partition.op_costs.FlopCosts`).
    """
    jaxpr = C.jaxpr_of(joint.jaxpr)
    index: dict = {}
    values: list = []
    kinds: list[int] = []
    loop: list[bool] = []
    src: list[int] = []
    dst: list[int] = []
    needed: set[int] = set()
    producer: list[Any] = []
    # Nodes read by an eqn that materializes its operands, in each half.
    materialized_by = {True: set(), False: set()}

    for v in jaxpr.invars[: joint.num_primals]:
        index[v] = len(values)
        values.append(v)
        kinds.append(INPUT)
        loop.append(False)
        producer.append(None)
    for eqn, k in zip(jaxpr.eqns, classify_eqns(joint)):
        ins = [index[v] for v in eqn.invars if not C.is_literal(v) and v in index]
        is_forward = k is EqnKind.FORWARD
        if cost_model.materializes_operands(eqn):
            materialized_by[is_forward].update(ins)
        if not is_forward:
            needed.update(ins)  # a backward eqn reads these forward values
            continue
        if cost_model.is_alias(eqn) and ins:
            # checkpoint_name: the named value is its operand, banned as much as it is.
            code, made_by = kinds[ins[0]], producer[ins[0]]
        else:
            code, made_by = _KIND_CODE[cost_model.classify(eqn)], eqn
        for v in eqn.outvars:
            if C.is_drop_var(v):
                continue
            i = index[v] = len(values)
            values.append(v)
            kinds.append(code)
            loop.append(cost_model.is_loop(eqn.primitive.name))
            producer.append(made_by)
            src.extend(ins)
            dst.extend([i] * len(ins))
    for v in jaxpr.outvars[joint.num_outputs :]:
        if not C.is_literal(v) and v in index:
            needed.add(index[v])

    # The forward writes these to memory anyway and the backward would have to
    # write them again: recomputing them is an extra kernel, so they are banned
    # like expensive values (and unbanned first below memory_budget=1).
    for i in materialized_by[True] & materialized_by[False]:
        if kinds[i] == CHEAP:
            kinds[i] = EXPENSIVE
    n = len(values)
    kind = np.asarray(kinds, np.int8)
    # Per-device bytes: on a mesh the budget is what one device holds.
    fractions = device_fractions(joint.jaxpr, [getattr(a, "sharding", None) for a in joint.in_avals])
    if fractions is None:
        nbytes = np.fromiter((aval_nbytes(v.aval) for v in values), np.int64, n)
    else:
        nbytes = np.fromiter((math.ceil(aval_nbytes(v.aval) * fractions.get(v, 1.0)) for v in values), np.int64, n)
    # Equal bytes: prefer values in memory anyway (inputs, outputs, unfused kernels' results) to
    # fusible copies of them (a transpose), which the forward would write a second time.
    preferred = (kind == INPUT) | (kind == EXPENSIVE) | (kind == NEVER)
    for v in jaxpr.outvars[: joint.num_outputs]:  # real outputs are alive anyway
        if not C.is_literal(v) and v in index:
            preferred[index[v]] = True
    capacity = scaled_capacities(nbytes, preferred)
    if saveable is not None:
        capacity[[i for i, v in enumerate(values) if not saveable(v)]] = INF
    codes = np.unique(np.asarray(src, np.int64) * max(n, 1) + np.asarray(dst, np.int64))
    need = np.zeros(n, bool)
    need[list(needed)] = True
    return FlowGraph(
        values=tuple(values),
        kind=kind,
        nbytes=nbytes,
        loop=np.asarray(loop, bool),
        capacity=capacity,
        dep_src=codes // max(n, 1),
        dep_dst=codes % max(n, 1),
        needed=need,
        producers=tuple(producer),
        costs=FlopCosts() if costs is None else costs,
    )


# --------------------------------------------------------------------------- cut
@dataclasses.dataclass(frozen=True)
class Cut:
    """A minimum cut: its value (scaled bytes) and the saved node indices."""

    value: int
    saved: np.ndarray


def _network(graph: FlowGraph, banned: np.ndarray) -> csr_array:
    rows, cols, caps = graph.base_edges
    # A value that cannot be saved cannot be banned either (no finite cut would remain).
    ban = np.flatnonzero(banned & (graph.capacity < INF))
    size = 2 * graph.num_nodes + 2
    rows = np.concatenate([rows, np.full(len(ban), graph.source)])
    cols = np.concatenate([cols, 2 * ban])
    caps = np.concatenate([caps, np.full(len(ban), INF)])
    return csr_array((caps.astype(np.int32), (rows, cols)), shape=(size, size))


def cut_value(graph: FlowGraph, banned: np.ndarray) -> int:
    """The scaled bytes of the minimum cut when ``banned`` nodes may not be recomputed."""
    if not graph.needed.any():
        return 0
    return int(maximum_flow(_network(graph, banned), graph.source, graph.sink).flow_value)


def min_cut(graph: FlowGraph, banned: np.ndarray) -> Cut:
    """The minimum cut closest to the sink (least recomputation among the cheapest)."""
    if not graph.needed.any():
        return Cut(0, np.zeros(0, np.int64))
    net = _network(graph, banned)
    result = maximum_flow(net, graph.source, graph.sink)
    if result.flow_value >= INF:  # pragma: no cover - excluded by construction
        raise PartitionError("min-cut: the backward needs a value that can be neither saved nor recomputed.")
    residual = (net - result.flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    # Vertices that still reach the sink through unsaturated edges: the sink side.
    reach = breadth_first_order(residual.T.tocsr(), graph.sink, directed=True, return_predecessors=False)
    sink_side = np.zeros(net.shape[0], bool)
    sink_side[reach] = True
    saved = np.flatnonzero(~sink_side[0:-2:2] & sink_side[1:-2:2])
    return Cut(int(result.flow_value), saved)


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
      k: the smallest prefix of ``order`` whose cut meets the budget (0 at budget 1).
      target: the budget's bytes, in the cut's scaled units (None at budget 1: nothing priced).
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
    """The knapsack order under ``memory_budget`` and its smallest prefix that meets the budget."""
    never, order = _candidates(graph, recompute_loops=memory_budget <= 0)
    if memory_budget >= 1 or len(order) == 0:
        return BudgetPrefix(never, order, 0)  # all banned: the order does not matter, and nothing is priced
    order, seconds = _ordered(graph, order)
    optimal, floor = cut_value(graph, _banned(never, order, 0)), cut_value(graph, never)
    target = floor + memory_budget * (optimal - floor)
    k = knapsack.smallest_feasible_prefix(lambda k: cut_value(graph, _banned(never, order, k)), len(order), target)
    return BudgetPrefix(never, order, k, target, seconds)


def budget_bans(graph: FlowGraph, prefix: BudgetPrefix) -> np.ndarray:
    """The nodes the budget's cut may not recompute: ``prefix``'s, its last step the cheapest
    (:func:`jaxaot.partition.knapsack.cheapest_last_step`)."""
    if prefix.k == 0:
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


def offloaded_saved_nodes(graph: FlowGraph, memory_budget: float, plan: Callable[[np.ndarray], host_offload.OffloadPlan]
                          ) -> tuple[np.ndarray, host_offload.OffloadPlan]:
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
    costs: OpCosts | None = None,
) -> list:
    """The joint-jaxpr vars the min-cut saves (what :func:`split_joint` takes)."""
    graph = build_flow_graph(joint, saveable, costs)
    return [graph.values[i] for i in choose_saved_nodes(graph, memory_budget)]
