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
2. per tick (``lax.scan`` over the table), reads the records the table
   names (the residual or weight-argument slot, the activation or cotangent
   inbox) and runs its action with ``lax.switch`` over every stage's passes
   (idle, then F, B, W, BW of each stage): the branch runs the stage's
   partitioned program and returns what later ticks need, the parameter
   gradients and the messages it sends; the tick writes them back (unused
   writes go to the trash slot) and adds the gradients to the accumulator;
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


def layouts(passes: Sequence[StagePasses], stage_device: dict[int, int], num_devices: int,
            param_specs: Sequence[Sequence[Any]] | None = None) -> Layouts:
    """The records of these stages; ``param_specs``: per stage and parameter leaf, its sharding over the
    mesh's automatic axes (None: replicated)."""
    last = len(passes) - 1
    groups = [[s for s in range(len(passes)) if stage_device[s] == d] for d in range(num_devices)]
    return Layouts(
        params=L.union([p.param_avals for p in passes], groups, param_specs),
        residuals=L.union([p.stored_residuals for p in passes]),
        weights=L.union([p.stored_weight_args for p in passes]),
        activations=L.union([p.output_avals if s < last else [] for s, p in enumerate(passes)]),
        cotangents=L.union([[p.output_avals[i] for i in p.cotangent_outputs] if s < last else []
                            for s, p in enumerate(passes)]),
    )


@dataclasses.dataclass(frozen=True)
class Axes:
    """The mesh axes the step runs over: ``stage`` (the pipeline), ``data`` (batch shards, maybe empty) and
    ``auto`` (the rest: ``shard_map`` leaves them to XLA, which shards each stage's work over them as the
    parameters' shardings there say: tensor or FSDP parallelism inside a stage)."""

    stage: str
    data: tuple[str, ...]
    num_devices: int
    auto: tuple[str, ...] = ()

    @property
    def manual(self) -> frozenset:
        return frozenset((self.stage, *self.data))


def _branches(passes: Sequence[StagePasses], lay: Layouts, num_microbatches: int, used: set) -> list:
    """``lax.switch`` branches ``(records, row, params, inputs, targets) -> outputs``.

    ``records`` holds what the tick reads (``res``, ``w``: the residual and weight-argument records at
    the row's read slots; ``act``, ``ct``: the inbox records), ``outputs`` what it produces (``res``, ``w``:
    records to store; ``act``, ``ct``: the messages to send; ``grads``: a parameter record to add;
    ``loss``). The large buffers never pass through the switch: XLA would copy them in every branch
    that leaves them alone. Branch 0 is idle, then each stage's F, B, W, BW; an op the schedule never
    runs on a stage is idle too.
    """
    last = len(passes) - 1
    scale = np.asarray(1.0 / num_microbatches, passes[-1].output_avals[0].dtype)
    loss_dtype = passes[-1].output_avals[0].dtype

    def nothing(**produced):
        out = {"res": lay.residuals.zeros(), "w": lay.weights.zeros(), "act": lay.activations.zeros(),
               "ct": lay.cotangents.zeros(), "grads": lay.params.zeros(), "loss": jnp.zeros((), loss_dtype)}
        out.update(produced)
        return out

    def idle(recs, row, params, inputs, targets):
        return nothing()

    def forward(s):
        def run(recs, row, params, inputs, targets):
            m = row[COL["microbatch"]]
            if s == 0:
                acts = [jax.lax.dynamic_index_in_dim(x, m, 0, keepdims=False) for x in inputs]
            else:
                acts = lay.activations.unpack(s - 1, recs["act"])
            ts = [jax.lax.dynamic_index_in_dim(t, m, 0, keepdims=False) for t in targets] if s == last else []
            outs, stored = passes[s].forward(lay.params.unpack(s, params), acts, ts)
            res = lay.residuals.pack(s, stored)
            if s == last:
                return nothing(res=res, loss=outs[0].astype(loss_dtype))
            return nothing(res=res, act=lay.activations.pack(s, outs))
        return run

    def backward(s, op):
        def run(recs, row, params, inputs, targets):
            p = lay.params.unpack(s, params)
            stored = lay.residuals.unpack(s, recs["res"])
            cts = [scale] if s == last else lay.cotangents.unpack(s, recs["ct"])
            out = {}
            if op == "BW":
                grads, act_grads = passes[s].backward(p, stored, cts)
                out["grads"] = lay.params.pack(s, grads)
            else:
                act_grads, wstored = passes[s].backward_input(p, stored, cts)
                out["w"] = lay.weights.pack(s, wstored)
            if s > 0:
                prev = passes[s - 1]
                back = [jnp.zeros(prev.output_avals[i].shape, prev.output_avals[i].dtype) if act_grads[i] is None
                        else act_grads[i] for i in prev.cotangent_outputs]
                out["ct"] = lay.cotangents.pack(s - 1, back)
            return nothing(**out)
        return run

    def weight(s):
        def run(recs, row, params, inputs, targets):
            grads = passes[s].backward_weight(lay.params.unpack(s, params), lay.weights.unpack(s, recs["w"]))
            return nothing(grads=lay.params.pack(s, grads))
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
               num_microbatches: int, loss_dtype: Any, param_specs: Sequence[Sequence[Any]] | None = None):
    """``step(param_entries, inputs, targets) -> (loss, grad_entries)`` (see the module docstring; not jitted)."""
    sched = tick_plan.schedule
    lay = layouts(passes, sched.stage_device(), sched.num_devices, param_specs)
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
            recs = {"res": lay.residuals.fetch(state["res"], row[COL["res_read"]]),
                    "w": lay.weights.fetch(state["w"], row[COL["w_read"]]),
                    "act": lay.activations.fetch(state["act_in"], row[COL["act_read"]]),
                    "ct": lay.cotangents.fetch(state["ct_in"], row[COL["ct_read"]])}
            out = jax.lax.switch(row[COL["branch"]], branches, recs, row, params, inputs, targets)
            act_msg, ct_msg = out["act"], out["ct"]
            if d > 1:
                act_msg = [jax.lax.ppermute(x, axes.stage, forward_ring) for x in act_msg]
                ct_msg = [jax.lax.ppermute(x, axes.stage, backward_ring) for x in ct_msg]
            state = {
                "res": lay.residuals.store(state["res"], row[COL["res_write"]], out["res"]),
                "w": lay.weights.store(state["w"], row[COL["w_write"]], out["w"]),
                "act_in": lay.activations.store(state["act_in"], row[COL["recv_act"]], act_msg),
                "ct_in": lay.cotangents.store(state["ct_in"], row[COL["recv_ct"]], ct_msg),
                "acc": [a + g for a, g in zip(state["acc"], out["grads"])],
                "loss": state["loss"] + out["loss"],
            }
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
