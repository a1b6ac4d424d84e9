"""The flow network of a cut, its one builder, and its minimum cut closest to the sink.

Both cuts of this stage, what the forward saves and what B hands W, cut the same
network: a vertex pair per value of capacity its bytes (cutting it saves it),
infinite edges along data dependencies, from the source to what may not be
recomputed, and to the sink from what the far side reads.
:class:`FlowGraphBuilder` builds one; :func:`min_cut` takes the cut with the largest
sink side (least recomputation), preferring values in memory anyway among equal
bytes.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jaxaot._src.partition.mincut import INPUT, FlowGraphBuilder, min_cut
    >>> jaxpr = jax.make_jaxpr(lambda x: jnp.sin(jnp.sin(x)))(jnp.ones(4)).jaxpr
    >>> builder = FlowGraphBuilder()
    >>> builder.add_inputs(jaxpr.invars)
    >>> for eqn in jaxpr.eqns:
    ...     builder.add_eqn(eqn, builder.reads(eqn))
    >>> graph = builder.build(np.array([16, 16, 16]), needed=[2], preferred=builder.kind == INPUT)
    >>> min_cut(graph, banned=graph.kind == INPUT).saved.tolist()  # save the input, recompute the sines
    [0]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import PartitionError
from jaxaot._src.partition.costs import FlopCosts, OpCosts, Recompute, classify, is_loop

if TYPE_CHECKING:
    from scipy.sparse import csr_array

# maximum_flow computes in int32: finite capacities sum to at most _LIMIT and
# "infinite" is one more, so no flow and no cut overflows.
_LIMIT = 2**30 - 1
INF = _LIMIT + 1

# Node kinds: the Recompute classes plus inputs.
CHEAP, EXPENSIVE, NEVER, INPUT = 0, 1, 2, 3
KIND_CODE = {Recompute.CHEAP: CHEAP, Recompute.EXPENSIVE: EXPENSIVE, Recompute.NEVER: NEVER}


# --------------------------------------------------------------------------- graph
@dataclasses.dataclass(frozen=True)
class FlowGraph:
    """Values as arrays (node ``i`` is ``values[i]``).

    Vertex ``2i`` is ``v_in``, ``2i + 1`` is ``v_out``, then source and sink.
    """

    values: tuple
    kind: np.ndarray  # int8 node kind (CHEAP, EXPENSIVE, NEVER, INPUT)
    nbytes: np.ndarray  # int64
    loop: np.ndarray  # bool: an output of a loop (scan, while): recomputing it re-runs every iteration
    capacity: np.ndarray  # int64 scaled v_in -> v_out capacity, INF if unsaveable
    dep_src: np.ndarray  # u of each deduplicated u -> v dependency
    dep_dst: np.ndarray
    needed: np.ndarray  # bool: read directly by the far side of the cut
    # The eqn that recomputing each node runs (None for inputs; a checkpoint_name's
    # is its operand's), and what it costs: asked only for a budget's knapsack items.
    producers: tuple = ()
    costs: OpCosts = dataclasses.field(default_factory=FlopCosts)

    def recompute_seconds(self, nodes: np.ndarray) -> np.ndarray:
        """What recomputing each of ``nodes`` costs (:attr:`costs`; 0 without a producer)."""
        eqns = [self.producers[i] if i < len(self.producers) else None for i in nodes]
        prefetch = getattr(self.costs, "prefetch", None)  # optional: costs that time eqns time them together
        if prefetch is not None:
            prefetch([e for e in eqns if e is not None])
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
        """bool per node: the far side may need it recomputed (or saved)."""
        n = self.num_nodes
        if n == 0:
            return np.zeros(0, bool)
        # Reverse dependency graph plus a virtual root pointing at every needed node.
        rows = np.concatenate([self.dep_dst, np.full(int(self.needed.sum()), n)])
        cols = np.concatenate([self.dep_src, np.flatnonzero(self.needed)])
        sparse, csgraph = _scipy()
        g = sparse.csr_array((np.ones(len(rows), np.int8), (rows, cols)), shape=(n + 1, n + 1))
        reach = csgraph.breadth_first_order(g, n, directed=True, return_predecessors=False)
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
        >>> from jaxaot._src.partition.mincut import scaled_capacities
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


class FlowGraphBuilder:
    """Collects a :class:`FlowGraph`'s nodes, inputs first, then an eqn's outputs at a time.

    ``index`` maps each var to its node; ``values``, ``kinds``, ``loop`` and
    ``producers`` are per node, in order (a caller may raise a kind before
    :meth:`build`, as the min-cut does for values both halves materialize).
    """

    def __init__(self):
        self.index: dict = {}
        self.values: list = []
        self.kinds: list[int] = []
        self.loop: list[bool] = []
        self.producers: list[Any] = []
        self._src: list[int] = []
        self._dst: list[int] = []

    def _add(self, v: Any, kind: int, loop: bool, producer: Any) -> int:
        i = self.index[v] = len(self.values)
        self.values.append(v)
        self.kinds.append(kind)
        self.loop.append(loop)
        self.producers.append(producer)
        return i

    def add_inputs(self, invars: Iterable[Any]) -> None:
        """One INPUT node per var: never recomputed, saved if anything needs it."""
        for v in invars:
            self._add(v, INPUT, False, None)

    def reads(self, eqn: Any) -> list[int]:
        """The nodes ``eqn`` reads, in operand order (literals and unknown vars skipped)."""
        return [self.index[v] for v in eqn.invars if not C.is_literal(v) and v in self.index]

    def add_eqn(self, eqn: Any, ins: Sequence[int], like: int | None = None) -> None:
        """A node per output of ``eqn`` (dropped outputs skipped), each depending on the nodes ``ins``.

        Its kind is ``eqn``'s :func:`~jaxaot._src.partition.costs.classify`, and
        recomputing it runs ``eqn``; with ``like``, both are node ``like``'s
        (a ``checkpoint_name`` is its operand).
        """
        if like is None:
            kind, producer = KIND_CODE[classify(eqn)], eqn
        else:
            kind, producer = self.kinds[like], self.producers[like]
        loop = is_loop(eqn.primitive.name)
        for v in eqn.outvars:
            if C.is_drop_var(v):
                continue
            i = self._add(v, kind, loop, producer)
            self._src.extend(ins)
            self._dst.extend([i] * len(ins))

    @property
    def kind(self) -> np.ndarray:
        """The node kinds so far, as an int8 array."""
        return np.asarray(self.kinds, np.int8)

    def build(self, nbytes: np.ndarray, needed: Iterable[int], preferred: np.ndarray,
              unsaveable: Iterable[int] = (), costs: OpCosts | None = None) -> FlowGraph:
        """The :class:`FlowGraph`: ``nbytes`` per node, ``needed`` nodes to the sink.

        Capacities are :func:`scaled_capacities` (``preferred`` wins ties),
        infinite for ``unsaveable`` nodes; duplicate dependencies are merged.
        ``costs`` prices a budget's knapsack items (default: FLOP estimates).
        """
        n = len(self.values)
        capacity = scaled_capacities(nbytes, preferred)
        capacity[list(unsaveable)] = INF
        codes = np.unique(np.asarray(self._src, np.int64) * max(n, 1) + np.asarray(self._dst, np.int64))
        need = np.zeros(n, bool)
        need[list(needed)] = True
        return FlowGraph(
            values=tuple(self.values),
            kind=self.kind,
            nbytes=nbytes,
            loop=np.asarray(self.loop, bool),
            capacity=capacity,
            dep_src=codes // max(n, 1),
            dep_dst=codes % max(n, 1),
            needed=need,
            producers=tuple(self.producers),
            costs=FlopCosts() if costs is None else costs,
        )


# --------------------------------------------------------------------------- cut
@dataclasses.dataclass(frozen=True)
class Cut:
    """A minimum cut: its value (scaled bytes) and the saved node indices."""

    value: int
    saved: np.ndarray


def _scipy() -> tuple[Any, Any]:
    """``scipy.sparse`` and ``scipy.sparse.csgraph``, imported on the first cut: a process that never
    solves one (the default partition, a min-cut plan read from the compile cache) never pays their
    import (``docs/benchmarks.md`` has its cost)."""
    import scipy.sparse
    import scipy.sparse.csgraph

    return scipy.sparse, scipy.sparse.csgraph


def _network(graph: FlowGraph, banned: np.ndarray) -> csr_array:
    rows, cols, caps = graph.base_edges
    # A value that cannot be saved cannot be banned either (no finite cut would remain).
    ban = np.flatnonzero(banned & (graph.capacity < INF))
    size = 2 * graph.num_nodes + 2
    rows = np.concatenate([rows, np.full(len(ban), graph.source)])
    cols = np.concatenate([cols, 2 * ban])
    caps = np.concatenate([caps, np.full(len(ban), INF)])
    return _scipy()[0].csr_array((caps.astype(np.int32), (rows, cols)), shape=(size, size))


def cut_value(graph: FlowGraph, banned: np.ndarray) -> int:
    """The scaled bytes of the minimum cut when ``banned`` nodes may not be recomputed."""
    if not graph.needed.any():
        return 0
    return int(_scipy()[1].maximum_flow(_network(graph, banned), graph.source, graph.sink).flow_value)


def min_cut(graph: FlowGraph, banned: np.ndarray) -> Cut:
    """The minimum cut closest to the sink (least recomputation among the cheapest).

    The sink side is every vertex that still reaches the sink through
    unsaturated edges after a maximum flow: the same set for every maximum
    flow, so the cut does not depend on the order of the edges.
    """
    if not graph.needed.any():
        return Cut(0, np.zeros(0, np.int64))
    net = _network(graph, banned)
    csgraph = _scipy()[1]
    result = csgraph.maximum_flow(net, graph.source, graph.sink)
    if result.flow_value >= INF:  # pragma: no cover - excluded by construction
        raise PartitionError("min-cut: the backward needs a value that can be neither saved nor recomputed.")
    residual = (net - result.flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    reach = csgraph.breadth_first_order(residual.T.tocsr(), graph.sink, directed=True, return_predecessors=False)
    sink_side = np.zeros(net.shape[0], bool)
    sink_side[reach] = True
    saved = np.flatnonzero(~sink_side[0:-2:2] & sink_side[1:-2:2])
    return Cut(int(result.flow_value), saved)
