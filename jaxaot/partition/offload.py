"""Offloading residuals to host memory: the third choice beside saving and recomputing.

A saved value may also travel to host memory (``memory_kind="pinned_host"``)
at the end of the forward and come back at the start of the backward: it then
costs the device no memory between the two, and the step no time as long as
both copies hide behind compute. This module decides which values go
(:func:`plan_offload`) and rewrites a :class:`~jaxaot.partition.Partition`'s
programs to move them (:func:`apply_offload`); the min-cut partitioner calls
both (``min_cut_rematerialization_partition(offload=...)``).

**The device.** A :class:`DeviceModel` gives the host link's bandwidth (bytes/s,
each direction), the device's FLOP/s (and optionally its memory bandwidth), a
latency per transfer and whether the backend has a host memory kind at all.
:meth:`DeviceModel.measure` times ``jax.device_put`` of a 64 MiB array to and
from ``pinned_host``, a tiny one (the latency), a matmul and a copy, once per
device kind and process (under a second on this project's CPU runner). On
the CPU backend "device" arrays already live in host memory, so offloading
would free nothing: ``has_host_memory`` is False and nothing is offloaded, and
the partition says so (``Partition.offload_note``).

**The timeline** (:class:`Timeline`). The joint graph's forward eqns, in order,
each take ``max(flops / device_flops, bytes / device_bandwidth)`` seconds
(:func:`jaxaot.partition.cost_model.flops`; fusible eqns count FLOPs alone), and
so do its backward eqns. A
value is *produced* when its eqn ends; the forward lasts ``forward_seconds``.
The backward *needs* a saved value at the start of the first backward eqn that
reads it, or reads a value recomputed from it (recomputation chains stop at
saved values), and the backward's own recomputation is taken to cost nothing
(so needs come no later than they would).

**The plan** (:func:`plan_offload`). Candidates are the saved *temporaries*
(not primal inputs nor real outputs, which are alive anyway) of at least
``min_bytes`` and of a numeric dtype. Largest first, a candidate is offloaded
when, with those already chosen, both copy queues still fit:

* to host, in production order, one at a time: each copy starts when its value
  is produced and the previous copy is done, and lasts ``latency + bytes /
  host_bandwidth``; the last must end by the end of the forward;
* to device, in order of need, one at a time from the backward's start: each
  must arrive by the time it is needed.

So only copies that overlap compute are chosen (the forward's early, large
activations; the last layer's are needed first by the backward and stay).
Cost: ``O(c^2 log c)`` for ``c`` candidates plus one pass over the eqns.

**The budget.** Offloaded bytes leave the device, so the device bytes
(``Partition.device_saved_bytes``, what the memory budget counts) are the saved
bytes less the offloaded ones. The min-cut then meets a budget by offloading
instead of recomputing where it can (:func:`jaxaot.partition.min_cut.offloaded_saved_nodes`).

**The programs** (:func:`apply_offload`). The forward ends with a
``jax.device_put(x, jax.memory.Space.Host)`` eqn per offloaded value and the
backward starts with one back to ``jax.memory.Space.Device`` (on GPUs XLA turns
them into asynchronous copies scheduled around compute, as for JAX's own
``offload`` checkpoint policies); the runtime compiles the backward for
``pinned_host`` residuals. Every consumer of the partition (the split and fused
executables, tracing under ``jit``/``vmap``) moves the same values.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from jaxaot.partition.offload import DeviceModel
    >>> def mlp(ws, x):
    ...     for w in ws:
    ...         x = jnp.tanh(x @ w)
    ...     return jnp.sum(x)
    >>> ws, x = [jnp.ones((256, 256)) / 256] * 4, jnp.ones((256, 256))
    >>> model = DeviceModel(host_bandwidth=50e9, device_flops=1e12)  # synthetic: no GPU needed
    >>> part = jaxaot.min_cut_rematerialization_partition(
    ...     jaxaot.trace_joint(mlp, ws, x), offload=True, device_model=model)
    >>> [r.offloaded for r in part.residuals if r.source == "temporary"]  # the last layers' are needed first
    [True, True, False, False]
    >>> part.device_saved_bytes < part.saved_bytes
    True
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot import _compat as C
from jaxaot._pytrees import in_host_memory
from jaxaot._pytrees import nbytes as aval_nbytes
from jaxaot.partition import cost_model
from jaxaot.errors import PartitionError
from jaxaot.partition.split import EqnKind, Partition, classify_eqns
from jaxaot.tracing.joint import JointGraph

#: Saved values smaller than this stay on the device: a transfer's fixed cost outweighs them.
DEFAULT_MIN_BYTES = 64 * 1024

#: The memory kind offloaded residuals live in.
HOST_MEMORY_KIND = "pinned_host"

_MEASURE_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    """What a transfer and an eqn cost on one device (see the module docstring).

    Attributes:
      host_bandwidth: bytes/s between device and host memory, each direction.
      device_flops: FLOP/s of the device's compute.
      has_host_memory: whether the backend has a host memory kind distinct from
        the device's (False: nothing is offloaded).
      device_bandwidth: bytes/s of device memory; eqns then cost at least their
        operands' and results' bytes over it (None: FLOPs alone).
      transfer_latency: seconds each transfer costs beside its bytes.
      note: why ``has_host_memory`` is False (the partition's ``offload_note``).
    """

    host_bandwidth: float
    device_flops: float
    has_host_memory: bool = True
    device_bandwidth: float | None = None
    transfer_latency: float = 0.0
    note: str = ""

    def transfer_seconds(self, nbytes: int) -> float:
        """Seconds one copy of ``nbytes`` takes, either way."""
        return self.transfer_latency + nbytes / self.host_bandwidth

    def eqn_seconds(self, eqn: Any) -> float:
        """Seconds the device spends on ``eqn``: FLOPs, or bytes moved where that is slower.

        Fusible eqns (``cost_model.Recompute.CHEAP``) count FLOPs alone: XLA
        fuses them into their neighbours' kernels, whose traffic is counted.
        """
        t = cost_model.flops(eqn) / self.device_flops
        if self.device_bandwidth and cost_model.classify(eqn) is not cost_model.Recompute.CHEAP:
            moved = sum(aval_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "shape"))
            t = max(t, moved / self.device_bandwidth)
        return t

    @classmethod
    def measure(cls, device: Any = None) -> "DeviceModel":
        """The model of ``device`` (default: ``jax.devices()[0]``), measured once per device kind and process."""
        device = jax.devices()[0] if device is None else device
        key = (device.platform, getattr(device, "device_kind", "?"))
        with _MEASURED_LOCK:
            model = _MEASURED.get(key)
            if model is None:
                with jax.ensure_compile_time_eval():  # the partitioner may run while a caller traces
                    model = _MEASURED[key] = _measure(device)
        return model


_MEASURED: dict[tuple[str, str], DeviceModel] = {}
_MEASURED_LOCK = threading.Lock()


def host_memory_note(device: Any) -> str:
    """Why ``device`` cannot offload (empty when it can)."""
    kinds = {m.kind for m in device.addressable_memories()}
    if device.platform == "cpu":
        return ("nothing offloaded: the cpu backend keeps device arrays in host memory, so a pinned_host copy "
                "would free no device memory")
    if HOST_MEMORY_KIND not in kinds:
        return (f"nothing offloaded: the {device.platform} backend has no {HOST_MEMORY_KIND} memory kind "
                f"({sorted(kinds)})")
    return ""


def _best_seconds(fn: Callable[[], Any], repeats: int = 3) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


def _per_step_seconds(step: Callable[[Any], Any], x: Any, n: int) -> float:
    """Seconds per call of ``step`` run ``n`` times in one program (dispatch and sync paid once, not per step)."""
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda i, x: step(x), x))
    one = jax.jit(step)
    return max((_best_seconds(lambda: loop(x)) - _best_seconds(lambda: one(x))) / (n - 1), 1e-9)


def _measure(device: Any) -> DeviceModel:
    note = host_memory_note(device)
    cpu = device.platform == "cpu"
    nbytes = _MEASURE_BYTES // (8 if cpu else 1)
    on_device = jax.sharding.SingleDeviceSharding(device)
    on_host = on_device.with_memory_kind(HOST_MEMORY_KIND)
    x = jax.device_put(np.zeros(nbytes // 4, np.float32), on_device)
    if HOST_MEMORY_KIND in {m.kind for m in device.addressable_memories()}:
        # In-program copies, as the offloaded programs make them; a tiny copy's time (dispatch) is subtracted.
        tiny = jax.device_put(np.zeros(1, np.float32), on_device)
        to_host = jax.jit(lambda a: a, out_shardings=on_host)
        to_device = jax.jit(lambda a: a, out_shardings=on_device)
        h, tiny_h = to_host(x), to_host(tiny)
        dispatch_out, dispatch_in = _best_seconds(lambda: to_host(tiny)), _best_seconds(lambda: to_device(tiny_h))
        seconds = max(_best_seconds(lambda: to_host(x)) - dispatch_out, _best_seconds(lambda: to_device(h)) - dispatch_in)
        bandwidth = nbytes / max(seconds, 1e-9)
        many = [tiny] * 8
        eight = jax.jit(lambda *a: a, out_shardings=(on_host,) * 8)
        latency = max((_best_seconds(lambda: eight(*many), repeats=5) - dispatch_out) / 7, 0.0)
    else:
        bandwidth, latency = 1.0, 0.0
    n, dtype = (512, jnp.float32) if cpu else (8192, jnp.bfloat16)
    a = jax.device_put(jnp.ones((n, n), dtype), on_device)
    matmul = jax.jit(lambda a: a @ a)
    flops = 2.0 * n**3 / _best_seconds(lambda: matmul(a))
    # Device memory: a copy kernel run 8 times in one program (a single call is mostly dispatch on a GPU).
    device_bandwidth = 2 * nbytes / _per_step_seconds(lambda v: jax.lax.optimization_barrier(v * 0.5 + 1.0), x, 8)
    return DeviceModel(host_bandwidth=bandwidth, device_flops=flops, has_host_memory=not note,
                       device_bandwidth=device_bandwidth, transfer_latency=latency, note=note)


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
    def of(cls, joint: JointGraph, model: DeviceModel) -> "Timeline":
        """The timeline of ``joint``'s eqns on ``model``'s device (one pass over the eqns)."""
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
                t_bwd += model.eqn_seconds(eqn)
                continue
            t_fwd += model.eqn_seconds(eqn)
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
    if not model.has_host_memory:
        return OffloadPlan((), 0, model.note or "nothing offloaded: the device model has no host memory")
    size = (lambda v: nbytes[v]) if nbytes is not None else (lambda v: aval_nbytes(v.aval))
    saved_set = set(saved)
    need = timeline.needed_at(saved_set)
    candidates = [v for v in saved_set if v in timeline.produced and v not in timeline.outputs and v in need
                  and size(v) >= min_bytes and offloadable_dtype(v.aval) and not in_host_memory(v.aval)]
    candidates.sort(key=lambda v: (-size(v), timeline.order[v]))
    chosen: list = []
    items: list[tuple[float, float, float]] = []
    for v in candidates:
        item = (timeline.produced[v], need[v], model.transfer_seconds(size(v)))
        if _fits(items + [item], timeline.forward_seconds):
            chosen.append(v)
            items.append(item)
    chosen.sort(key=timeline.order.__getitem__)
    note = "" if chosen else "nothing offloaded: no saved value's transfers fit in the compute that overlaps them"
    return OffloadPlan(tuple(chosen), sum(size(v) for v in chosen), note)


# --------------------------------------------------------------------------- programs
def saved_vars(part: Partition) -> list:
    """The joint-jaxpr vars ``part`` saves, in residual order (the backward's inputs after the cotangents).

    Valid for partitions :func:`~jaxaot.partition.split_joint` built, whose
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
    :class:`~jaxaot.partition.Residual` says ``offloaded``. The programs keep
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
    if offload is False or offload is None:
        return None
    if offload is not True and offload != "auto":
        raise PartitionError(f"offload must be False, True or 'auto', got {offload!r}.")
    if device_model is not None and not all(hasattr(device_model, a) for a in ("host_bandwidth", "has_host_memory")):
        raise PartitionError(f"device_model must be a DeviceModel, got {type(device_model).__name__}.")
    return device_model if device_model is not None else DeviceModel.measure()
