"""The whole pipeline step as one SPMD program: ``shard_map`` over the stage axis, a loop over ticks.

:func:`build_step` turns a :class:`~jaxaot._src.parallel.spmd.ticks.TickPlan` and the
stages' :class:`~jaxaot._src.parallel.spmd.passes.StagePasses` into one function of
the packed parameters, inputs and targets. Each device scans the tick table, runs
its action under a ``lax.cond`` that writes its buffers in place (a switch would
copy them), and passes records around the ring with ``lax.ppermute``; loss and
gradients are reduced over the stage and data axes at the end. The program does
not grow with the microbatch count, and each tick waits for its slowest device
(:func:`jaxaot._src.parallel.simulator.simulate_lockstep`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src.parallel.schedule import OPS
from jaxaot._src.parallel.spmd import layout as L
from jaxaot._src.parallel.spmd.passes import StagePasses
from jaxaot._src.parallel.spmd.ticks import COL, TickPlan, branch_of

P = jax.sharding.PartitionSpec


@dataclasses.dataclass(frozen=True)
class Layouts:
    """The records of one compiled pipeline.

    Attributes:
      params: each device's parameters (the stages it hosts share a record); gradients use it too.
      residuals / weights: one microbatch's stored residuals / W arguments, per stage.
      activations: the message stage ``s`` sends forward (its outputs), keyed by ``s``.
      cotangents: the message stage ``s`` receives from ``s + 1`` (its outputs' cotangents), keyed by ``s``.
      groups: per device, the stages it hosts.
    """

    params: L.Layout
    residuals: L.Layout
    weights: L.Layout
    activations: L.Layout
    cotangents: L.Layout
    groups: tuple = ()

    def ideal_bytes(self, slots: dict) -> int:
        """The least a device of one SPMD program can hold, in bytes: the largest device's parameters and
        their gradients, ``slots`` (the tick plan's, per kind) times the largest stage's residual and
        W-argument records, and one message each way. Leaves only: no alignment, no temporaries, no inputs."""
        def largest(lay: L.Layout, groups=None) -> int:
            groups = groups or [[s] for s in range(len(lay.places))]
            return max((sum(lay.stage_nbytes(s) for s in g) for g in groups), default=0)
        return (2 * largest(self.params, self.groups) + slots["residuals"] * largest(self.residuals)
                + slots["weights"] * largest(self.weights) + largest(self.activations) + largest(self.cotangents))


def layouts(passes: Sequence[StagePasses], stage_device: dict[int, int], num_devices: int,
            param_specs: Sequence[Sequence[Any]] | None = None) -> Layouts:
    """The records of these stages; ``param_specs``: per stage and parameter leaf, its sharding over the
    mesh's automatic axes (None: replicated)."""
    last = len(passes) - 1
    groups = [[s for s in range(len(passes)) if stage_device[s] == d] for d in range(num_devices)]
    return Layouts(
        params=L.build([p.param_avals for p in passes], groups, param_specs),
        residuals=L.build([p.stored_residuals for p in passes]),
        weights=L.build([p.stored_weight_args for p in passes]),
        activations=L.build([p.output_avals if s < last else [] for s, p in enumerate(passes)]),
        cotangents=L.build([[p.output_avals[i] for i in p.cotangent_outputs] if s < last else []
                            for s, p in enumerate(passes)]),
        groups=tuple(tuple(g) for g in groups),
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


#: What each op reads, read-only, of the loop's state (beside the parameters, inputs and targets).
READS = {"F": ("act_in",), "B": ("res", "ct_in"), "BW": ("res", "ct_in"), "W": ("w",)}


def writes(stage: int, op: str, last: int) -> tuple[str, ...]:
    """What ``op`` on ``stage`` writes of the loop's state: only what it produces."""
    if op == "F":
        return ("res", "loss") if stage == last else ("res", "act_out")
    if op == "W":
        return ("acc",)
    return ("w" if op == "B" else "acc",) + (("ct_out",) if stage > 0 else ())


def _action(passes: Sequence[StagePasses], lay: Layouts, num_microbatches: int, stage: int, op: str, pin=None):
    """``run(own, seen, row, params, inputs, targets) -> own``: ``op`` on ``stage``, as a ``lax.cond`` branch.

    ``own`` holds the state it writes (:func:`writes`), ``seen`` what it reads (:data:`READS`); both hold
    whole buffers, but the branch slices out only its own leaves and updates only those it produced.
    ``pin``: :func:`leaf_pinner`'s, for every leaf read from or written to a record.
    """
    s, last = stage, len(passes) - 1
    loss_dtype = passes[-1].output_avals[0].dtype
    scale = np.asarray(1.0 / num_microbatches, loss_dtype)
    ps = passes[s]

    def forward(own, seen, row, params, inputs, targets):
        m = row[COL["microbatch"]]
        if s == 0:
            acts = [jax.lax.dynamic_index_in_dim(x, m, 0, keepdims=False) for x in inputs]
        else:
            acts = lay.activations.read(s - 1, seen["act_in"], row[COL["act_read"]], pin)
        ts = [jax.lax.dynamic_index_in_dim(t, m, 0, keepdims=False) for t in targets] if s == last else []
        outs, stored = ps.forward(lay.params.read(s, params, pin=pin), acts, ts)
        own = dict(own, res=lay.residuals.write(s, own["res"], stored, row[COL["res_write"]], pin=pin))
        if s == last:
            own["loss"] = own["loss"] + outs[0].astype(loss_dtype)
        else:
            own["act_out"] = lay.activations.write(s, own["act_out"], outs, pin=pin)
        return own

    def send_back(own, act_grads):
        if s == 0:
            return own
        prev = passes[s - 1]
        back = [jnp.zeros(prev.output_avals[i].shape, prev.output_avals[i].dtype) if act_grads[i] is None
                else act_grads[i] for i in prev.cotangent_outputs]
        return dict(own, ct_out=lay.cotangents.write(s - 1, own["ct_out"], back, pin=pin))

    def backward(own, seen, row, params, inputs, targets):
        p = lay.params.read(s, params, pin=pin)
        stored = lay.residuals.read(s, seen["res"], row[COL["res_read"]], pin)
        cts = [scale] if s == last else lay.cotangents.read(s, seen["ct_in"], row[COL["ct_read"]], pin)
        if op == "BW":
            grads, act_grads = ps.backward(p, stored, cts)
            own = dict(own, acc=lay.params.add(s, own["acc"], grads, pin))
        else:
            act_grads, wstored = ps.backward_input(p, stored, cts)
            own = dict(own, w=lay.weights.write(s, own["w"], wstored, row[COL["w_write"]], pin=pin))
        return send_back(own, act_grads)

    def weight(own, seen, row, params, inputs, targets):
        grads = ps.backward_weight(lay.params.read(s, params, pin=pin),
                                   lay.weights.read(s, seen["w"], row[COL["w_read"]], pin))
        return dict(own, acc=lay.params.add(s, own["acc"], grads, pin))

    return forward if op == "F" else weight if op == "W" else backward


def _keep(own, *_):
    return own


#: The layout of each buffer of the loop's state (``params``: the parameters the passes read).
LAYOUT_OF = {"res": "residuals", "w": "weights", "act_in": "activations", "act_out": "activations",
             "ct_in": "cotangents", "ct_out": "cotangents", "acc": "params", "params": "params"}


def leaf_pinner(auto: Sequence[str]):
    """``pin(x, spec) -> x`` constrained as ``spec`` says over the mesh's automatic axes (None: replicated), or
    None without automatic axes: a leaf taken out of a record, or put into one, keeps its entry's layout, so
    XLA slices the record where each device holds it (:func:`pinner` says why)."""
    if not auto:
        return None
    return lambda x, spec: jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(), P(*(spec or ()))))


def pinner(lay: Layouts, auto: Sequence[str]):
    """``pin(buffers) -> buffers``, for a dict of the loop's buffers (:data:`LAYOUT_OF`; others are scalars): each
    constrained over the mesh's automatic axes, an entry's cells as its spec says and everything else replicated.

    Left to itself, XLA may split a flat record over those axes (to match a sharded leaf beside it); a stage
    slicing its leaves out of it inside its ``lax.cond`` branch then exchanges pieces with a collective that the
    other stages' devices, in other branches, never join, and the step hangs. Pinned buffers on both sides of
    every branch keep the branches free of such resharding. Without automatic axes there is nothing to pin.
    """
    if not auto:
        return lambda buffers: buffers

    def pin_entries(xs: Sequence[jax.Array], layout: L.Layout) -> list:
        mesh = jax.sharding.get_abstract_mesh()
        out = []
        for e, x in enumerate(xs):
            spec = tuple(layout.specs[e] or ()) if layout.specs else ()
            sharding = jax.sharding.NamedSharding(mesh, P(*(None,) * (x.ndim - len(spec)), *spec))
            out.append(jax.lax.with_sharding_constraint(x, sharding))
        return out

    def pin(buffers: dict) -> dict:
        mesh = jax.sharding.get_abstract_mesh()
        return {k: pin_entries(v, getattr(lay, LAYOUT_OF[k])) if k in LAYOUT_OF
                else jax.lax.with_sharding_constraint(v, jax.sharding.NamedSharding(mesh, P()))
                for k, v in buffers.items()}

    return pin


def _counted(run, pin):
    """``run``, counting the actions taken in ``own["taken"]``: every cond writes it, so the conds run in
    program order and before the inboxes are stored (a buffer a cond reads and a later op writes in place,
    unordered, would be copied). What it reads and writes is pinned (:func:`pinner`)."""
    def counted(own, seen, row, params, inputs, targets):
        own, seen, params = pin(own), pin(seen), pin({"params": params})["params"]
        return pin(dict(run(own, seen, row, params, inputs, targets), taken=own["taken"] + 1))
    return counted


def _phase(op: str, actions: list, pin):
    """``run(state, row, params, inputs, targets) -> what it writes of state``: the conds of ``op`` on each stage,
    ``(branch, writes, run)`` in ``actions``, one after the other, inside one more cond taken only where the
    row's action is an ``op`` (where there are several), so that a tick tests a few phases and the stages of
    one, not every stage and op. Conds nested so, each with one writing branch, keep the buffers in place."""
    own_keys = tuple(dict.fromkeys(k for _, keys, _ in actions for k in keys)) + ("taken",)
    seen_keys = READS[op]
    op_index = OPS.index(op)

    def chain(own, seen, row, params, inputs, targets):
        own = pin(own)
        for branch, keys, run in actions:
            mine = pin({k: own[k] for k in keys + ("taken",)})
            own.update(jax.lax.cond(row[COL["branch"]] == branch, run, _keep, mine, seen, row, params, inputs,
                                    targets))
        return own

    def phase(state, row, params, inputs, targets):
        own = pin({k: state[k] for k in own_keys})
        seen = pin({k: state[k] for k in seen_keys})
        if len(actions) == 1:
            return chain(own, seen, row, params, inputs, targets)
        branch = row[COL["branch"]]
        this_op = (branch > 0) & ((branch - 1) % len(OPS) == op_index)
        return jax.lax.cond(this_op, chain, _keep, own, seen, row, params, inputs, targets)

    return phase


def _reduce(op, x: jax.Array, axis: Any) -> jax.Array:
    """``op(x, axis)`` (``psum``, ``pmean``) for a float ``x``, in float32 where ``x`` is narrower (XLA's CPU
    all-reduce promotion of 16-bit floats aborts on a mesh with automatic axes, and float32 sums round less);
    an integer or key entry's gradient is zeros (float0 outside) and is left as it is (a mean would make it float)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    if jnp.finfo(x.dtype).bits < 32:
        return op(x.astype(jnp.float32), axis).astype(x.dtype)
    return op(x, axis)


def _store(buffers: Sequence[jax.Array], slot: Any, record: Sequence[jax.Array]) -> list[jax.Array]:
    """``buffers`` with a whole received record written at ``slot``."""
    return [jax.lax.dynamic_update_index_in_dim(b, r, slot, 0) for b, r in zip(buffers, record)]


def build_step(tick_plan: TickPlan, passes: Sequence[StagePasses], mesh: jax.sharding.Mesh, axes: Axes,
               num_microbatches: int, loss_dtype: Any, param_specs: Sequence[Sequence[Any]] | None = None):
    """``step(param_entries, inputs, targets) -> (loss, grad_entries)`` (see the module docstring; not jitted)."""
    sched = tick_plan.schedule
    lay = layouts(passes, sched.stage_device(), sched.num_devices, param_specs)
    last = len(passes) - 1
    used = {(a.stage, a.op) for a in sched.actions}
    pin = pinner(lay, axes.auto)
    phases = []
    for op in OPS:
        actions = [(branch_of(s, op), writes(s, op, last),
                    _counted(_action(passes, lay, num_microbatches, s, op, leaf_pinner(axes.auto)), pin))
                   for s in range(len(passes)) if (s, op) in used]
        if actions:
            phases.append(_phase(op, actions, pin))
    table = np.asarray(tick_plan.table)
    slots = tick_plan.slots
    d = axes.num_devices
    forward_ring = [(i, (i + 1) % d) for i in range(d)]
    backward_ring = [(i, (i - 1) % d) for i in range(d)]
    data = axes.data

    def local(param_entries, inputs, targets):
        params = pin({"params": [x[0] for x in param_entries]})["params"]
        me = jax.lax.axis_index(axes.stage)
        state = {
            # a slot is read only after it is written (a message's unused cells go to the trash slot)
            "res": lay.residuals.empty(slots["residuals"]),
            "w": lay.weights.empty(slots["weights"]),
            "act_in": lay.activations.empty(slots["activations"] + 1),  # + the trash slot
            "ct_in": lay.cotangents.empty(slots["cotangents"] + 1),
            "act_out": lay.activations.empty(),
            "ct_out": lay.cotangents.empty(),
            "acc": [jnp.zeros_like(x) for x in params],
            "loss": jnp.zeros((), loss_dtype),
            "taken": jnp.zeros((), jnp.int32),
        }
        state = pin(state)

        def tick(state, rows):
            row = jax.lax.dynamic_index_in_dim(rows, me, 0, keepdims=False)
            state = pin(state)
            for phase in phases:
                state.update(phase(state, row, params, inputs, targets))
            act_msg, ct_msg = state["act_out"], state["ct_out"]
            if d > 1:
                act_msg = [jax.lax.ppermute(x, axes.stage, forward_ring) for x in act_msg]
                ct_msg = [jax.lax.ppermute(x, axes.stage, backward_ring) for x in ct_msg]
            # ``after`` is 0, but a value of the last cond: the inboxes are written after every cond read them
            after = jnp.minimum(state["taken"], 0)
            state["act_in"] = _store(state["act_in"], row[COL["recv_act"]] + after, act_msg)
            state["ct_in"] = _store(state["ct_in"], row[COL["recv_ct"]] + after, ct_msg)
            return pin(state), None

        state, _ = jax.lax.scan(tick, state, jnp.asarray(table))
        loss = _reduce(jax.lax.psum, state["loss"], axes.stage) / num_microbatches
        grads = state["acc"]
        if data:
            loss = _reduce(jax.lax.pmean, loss, data)
            grads = [_reduce(jax.lax.pmean, g, data) for g in grads]
        return loss, [g[None] for g in grads]

    batch = P(None, data if len(data) > 1 else (data[0] if data else None))
    mapped = jax.shard_map(local, mesh=mesh, in_specs=(P(axes.stage), batch, batch), out_specs=(P(), P(axes.stage)),
                           axis_names=axes.manual, check_vma=False)

    def step(param_entries, inputs, targets):
        split = lambda x: x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])  # noqa: E731
        return mapped(list(param_entries), [split(x) for x in inputs], [split(t) for t in targets])

    return step, lay
