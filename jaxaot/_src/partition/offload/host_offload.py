"""Offloading residuals to host memory: the third choice beside saving and recomputing.

A saved value moved to ``pinned_host`` after the forward and back before the
backward costs the device no memory in between, and no time while both copies hide
behind compute. :func:`plan_offload` picks the largest saved temporaries whose
copies, queued one at a time each way on the :class:`Timeline` of the eqns' costs,
finish before the forward ends and before the backward needs them, and no more
than the compiler keeps in flight (``DeviceModel.copy_slots``).
:func:`apply_offload` rewrites the programs with ``jax.device_put`` to and from host;
the min-cut meets a budget by offloading before recomputing.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot._src.partition import DeviceModel
    >>> def mlp(ws, x):
    ...     for w in ws:
    ...         x = jnp.tanh(x @ w)
    ...     return jnp.sum(x)
    >>> ws, x = [jnp.ones((256, 256)) / 256] * 4, jnp.ones((256, 256))
    >>> model = DeviceModel(host_bandwidth=50e9, device_flops=1e12)  # synthetic: no GPU needed
    >>> part = jaxaot.partition.min_cut_rematerialization_partition(
    ...     jaxaot.partition.trace_joint(mlp, ws, x), offload=True, device_model=model)
    >>> [r.offloaded for r in part.residuals if r.source == "temporary"]  # the last layers' are needed first
    [True, True, False, False]
    >>> part.device_saved_bytes < part.saved_bytes
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import in_host_memory
from jaxaot._src.pytrees import nbytes as aval_nbytes
from jaxaot.errors import PartitionError
from jaxaot._src.partition.core import EqnKind, Partition, classify_eqns
from jaxaot._src.partition.costs import HOST_MEMORY_KIND, MIN_OVERLAP, DeviceModel, OpCosts, host_memory_note
from jaxaot._src.tracing import JointGraph

#: Saved values smaller than this stay on the device: a transfer's fixed cost outweighs them.
DEFAULT_MIN_BYTES = 64 * 1024

# --------------------------------------------------------------------------- timeline
@dataclasses.dataclass(frozen=True)
class Timeline:
    """When each forward value of a joint graph is produced, and when the backward reads it (seconds).

    Attributes:
      order: per forward value (a var of the joint jaxpr: primal inputs first), its position in the forward.
      produced: per value a forward eqn computes, seconds into the forward when that eqn ends.
      forward_seconds / backward_seconds: the two halves' estimated lengths.
      direct_reads: per forward value, seconds into the backward when a backward
        eqn first reads it (the gradients' outputs read at the end).
      forward_eqns: per forward eqn, ``(forward values it reads, values it writes)``.
      outputs: the real outputs (alive anyway: never offloaded).
    """

    order: Mapping[Any, int]
    produced: Mapping[Any, float]
    forward_seconds: float
    backward_seconds: float
    direct_reads: Mapping[Any, float]
    forward_eqns: tuple[tuple[tuple, tuple], ...]
    outputs: frozenset

    @classmethod
    def of(cls, joint: JointGraph, model: DeviceModel, costs: OpCosts | None = None) -> "Timeline":
        """The timeline of ``joint``'s eqns on ``model``'s device (one pass over the eqns).

        ``costs`` (an :class:`~jaxaot._src.partition.costs.op_costs.OpCosts`) times each
        eqn; default: ``model``'s FLOP estimates (:meth:`DeviceModel.eqn_seconds`).
        """
        seconds = model.eqn_seconds if costs is None else costs.seconds
        jaxpr = C.jaxpr_of(joint.jaxpr)
        order: dict = {v: i for i, v in enumerate(jaxpr.invars[: joint.num_primals])}
        produced: dict = {}
        reads: dict = {}
        fwd_eqns = []
        t_fwd = t_bwd = 0.0
        for eqn, kind in zip(jaxpr.eqns, classify_eqns(joint)):
            if kind is EqnKind.CONSTANT:
                continue
            ins = tuple(v for v in eqn.invars if not C.is_literal(v) and v in order)
            if kind is EqnKind.BACKWARD:
                for v in ins:
                    reads.setdefault(v, t_bwd)
                t_bwd += seconds(eqn)
                continue
            t_fwd += seconds(eqn)
            outs = tuple(v for v in eqn.outvars if not C.is_drop_var(v))
            for v in outs:
                order[v] = len(order)
                produced[v] = t_fwd
            fwd_eqns.append((ins, outs))
        for v in jaxpr.outvars[joint.num_outputs:]:
            if not C.is_literal(v) and v in order:
                reads.setdefault(v, t_bwd)
        outputs = frozenset(v for v in jaxpr.outvars[: joint.num_outputs] if not C.is_literal(v))
        return cls(order, produced, t_fwd, t_bwd, reads, tuple(fwd_eqns), outputs)

    def needed_at(self, saved: set) -> dict:
        """Per forward value, seconds into the backward when it is first needed, ``saved`` being saved.

        A value that is not saved is recomputed when first needed, so the values
        it is recomputed from are needed then too; the chain stops at saved values.
        """
        need = dict(self.direct_reads)
        for ins, outs in reversed(self.forward_eqns):
            t = min((need.get(o, math.inf) for o in outs if o not in saved), default=math.inf)
            if t < math.inf:
                for v in ins:
                    if t < need.get(v, math.inf):
                        need[v] = t
        return need

    def windows(self, saved: set) -> dict:
        """Per value the forward computes, ``(seconds from its production to the forward's end, seconds
        from the backward's start to its first need)``, ``saved`` being saved: the compute each of its
        copies may hide behind when it is offloaded alone (``DeviceModel.headroom`` is in these units)."""
        need = self.needed_at(saved)
        return {v: (self.forward_seconds - t, need.get(v, math.inf)) for v, t in self.produced.items()}


# --------------------------------------------------------------------------- plan
@dataclasses.dataclass(frozen=True)
class OffloadPlan:
    """Which saved values go to host memory.

    Attributes:
      offloaded: the offloaded vars of the joint jaxpr, in forward order.
      nbytes: their bytes (as the planner counted them: per device on a mesh).
      note: why nothing is offloaded (empty when something is).
    """

    offloaded: tuple
    nbytes: int
    note: str = ""


def offloadable_dtype(aval: Any) -> bool:
    """Whether a value of ``aval`` can live in host memory (numbers; not PRNG keys nor float0)."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) and dtype != jax.dtypes.float0


def _fits(items: Sequence[tuple[float, float, float]], forward_seconds: float) -> bool:
    """Whether ``(produced, needed, copy seconds)`` items fit both copy queues (module docstring)."""
    t = 0.0
    for produced, _, copy in sorted(items, key=lambda it: it[0]):
        t = max(t, produced) + copy
        if t > forward_seconds:
            return False
    t = 0.0
    for _, needed, copy in sorted(items, key=lambda it: it[1]):
        t += copy
        if t > needed:
            return False
    return True


def plan_offload(timeline: Timeline, saved: Sequence[Any], model: DeviceModel,
                 nbytes: Mapping[Any, int] | None = None, *, min_bytes: int = DEFAULT_MIN_BYTES) -> OffloadPlan:
    """The saved values to offload: largest first, while both copy queues fit (module docstring).

    Args:
      timeline: the :class:`Timeline` of the joint graph ``saved`` belongs to.
      saved: the saved vars of that joint jaxpr.
      model: the device; without host memory nothing is offloaded.
      nbytes: bytes per var (per device on a mesh); default the vars' own.
      min_bytes: smaller values stay on the device.
    """
    if model.offload_note:
        return OffloadPlan((), 0, model.offload_note)
    size = (lambda v: nbytes[v]) if nbytes is not None else (lambda v: aval_nbytes(v.aval))
    saved_set = set(saved)
    need = timeline.needed_at(saved_set)
    candidates = [v for v in saved_set if v in timeline.produced and v not in timeline.outputs and v in need
                  and size(v) >= min_bytes and offloadable_dtype(v.aval) and not in_host_memory(v.aval)]
    candidates.sort(key=lambda v: (-size(v), timeline.order[v]))
    chosen: list = []
    items: list[tuple[float, float, float]] = []
    for v in candidates:
        if len(chosen) >= model.max_offloaded:
            break  # no more values than copies the compiler keeps in flight (module docstring)
        item = (timeline.produced[v], need[v], model.hidden_seconds(size(v)))
        if _fits(items + [item], timeline.forward_seconds):
            chosen.append(v)
            items.append(item)
    chosen.sort(key=timeline.order.__getitem__)
    note = "" if chosen else "nothing offloaded: no saved value's transfers fit in the compute that overlaps them"
    return OffloadPlan(tuple(chosen), sum(size(v) for v in chosen), note)


# --------------------------------------------------------------------------- programs
def saved_vars(part: Partition) -> list:
    """The joint-jaxpr vars ``part`` saves, in residual order (the backward's inputs after the cotangents).

    Valid for partitions :func:`~jaxaot._src.partition.split_joint` built, whose
    backward takes exactly the saved vars of the joint jaxpr, and for those
    :func:`apply_offload` then rewrote: an offloaded residual's backward input
    is a new host-memory var, and the joint var is what its copy back writes.
    """
    j = C.jaxpr_of(part.backward)
    ins = list(j.invars[len(part.cotangent_outputs):])
    n_copies = sum(r.offloaded and not r.in_joint_host for r in part.residuals)  # apply_offload's copies come first
    back = {e.invars[0]: e.outvars[0] for e in j.eqns[:n_copies]}
    return [back.get(v, v) for v in ins]


def _transfer_eqn(aval: Any, space: Any) -> Any:
    """A one-eqn ``jax.device_put(x, space)`` of a value of ``aval``, its invar and outvar fresh vars."""
    closed = jax.make_jaxpr(lambda x: jax.device_put(x, space, may_alias=False))(aval)
    (eqn,) = C.jaxpr_of(closed).eqns
    return eqn


def _outputs_to_host(closed: Any, outputs: set[int]) -> Any:
    """``closed`` ending with a copy of each output at ``outputs`` to host memory (its eqns kept as they are)."""
    j = C.jaxpr_of(closed)
    outvars, copies = list(j.outvars), []
    for i in sorted(outputs):
        t = _transfer_eqn(outvars[i].aval, jax.memory.Space.Host)
        copies.append(C.new_eqn([outvars[i]], t.outvars, t.primitive, t.params, t.effects, t))
        outvars[i] = t.outvars[0]
    return C.make_closed_jaxpr(j.constvars, j.invars, outvars, [*j.eqns, *copies], C.consts_of(closed))


def _inputs_from_host(closed: Any, inputs: set[int]) -> Any:
    """``closed`` taking each input at ``inputs`` in host memory and starting with its copy to the device."""
    j = C.jaxpr_of(closed)
    invars, copies = list(j.invars), []
    for i in sorted(inputs):
        t = _transfer_eqn(invars[i].aval.update(memory_space=jax.memory.Space.Host), jax.memory.Space.Device)
        copies.append(C.new_eqn(t.invars, [invars[i]], t.primitive, t.params, t.effects, t))
        invars[i] = t.invars[0]
    return C.make_closed_jaxpr(j.constvars, invars, j.outvars, [*copies, *j.eqns], C.consts_of(closed))


def apply_offload(part: Partition, offloaded: Sequence[int], note: str = "") -> Partition:
    """``part`` with the residuals at positions ``offloaded`` moved to host memory between its programs.

    The forward ends by copying each to ``pinned_host`` (a ``jax.device_put`` to
    ``jax.memory.Space.Host`` eqn: XLA schedules the copy as soon as the value
    exists), the backward takes it there and starts by copying it back, and its
    :class:`~jaxaot._src.partition.Residual` says ``offloaded``. The programs keep
    their eqns (and so their vars and source lines): the copies are spliced in,
    and the backward's offloaded inputs become new host-memory vars. Only temporaries can
    go: inputs and real outputs are alive on the device anyway. ``note`` becomes
    ``offload_note`` (why nothing was offloaded).
    """
    positions = sorted(j for j in set(offloaded) if not part.residuals[j].offloaded)  # already there: nothing to do
    if not positions:
        return dataclasses.replace(part, offload_note=note)
    n_in, n_ct = len(part.saved_inputs), len(part.cotangent_outputs)
    bad = [j for j in positions if part.residuals[j].source != "temporary"]
    if bad:
        raise PartitionError(f"only temporaries can be offloaded; residuals {bad} are inputs or outputs.")
    forward = _outputs_to_host(part.forward, {part.saved_outputs[j - n_in] for j in positions})
    backward = _inputs_from_host(part.backward, {n_ct + j for j in positions})
    residuals = tuple(dataclasses.replace(r, offloaded=True) if j in positions else r
                      for j, r in enumerate(part.residuals))
    return dataclasses.replace(part, forward=forward, backward=backward, residuals=residuals, offload_note="")


def offload_partition(joint: JointGraph, part: Partition, model: DeviceModel, *,
                      min_bytes: int = DEFAULT_MIN_BYTES) -> Partition:
    """Plan (:func:`plan_offload`) and apply (:func:`apply_offload`) offloading on a partition of ``joint``.

    A post-pass for any partitioner's product (``default_partition``'s too): it
    keeps the saved set and only moves some of it to host memory.
    """
    source = part.split_from if part.split_from is not None else joint  # the graph its vars belong to
    saved = saved_vars(part)
    plan = plan_offload(Timeline.of(source, model), saved, model, min_bytes=min_bytes)
    position = {v: j for j, v in enumerate(saved)}
    return apply_offload(part, [position[v] for v in plan.offloaded], plan.note)


def resolve_model(offload: bool | str, device_model: DeviceModel | None) -> DeviceModel | None:
    """The model a partitioner plans with: None when ``offload`` is False, else ``device_model`` or the measured one.

    ``offload`` is False, True or ``"auto"``; True and ``"auto"`` differ in
    nothing but intent: both measure the default device when no model is given.
    """
    check_offload(offload, device_model)
    if offload is False or offload is None:
        return None
    return device_model if device_model is not None else DeviceModel.measure()


def check_offload(offload: bool | str, device_model: DeviceModel | None) -> None:
    """Refuse an ``offload`` other than False, True or ``"auto"``, and a ``device_model`` that is no DeviceModel."""
    if offload is not False and offload is not None and offload is not True and offload != "auto":
        raise PartitionError(f"offload must be False, True or 'auto', got {offload!r}.")
    if device_model is not None and not all(hasattr(device_model, a) for a in ("host_bandwidth", "has_host_memory")):
        raise PartitionError(f"device_model must be a DeviceModel, got {type(device_model).__name__}.")
