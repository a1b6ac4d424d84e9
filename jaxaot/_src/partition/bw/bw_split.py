"""The B/W split: a stage's backward as an input-gradient program B and a weight-gradient program W.

Zero-bubble pipeline schedules (arXiv 2401.10241) run B, the gradients of the
stage's activations that the previous stage waits for, first, and defer W, the
weight gradients, into pipeline bubbles. What W still needs stays alive between
them, so :func:`split_backward` makes it small: B is the backward slice of the
activation gradients, and what crosses to W is a minimum cut of the min-cut's own
flow network (:mod:`jaxaot._src.partition.mincut.flow_graph`), so W recomputes only
cheap eqns, never a matmul B ran. Weights themselves cost nothing in the cut.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.partition import split_backward
    >>> f = lambda w, x: jnp.tanh(x @ w)
    >>> joint = jaxaot.partition.trace_joint(f, jnp.ones((4, 3)), jnp.ones((2, 4)))
    >>> bw = split_backward(jaxaot.partition.default_partition(joint), activations=[1])
    >>> bw.activation_inputs, bw.weight_inputs
    ((1,), (0,))
    >>> bw.live_bytes <= bw.naive_bytes
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import nbytes as aval_nbytes
from jaxaot._src.pytrees import shape_dtype_struct
from jaxaot.errors import PartitionError
from jaxaot._src.partition.core import EqnDescriptions, Partition
from jaxaot._src.partition.costs import Recompute, classify
from jaxaot._src.partition.mincut import CHEAP, INPUT, FlowGraph, FlowGraphBuilder, min_cut


@dataclasses.dataclass(frozen=True)
class BWSplit:
    """A backward split into B (activation gradients) and W (weight gradients).

    Run ``outs = B(*cotangents, *residuals)`` (the fused backward's arguments);
    ``outs[:len(activation_inputs)]`` are the activation gradients, the rest
    the handoff. Later run ``W(*split.weight_arguments(backward_args, outs))``
    for the weight gradients; :meth:`merge` puts both in the fused backward's
    order.

    Attributes:
      backward_input: closed jaxpr ``(cotangents..., residuals...) ->
        (activation grads..., handoff...)``.
      backward_weight: closed jaxpr ``(handoff..., kept...) -> (weight grads...)``.
      activation_inputs: primal input indices whose gradients B returns, in order.
      weight_inputs: primal input indices whose gradients W returns, in order.
      kept: positions among the backward's inputs (cotangents, then residuals)
        that W reads directly: they stay alive until W runs.
      handoff: ``jax.ShapeDtypeStruct`` of each value B hands to W.
      handoff_bytes: bytes of the handoff.
      kept_bytes: bytes of the kept inputs, less the weights themselves (alive anyway).
      naive_bytes: what W would keep alive if it recomputed nothing: every
        backward input and B value that W's own eqns read (weights excluded).
      recomputed: the (cheap) eqns of B that W recomputes, printed lazily.
    """

    backward_input: Any
    backward_weight: Any
    activation_inputs: tuple[int, ...]
    weight_inputs: tuple[int, ...]
    kept: tuple[int, ...]
    handoff: tuple[jax.ShapeDtypeStruct, ...]
    handoff_bytes: int
    kept_bytes: int
    naive_bytes: int
    recomputed: Sequence[str] = ()

    @property
    def live_bytes(self) -> int:
        """Bytes alive between B and W of one microbatch: the handoff plus the kept inputs."""
        return self.handoff_bytes + self.kept_bytes

    @property
    def num_handoff(self) -> int:
        return len(self.handoff)

    def weight_arguments(self, backward_args: Sequence[Any], b_outputs: Sequence[Any]) -> list:
        """W's arguments from the fused backward's arguments and B's outputs."""
        return list(b_outputs[len(self.activation_inputs):]) + [backward_args[i] for i in self.kept]

    def merge(self, grad_inputs: Sequence[int], activation_grads: Sequence[Any],
              weight_grads: Sequence[Any]) -> list:
        """B's and W's gradients in ``grad_inputs`` order (the fused backward's outputs)."""
        by_input = dict(zip(self.activation_inputs, activation_grads))
        by_input.update(zip(self.weight_inputs, weight_grads))
        return [by_input[i] for i in grad_inputs]


# --------------------------------------------------------------------------- slices
def _slice(eqns: Sequence[Any], wanted: Iterable[Any], available: set,
           keep: Sequence[bool] | None = None) -> tuple[list[bool], set]:
    """Which eqns compute ``wanted`` (and the ``keep`` eqns) from ``available``, inputs and constants.

    Returns a mask over ``eqns`` and the frontier: every var the chosen eqns
    (or ``wanted``) read that no chosen eqn produces (inputs, constants,
    ``available`` values).
    """
    needed = {v for v in wanted if not C.is_literal(v)}
    chosen = [False] * len(eqns)
    for i in range(len(eqns) - 1, -1, -1):
        outs = [v for v in eqns[i].outvars if v in needed and v not in available]
        if not outs and not (keep and keep[i]):
            continue
        chosen[i] = True
        needed.difference_update(outs)
        needed.update(v for v in eqns[i].invars if not C.is_literal(v))
    return chosen, needed


def _closed(jaxpr: Any, consts: dict, invars: Sequence[Any], outvars: Sequence[Any], eqns: Sequence[Any]) -> Any:
    used = {v for e in eqns for v in e.invars if not C.is_literal(v)} | {v for v in outvars if not C.is_literal(v)}
    constvars = [v for v in jaxpr.constvars if v in used]
    return C.make_closed_jaxpr(constvars, invars, outvars, eqns, [consts[v] for v in constvars])


# --------------------------------------------------------------------------- the cut
@dataclasses.dataclass(frozen=True)
class _Graph:
    flow: FlowGraph  # node i is the var flow.values[i]
    num_inputs: int  # the first num_inputs nodes are the backward's inputs


def _flow_graph(jaxpr: Any, in_b: Sequence[bool], needed: set, free: set) -> _Graph:
    """The flow network of B's side: backward inputs and B's values, ``needed`` ones to the sink.

    Free values (weights saved as residuals) weigh nothing; backward inputs win ties.
    """
    builder = FlowGraphBuilder()
    builder.add_inputs(jaxpr.invars)
    for eqn, b in zip(jaxpr.eqns, in_b):
        if b:
            builder.add_eqn(eqn, builder.reads(eqn))
    nodes = builder.values
    size = np.fromiter((0 if v in free else aval_nbytes(v.aval) for v in nodes), np.int64, len(nodes))
    need = [builder.index[v] for v in needed if v in builder.index]
    return _Graph(builder.build(size, need, preferred=builder.kind == INPUT), len(jaxpr.invars))


def _crossing(graph: _Graph, recompute: bool) -> list[int]:
    """Node indices W receives: the minimum cut, or (``recompute=False``) every needed node."""
    flow = graph.flow
    if not recompute:
        return list(np.flatnonzero(flow.needed))
    banned = flow.kind != CHEAP  # inputs, expensive and effectful values: never recomputed in W
    return sorted(int(i) for i in min_cut(flow, banned).saved)


# --------------------------------------------------------------------------- the split
def split_backward(partition: Partition, activations: Iterable[int], *, recompute: bool = True) -> BWSplit:
    """Split ``partition``'s backward into B (activation gradients) and W (weight gradients).

    Args:
      partition: a stage's :class:`~jaxaot.partition.Partition` (any partitioner's).
      activations: primal input indices (among ``partition.grad_inputs``) whose
        gradients B computes, those the previous pipeline stage waits for; every
        other gradient input is a weight, computed by W.
      recompute: let W recompute cheap values from what it receives (the
        min-cut, default); False hands W every value its own eqns read.

    Returns:
      a :class:`BWSplit`. Running B then W gives the fused backward's gradients.

    Raises:
      PartitionError: ``activations`` names an input that gets no gradient.
    """
    grad_inputs = tuple(partition.grad_inputs)
    acts = set(activations)
    unknown = sorted(acts - set(grad_inputs))
    if unknown:
        raise PartitionError(f"activations {unknown} are not among the differentiated inputs {list(grad_inputs)}.")
    act_pos = [k for k, i in enumerate(grad_inputs) if i in acts]
    weight_pos = [k for k, i in enumerate(grad_inputs) if i not in acts]
    closed = partition.backward
    jaxpr = C.jaxpr_of(closed)
    eqns = list(jaxpr.eqns)
    consts = dict(zip(jaxpr.constvars, C.consts_of(closed)))
    act_out = [jaxpr.outvars[k] for k in act_pos]
    weight_out = [jaxpr.outvars[k] for k in weight_pos]

    # 1. B: the activation gradients' slice, and effectful eqns W does not read (they run once).
    w_all, _ = _slice(eqns, weight_out, set())
    in_b, _ = _slice(eqns, act_out, set(), keep=[bool(e.effects) and not w for e, w in zip(eqns, w_all)])
    b_values = {v for e, b in zip(eqns, in_b) if b for v in e.outvars}
    _, needed = _slice(eqns, weight_out, b_values)
    needed -= set(jaxpr.constvars)

    # 2. What crosses: a min cut over B's side. Weights saved as residuals are free.
    num_cts = len(jaxpr.invars) - len(partition.residuals)
    free = {jaxpr.invars[num_cts + j] for j, r in enumerate(partition.residuals)
            if r.source == "input" and r.index in set(grad_inputs) - acts}
    graph = _flow_graph(jaxpr, in_b, needed, free)
    crossing = _crossing(graph, recompute)
    kept = [i for i in crossing if i < graph.num_inputs]
    handoff_vars = [graph.flow.values[i] for i in crossing if i >= graph.num_inputs]
    sizes = graph.flow.nbytes
    naive = int(sizes[graph.flow.needed].sum())

    # 3. W: its own eqns, plus the cheap B eqns it recomputes from what it receives.
    w_in = handoff_vars + [jaxpr.invars[i] for i in kept]
    available = set(w_in) | set(jaxpr.constvars)
    in_w, missing = _slice(eqns, weight_out, available)
    missing -= available
    if missing:  # pragma: no cover - the cut separates every needed value from the inputs
        raise PartitionError(f"the B/W split left W without {sorted(map(str, missing))}.")
    recomputed = [e for i, e in enumerate(eqns) if in_w[i] and in_b[i]]
    expensive = [e for e in recomputed if classify(e) is not Recompute.CHEAP]
    if expensive:  # pragma: no cover - banned by construction
        raise PartitionError(f"the B/W split would recompute {expensive[0].primitive} in W.")

    b_eqns = [e for i, e in enumerate(eqns) if in_b[i]]
    w_eqns = [e for i, e in enumerate(eqns) if in_w[i]]
    return BWSplit(
        backward_input=_closed(jaxpr, consts, jaxpr.invars, act_out + handoff_vars, b_eqns),
        backward_weight=_closed(jaxpr, consts, w_in, weight_out, w_eqns),
        activation_inputs=tuple(grad_inputs[k] for k in act_pos),
        weight_inputs=tuple(grad_inputs[k] for k in weight_pos),
        kept=tuple(kept),
        handoff=tuple(shape_dtype_struct(v.aval) for v in handoff_vars),
        handoff_bytes=sum(aval_nbytes(v.aval) for v in handoff_vars),
        kept_bytes=int(sum(sizes[i] for i in kept)),
        naive_bytes=naive,
        recomputed=EqnDescriptions(recomputed),
    )
