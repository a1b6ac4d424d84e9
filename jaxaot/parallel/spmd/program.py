"""The whole pipeline step as one SPMD program: ``shard_map`` over the stage axis, a loop over ticks.

:func:`build_step` turns a :class:`~jaxaot.parallel.spmd.ticks.TickPlan` and
every stage's :class:`~jaxaot.parallel.spmd.passes.StagePasses` into one
function, jitted by the caller, of

* the packed parameters (one array per parameter entry, ``[stages-devices, width, *shape]``,
  sharded over the stage axis, replicated over the data axes),
* the inputs and targets, ``[num_microbatches, microbatch, ...]`` per leaf,

returning the mean microbatch loss and the packed gradients. Inside
``shard_map`` each device:

1. reads its row of the tick table (``lax.axis_index`` of the stage axis);
2. per tick (``lax.scan`` over the table), runs its action with ``lax.switch``
   over every stage's passes (idle, then F, B, W, BW of each stage): the
   branch reads its inputs from the buffers (parameters, the activation or
   cotangent inbox, the residual or weight-argument slot), runs the stage's
   partitioned program, writes what later ticks need, adds parameter
   gradients to the accumulator and returns the messages it sends;
3. sends the activation message one device forward and the cotangent message
   one device back (``lax.ppermute`` around the ring), and stores what it
   receives in its inbox at the slot the table names;
4. after the last tick, sums the loss over the stage axis and averages loss
   and gradients over the data axes (``lax.psum`` / ``lax.pmean``).

The program is the same on every device and its size does not grow with the
microbatch count: the schedule is data (the table), the stages' programs
appear once each. Buffers hold the plan's slot counts, so the residual
memory of a device is the schedule's peak live microbatches times one
microbatch's residual record.

Per tick every device waits for the slowest: the step takes the sum over
ticks of the longest action in each
(:func:`jaxaot.parallel.simulate.simulate_lockstep` predicts it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot.parallel.schedule import OPS
from jaxaot.parallel.spmd import layout as L
from jaxaot.parallel.spmd.passes import StagePasses
from jaxaot.parallel.spmd.ticks import COL, TickPlan, branch_of

P = jax.sharding.PartitionSpec


@dataclasses.dataclass(frozen=True)
class Layouts:
    """The records of one compiled pipeline.

    Attributes:
      params: each device's parameters (the stages it hosts share a record); gradients use it too.
      residuals / weights: one microbatch's stored residuals / W arguments, per stage.
      activations: the message stage ``s`` sends forward (its outputs), keyed by ``s``.
      cotangents: the message stage ``s`` receives from ``s + 1`` (its outputs' cotangents), keyed by ``s``.
    """

    params: L.Layout
    residuals: L.Layout
    weights: L.Layout
    activations: L.Layout
    cotangents: L.Layout


def layouts(passes: Sequence[StagePasses], stage_device: dict[int, int], num_devices: int) -> Layouts:
    last = len(passes) - 1
    groups = [[s for s in range(len(passes)) if stage_device[s] == d] for d in range(num_devices)]
    return Layouts(
        params=L.union([p.param_avals for p in passes], groups),
        residuals=L.union([p.stored_residuals for p in passes]),
        weights=L.union([p.stored_weight_args for p in passes]),
        activations=L.union([p.output_avals if s < last else [] for s, p in enumerate(passes)]),
        cotangents=L.union([[p.output_avals[i] for i in p.cotangent_outputs] if s < last else []
                            for s, p in enumerate(passes)]),
    )


@dataclasses.dataclass(frozen=True)
class Axes:
    """The mesh axes the step runs over: ``stage`` (the pipeline) and ``data`` (batch shards, maybe empty)."""

    stage: str
    data: tuple[str, ...]
    num_devices: int

    @property
    def manual(self) -> frozenset:
        return frozenset((self.stage, *self.data))


def _add_grads(lay: L.Layout, stage: int, acc: list, grads: Sequence[Any]) -> list:
    acc = list(acc)
    for (e, j), g in zip(lay.places[stage], grads):
        acc[e] = acc[e].at[j].add(g.astype(acc[e].dtype))
    return acc


def _branches(passes: Sequence[StagePasses], lay: Layouts, num_microbatches: int, used: set) -> list:
    """``lax.switch`` branches ``(state, row, params, inputs, targets) -> (state, act_msg, ct_msg)``.

    Branch 0 is idle, then each stage's F, B, W, BW; an op the schedule never runs on a stage is idle too.
    """
    last = len(passes) - 1
    scale = np.asarray(1.0 / num_microbatches, passes[-1].output_avals[0].dtype)

    def idle(state, row, params, inputs, targets):
        return state, lay.activations.zeros(), lay.cotangents.zeros()

    def forward(s):
        def run(state, row, params, inputs, targets):
            m = row[COL["microbatch"]]
            p = lay.params.unpack(s, params)
            if s == 0:
                acts = [jax.lax.dynamic_index_in_dim(x, m, 0, keepdims=False) for x in inputs]
            else:
                acts = lay.activations.read(s - 1, state["act_in"], row[COL["act_read"]])
            ts = [jax.lax.dynamic_index_in_dim(t, m, 0, keepdims=False) for t in targets] if s == last else []
            outs, stored = passes[s].forward(p, acts, ts)
            state = dict(state, res=lay.residuals.write(s, state["res"], row[COL["res_write"]], stored))
            if s == last:
                state["loss"] = state["loss"] + outs[0].astype(state["loss"].dtype)
                return state, lay.activations.zeros(), lay.cotangents.zeros()
            return state, lay.activations.pack(s, outs), lay.cotangents.zeros()
        return run

    def backward(s, op):
        def run(state, row, params, inputs, targets):
            p = lay.params.unpack(s, params)
            stored = lay.residuals.read(s, state["res"], row[COL["res_read"]])
            cts = [scale] if s == last else lay.cotangents.read(s, state["ct_in"], row[COL["ct_read"]])
            state = dict(state)
            if op == "BW":
                grads, act_grads = passes[s].backward(p, stored, cts)
                state["acc"] = _add_grads(lay.params, s, state["acc"], grads)
            else:
                act_grads, wstored = passes[s].backward_input(p, stored, cts)
                state["w"] = lay.weights.write(s, state["w"], row[COL["w_write"]], wstored)
            if s == 0:
                return state, lay.activations.zeros(), lay.cotangents.zeros()
            prev = passes[s - 1]
            back = [jnp.zeros(prev.output_avals[i].shape, prev.output_avals[i].dtype) if act_grads[i] is None
                    else act_grads[i] for i in prev.cotangent_outputs]
            return state, lay.activations.zeros(), lay.cotangents.pack(s - 1, back)
        return run

    def weight(s):
        def run(state, row, params, inputs, targets):
            p = lay.params.unpack(s, params)
            stored = lay.weights.read(s, state["w"], row[COL["w_read"]])
            grads = passes[s].backward_weight(p, stored)
            state = dict(state, acc=_add_grads(lay.params, s, state["acc"], grads))
            return state, lay.activations.zeros(), lay.cotangents.zeros()
        return run

    out = [idle]
    for s in range(len(passes)):
        for op in OPS:
            assert len(out) == branch_of(s, op)
            if (s, op) not in used:
                out.append(idle)
            else:
                out.append(forward(s) if op == "F" else weight(s) if op == "W" else backward(s, op))
    return out


def build_step(tick_plan: TickPlan, passes: Sequence[StagePasses], mesh: jax.sharding.Mesh, axes: Axes,
               num_microbatches: int, loss_dtype: Any):
    """``step(param_entries, inputs, targets) -> (loss, grad_entries)`` (see the module docstring; not jitted)."""
    sched = tick_plan.schedule
    lay = layouts(passes, sched.stage_device(), sched.num_devices)
    branches = _branches(passes, lay, num_microbatches, {(a.stage, a.op) for a in sched.actions})
    table = np.asarray(tick_plan.table)
    slots = tick_plan.slots
    d = axes.num_devices
    forward_ring = [(i, (i + 1) % d) for i in range(d)]
    backward_ring = [(i, (i - 1) % d) for i in range(d)]
    data = axes.data

    def local(param_entries, inputs, targets):
        params = [x[0] for x in param_entries]
        me = jax.lax.axis_index(axes.stage)
        state = {
            "res": lay.residuals.zeros(slots["residuals"] + 1),
            "w": lay.weights.zeros(slots["weights"] + 1),
            "act_in": lay.activations.zeros(slots["activations"] + 1),
            "ct_in": lay.cotangents.zeros(slots["cotangents"] + 1),
            "acc": [jnp.zeros_like(x) for x in params],
            "loss": jnp.zeros((), loss_dtype),
        }

        def tick(state, rows):
            row = jax.lax.dynamic_index_in_dim(rows, me, 0, keepdims=False)
            state, act_msg, ct_msg = jax.lax.switch(row[COL["branch"]], branches, state, row, params, inputs,
                                                    targets)
            if d > 1:
                act_msg = [jax.lax.ppermute(x, axes.stage, forward_ring) for x in act_msg]
                ct_msg = [jax.lax.ppermute(x, axes.stage, backward_ring) for x in ct_msg]
            state = dict(state, act_in=lay.activations.store(state["act_in"], row[COL["recv_act"]], act_msg),
                         ct_in=lay.cotangents.store(state["ct_in"], row[COL["recv_ct"]], ct_msg))
            return state, None

        state, _ = jax.lax.scan(tick, state, jnp.asarray(table))
        loss = jax.lax.psum(state["loss"], axes.stage) / num_microbatches
        grads = state["acc"]
        if data:
            loss = jax.lax.pmean(loss, data)
            grads = [jax.lax.pmean(g, data) for g in grads]
        return loss, [g[None] for g in grads]

    batch = P(None, data if len(data) > 1 else (data[0] if data else None))
    mapped = jax.shard_map(local, mesh=mesh, in_specs=(P(axes.stage), batch, batch), out_specs=(P(), P(axes.stage)),
                           axis_names=axes.manual, check_vma=False)

    def step(param_entries, inputs, targets):
        split = lambda x: x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])  # noqa: E731
        return mapped(list(param_entries), [split(x) for x in inputs], [split(t) for t in targets])

    return step, lay
