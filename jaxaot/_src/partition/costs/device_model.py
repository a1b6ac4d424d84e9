"""What offloading costs on one device: :class:`DeviceModel`, measured once per device kind.

A :class:`DeviceModel` gives the host link's bandwidth, the device's FLOP/s, a
latency per transfer, how much of a copy compute hides between programs
(``overlap``) and inside a scan (``scan_overlap``), the copies XLA keeps in flight
(``copy_slots``) and whether the backend has host memory at all.
:meth:`DeviceModel.measure` times these in-program, once per device kind and
process. On CPU, arrays already live in host memory, so nothing is offloaded and
the partition says so.

Example:
    >>> from jaxaot._src.partition import DeviceModel
    >>> link = DeviceModel(host_bandwidth=50e9, device_flops=1e15, transfer_latency=1e-5, overlap=0.8)
    >>> round(link.transfer_seconds(50 * 10**6) * 1e3, 3)  # ms for 50 MB
    1.01
    >>> round(link.hidden_seconds(50 * 10**6) * 1e3, 3)  # ms of compute it needs beside it to stay hidden
    1.262
    >>> DeviceModel(host_bandwidth=50e9, device_flops=1e15, overlap=0.1).offload_note[:40]
    'nothing offloaded: copies to host memory'
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.allowance import holding
from jaxaot._src.partition.costs.autotune_bytes import REDZONE_BYTES, compile_untuned, compiles_untuned
from jaxaot._src.partition.costs.copy_slots import measure_copy_slots
from jaxaot._src.partition.costs.op_costs import FlopCosts

#: Below this overlap (:attr:`DeviceModel.overlap`) copies are not hidden enough to plan with: nothing is offloaded.
MIN_OVERLAP = 0.5

#: The :attr:`DeviceModel.headroom` of a measured device: values whose timeline windows held barely
#: more than their copies still cost step time offloaded, and without a margin such a value was chosen
#: or not as the measured bandwidth varied between runs (``docs/benchmarks.md``, "Copy headroom").
MEASURED_HEADROOM = 1.25

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
      overlap: the fraction of a copy's time that compute running beside it
        hides (1: copies are free while compute lasts, 0: they add their whole
        time). A copy then takes up ``transfer_seconds / overlap`` of the compute
        it overlaps, and below :data:`MIN_OVERLAP` nothing is offloaded.
      note: why ``has_host_memory`` is False (the partition's ``offload_note``).
      scan_overlap: the same fraction for copies made inside a ``lax.scan``
        body, one slice per iteration (``docs/concepts/memory_planner.md``, "Offloading to host memory").
      copy_slots: how many copies the compiler keeps in flight at once in one
        program (read off a small compiled program's schedule): the planner offloads at
        most this many values, the largest (None: no limit).
      headroom: how much longer than a copy (after ``overlap``) the compute
        beside it must last for the planner to count it hidden (1: exactly as
        long). The timeline's estimates of when a value is produced and needed
        are estimates; :meth:`measure` sets :data:`MEASURED_HEADROOM`.

    Each field is checked when the model is built: an
    :class:`~jaxaot.errors.InvalidInputError` names a field of the wrong kind (a
    string for a rate, say), an :class:`~jaxaot.errors.InvalidValueError` a value
    out of range (a rate that is not positive and finite, an ``overlap`` outside
    ``[0, 1]``, ``copy_slots`` below 1, a ``headroom`` that is not positive).
    """

    host_bandwidth: float
    device_flops: float
    has_host_memory: bool = True
    device_bandwidth: float | None = None
    transfer_latency: float = 0.0
    note: str = ""
    overlap: float = 1.0
    scan_overlap: float = 1.0
    copy_slots: int | None = None
    headroom: float = 1.0

    def __post_init__(self):
        _check_rate("host_bandwidth", self.host_bandwidth, "bytes/s between device and host memory, e.g. 50e9")
        _check_rate("device_flops", self.device_flops, "the device's FLOP/s, e.g. 1e15")
        if self.device_bandwidth is not None:
            _check_rate("device_bandwidth", self.device_bandwidth, "bytes/s of device memory, or None")
        _check_number("transfer_latency", self.transfer_latency, lambda x: 0.0 <= x < math.inf,
                      "finite seconds per transfer, at least 0")
        for name in ("overlap", "scan_overlap"):
            _check_number(name, getattr(self, name), lambda x: 0.0 <= x <= 1.0,
                          "the fraction of a copy's time compute hides, in [0, 1] (1: all of it)")
        if self.copy_slots is not None:
            if isinstance(self.copy_slots, (bool, np.bool_)) or not isinstance(self.copy_slots, numbers.Integral):
                raise InvalidInputError(f"DeviceModel(copy_slots={self.copy_slots!r}): copy_slots must be a positive "
                                        f"int (copies in flight at once) or None (no limit), got "
                                        f"{type(self.copy_slots).__name__}.")
            if self.copy_slots < 1:
                raise InvalidValueError(f"DeviceModel(copy_slots={self.copy_slots!r}): copy_slots must be at least 1 "
                                        "(copies the compiler keeps in flight at once), or None for no limit.")
        if not isinstance(self.has_host_memory, (bool, np.bool_)):
            raise InvalidInputError(f"DeviceModel(has_host_memory={self.has_host_memory!r}): has_host_memory must "
                                    f"be True or False, got {type(self.has_host_memory).__name__}.")
        if not isinstance(self.note, str):
            raise InvalidInputError(f"DeviceModel(note={self.note!r}): note must be a str (why nothing is "
                                    f"offloaded), got {type(self.note).__name__}.")
        if not (isinstance(self.headroom, numbers.Real) and 0 < self.headroom < math.inf):
            raise InvalidValueError(f"DeviceModel(headroom={self.headroom!r}): headroom must be a positive, finite "
                                    "number (1: a copy is hidden by compute exactly as long; more: a margin)")

    def transfer_seconds(self, nbytes: int) -> float:
        """Seconds one copy of ``nbytes`` takes, either way."""
        return self.transfer_latency + nbytes / self.host_bandwidth

    @property
    def max_offloaded(self) -> float:
        """The most values one plan may offload (:attr:`copy_slots`, or ``math.inf`` without a limit)."""
        return math.inf if self.copy_slots is None else self.copy_slots

    def hidden_seconds(self, nbytes: int, *, in_scan: bool = False) -> float:
        """Seconds of overlapping compute one copy of ``nbytes`` needs to stay hidden (inf: it never is)."""
        overlap = self.scan_overlap if in_scan else self.overlap
        return self.transfer_seconds(nbytes) * self.headroom / overlap if overlap >= MIN_OVERLAP else math.inf

    @property
    def offload_note(self) -> str:
        """Why this device offloads nothing between the programs (empty when it may)."""
        return self._note(self.overlap, "")

    @property
    def scan_offload_note(self) -> str:
        """Why this device offloads nothing inside scan bodies (empty when it may)."""
        return self._note(self.scan_overlap, " inside a scan body")

    def _note(self, overlap: float, where: str) -> str:
        if not self.has_host_memory:
            return self.note or "nothing offloaded: the device model has no host memory"
        if overlap < MIN_OVERLAP:
            return (f"nothing offloaded{where}: copies to host memory{where} hid only {overlap:.0%} of their time "
                    f"behind compute on this device (measured), under the {MIN_OVERLAP:.0%} the planner needs")
        return ""

    def eqn_seconds(self, eqn: Any) -> float:
        """Seconds the device spends on ``eqn``: FLOPs, or bytes moved where that is slower.

        Fusible eqns (elementwise, reshapes, gathers, cheap reductions) count FLOPs alone: XLA
        fuses them into their neighbours' kernels, whose traffic is counted.
        """
        return self.flop_costs.seconds(eqn)

    @property
    def flop_costs(self) -> FlopCosts:
        """This device's rates as a :class:`~jaxaot.partition.FlopCosts` (FLOP estimates)."""
        return FlopCosts(self.device_flops, self.device_bandwidth)

    @classmethod
    def measure(cls, device: Any = None) -> "DeviceModel":
        """The model of ``device`` (default: ``jax.devices()[0]``), measured once per device kind and process."""
        device = jax.devices()[0] if device is None else device
        key = _key(device)
        with _MEASURED_LOCK:
            model = _MEASURED.get(key)
        if model is not None:
            return model
        # The probes' bytes are taken before the lock (whoever holds bytes never waits for the lock), and
        # the partitioner may run while a caller traces.
        with holding(probe_bytes(device, offload=True)), _MEASURED_LOCK, jax.ensure_compile_time_eval():
            model = _MEASURED.get(key)
            if model is None:
                model = _MEASURED[key] = _measure(device, _RATES.get(key))
                _RATES.setdefault(key, model.flop_costs)
        return model

    @staticmethod
    def compute_costs(device: Any = None) -> FlopCosts:
        """``device``'s FLOP and memory rates alone as a :class:`FlopCosts`, measured once per device kind and
        process (or read off a :meth:`measure`-d model): what estimating an eqn needs, without the host-memory
        probes (their compiles, and their buffers beside the caller's arrays)."""
        device = jax.devices()[0] if device is None else device
        key = _key(device)
        with _MEASURED_LOCK:
            costs = _RATES.get(key)
        if costs is not None:
            return costs
        with holding(probe_bytes(device)), _MEASURED_LOCK, jax.ensure_compile_time_eval():  # as in measure
            costs = _RATES.get(key)
            if costs is None:
                costs = _RATES[key] = FlopCosts(*_rates(device))
        return costs


def _check_number(name: str, value: Any, ok: Callable[[float], bool], what: str) -> None:
    """Raise :class:`InvalidInputError` unless ``value`` is a real number (no bool), then
    :class:`InvalidValueError` unless ``ok(value)`` (NaN compares False, so it is refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidInputError(f"DeviceModel({name}={value!r}): {name} must be a number ({what}), got "
                                f"{type(value).__name__}.")
    if not ok(value):
        raise InvalidValueError(f"DeviceModel({name}={value!r}): {name} must be {what}.")


def _check_rate(name: str, value: Any, what: str) -> None:
    """A rate: a positive, finite real number."""
    _check_number(name, value, lambda x: 0 < x < math.inf, f"positive and finite: {what}")


_MEASURED: dict[tuple[str, str], DeviceModel] = {}
_RATES: dict[tuple[str, str], FlopCosts] = {}
_MEASURED_LOCK = threading.Lock()


def _key(device: Any) -> tuple[str, str]:
    return device.platform, getattr(device, "device_kind", "?")


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


def best_seconds(fn: Callable[[], Any], repeats: int = 3) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


def _per_step_seconds(step: Callable[[Any], Any], x: Any, n: int) -> float:
    """Seconds per call of ``step`` run ``n`` times in one program (dispatch and sync paid once, not per step),
    both programs compiled untuned (:func:`~jaxaot._src.partition.costs.autotune_bytes.compile_untuned`)."""
    platform = next(iter(jax.tree.leaves(x)[0].devices())).platform
    loop = compile_untuned(jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda i, x: step(x), x)).lower(x), platform)
    one = compile_untuned(jax.jit(step).lower(x), platform)
    return max((best_seconds(lambda: loop(x)) - best_seconds(lambda: one(x))) / (n - 1), 1e-9)


#: The rate probes' matmul size per platform: ``n x n`` operands (bf16 on accelerators), ``RATE_STEPS`` in a row.
RATE_MATMUL = {"cpu": 512}
RATE_MATMUL_ACCELERATOR = 4096
#: Steps of each rate probe in one program (dispatch and sync paid once).
RATE_STEPS = 8


def _rates(device: Any) -> tuple[float, float]:
    """``(FLOP/s, device bytes/s)`` of ``device``: a chain of matmuls, then a chain of copies, each probe's
    buffers freed before the next is made (a fixed size per platform, so every process plans with the same
    kind of measurement; at most about 100 MiB alive on an accelerator)."""
    cpu = device.platform == "cpu"
    on_device = jax.sharding.SingleDeviceSharding(device)
    n = RATE_MATMUL.get(device.platform, RATE_MATMUL_ACCELERATOR)
    eye = jax.device_put(np.eye(n, dtype=np.float32 if cpu else jnp.bfloat16), on_device)
    flops = 2.0 * n**3 / _per_step_seconds(lambda c: (c[0] @ c[1], c[1]), (eye, eye), RATE_STEPS)
    del eye
    x = _copy_payload(device)
    nbytes = x.nbytes
    # Device memory: a copy kernel run in a chain (a single call is mostly dispatch on a GPU).
    bandwidth = 2 * nbytes / _per_step_seconds(lambda v: jax.lax.optimization_barrier(v * 0.5 + 1.0), x, RATE_STEPS)
    return flops, bandwidth


def probe_bytes(device: Any, offload: bool = False) -> int:
    """Device bytes the rate probes hold at most, their compiles' autotuning included (with ``offload``, the
    host-memory probes' too, whose compiles autotune): what they take of the plan-time allowance
    (:mod:`jaxaot._src.allowance`). The rate probes alone compile untuned where the platform allows."""
    cpu = device.platform == "cpu"
    payload = _MEASURE_BYTES // 8 if cpu else _MEASURE_BYTES
    n = RATE_MATMUL.get(device.platform, RATE_MATMUL_ACCELERATOR)
    item = 4 if cpu else 2
    tuned = not cpu and (offload or not compiles_untuned(device.platform))
    held = 4 * n * n * item + 3 * payload + (6 * REDZONE_BYTES if tuned else 0)
    if offload:
        m = 512 if cpu else 8192
        held += 4 * m * m * item + 3 * payload
    return held


def _copy_payload(device: Any) -> Any:
    """The copy probes' payload on ``device``: 64 MiB of float32 (8 MiB on a CPU)."""
    nbytes = _MEASURE_BYTES // 8 if device.platform == "cpu" else _MEASURE_BYTES
    return jax.device_put(np.zeros(nbytes // 4, np.float32), jax.sharding.SingleDeviceSharding(device))


def _offload_probes(device: Any) -> tuple[Any, Any]:
    """The host-memory probes' payload (:func:`_copy_payload`) and matmul operand (8192 x 8192 bf16)."""
    cpu = device.platform == "cpu"
    n = 512 if cpu else 8192
    on_device = jax.sharding.SingleDeviceSharding(device)
    return _copy_payload(device), jax.device_put(jnp.ones((n, n), jnp.float32 if cpu else jnp.bfloat16), on_device)


def _measure(device: Any, rates: FlopCosts | None = None) -> DeviceModel:
    note = host_memory_note(device)
    flops, device_bandwidth = (rates.device_flops, rates.device_bandwidth) if rates is not None else _rates(device)
    x, a = _offload_probes(device)
    nbytes, n = x.nbytes, a.shape[0]
    on_device = jax.sharding.SingleDeviceSharding(device)
    on_host = on_device.with_memory_kind(HOST_MEMORY_KIND)
    bandwidth, latency, overlap, scan_overlap, slots = 1.0, 0.0, 1.0, 1.0, None
    if HOST_MEMORY_KIND in {m.kind for m in device.addressable_memories()}:
        # In-program copies, as the offloaded programs make them; a tiny copy's time (dispatch) is subtracted.
        tiny = jax.device_put(np.zeros(1, np.float32), on_device)
        to_host = jax.jit(lambda a: a, out_shardings=on_host)
        to_device = jax.jit(lambda a: a, out_shardings=on_device)
        h, tiny_h = to_host(x), to_host(tiny)
        dispatch_out, dispatch_in = best_seconds(lambda: to_host(tiny)), best_seconds(lambda: to_device(tiny_h))
        out_s = max(best_seconds(lambda: to_host(x)) - dispatch_out, 1e-9)
        in_s = max(best_seconds(lambda: to_device(h)) - dispatch_in, 1e-9)
        bandwidth = nbytes / max(out_s, in_s)
        eight = jax.jit(lambda *a: a, out_shardings=(on_host,) * 8)
        latency = max((best_seconds(lambda: eight(*[tiny] * 8), repeats=5) - dispatch_out) / 7, 0.0)
        if not note:
            steps = max(2, round(max(out_s, in_s) / (2.0 * n**3 / flops)))
            overlap = min(_overlap(a, x, out_s, on_device, on_host, steps),
                          _overlap(a, h, in_s, on_device, on_device, steps))
            scan_overlap = _scan_overlap(a, flops, bandwidth, latency)
            slots = measure_copy_slots(device, HOST_MEMORY_KIND)
    return DeviceModel(host_bandwidth=bandwidth, device_flops=flops, has_host_memory=not note,
                       device_bandwidth=device_bandwidth, transfer_latency=latency, note=note, overlap=overlap,
                       scan_overlap=scan_overlap, copy_slots=slots, headroom=MEASURED_HEADROOM)


def _overlap(a: Any, payload: Any, copy_seconds: float, on_device: Any, dest: Any, steps: int) -> float:
    """The fraction of a copy of ``payload`` to ``dest`` hidden behind a chain of ``steps`` matmuls of ``a``
    in the same program, the chain about as long as the copy (``copy_seconds``)."""
    scale = 1.0 / a.shape[0]

    def chain(a):
        return jax.lax.fori_loop(0, steps, lambda i, a: jax.lax.optimization_barrier((a @ a) * scale), a)

    alone = jax.jit(chain)
    beside = jax.jit(lambda a, p: (chain(a), p), out_shardings=(on_device, dest))
    compute = best_seconds(lambda: alone(a))
    both = best_seconds(lambda: beside(a, payload))
    hidden = (compute + copy_seconds - both) / min(compute, copy_seconds)
    return float(min(max(hidden, 0.0), 1.0))


def _scan_overlap(w: Any, flops: float, bandwidth: float, latency: float, iterations: int = 8) -> float:
    """The fraction of per-iteration copies hidden in a scan, as JAX's offload policy makes them.

    A scan of ``iterations`` steps, each a matmul of a 16 MiB carry by ``w`` whose
    result is named and then a few more matmuls, about as long as one copy of
    it; its gradient with the named value offloaded against saved on the device.
    The difference is what the copies (one each way per iteration) cost. 0
    where the offloading program fails to compile.
    """
    try:
        moved, saved, copy = scan_copy_seconds(w, flops, bandwidth, latency, iterations)
    except Exception:  # noqa: BLE001 - JAX cannot offload in a scan here: neither will the planner
        return 0.0
    return float(min(max(1.0 - (moved - saved) / (2 * iterations * copy), 0.0), 1.0))


def scan_copy_seconds(w: Any, flops: float, bandwidth: float, latency: float, iterations: int = 8
                      ) -> tuple[float, float, float]:
    """``(offloaded, saved, one copy)`` seconds of :func:`_scan_overlap`'s measurement."""
    n = w.shape[0]
    rows = max(1, 16 * 2**20 // (n * w.dtype.itemsize))
    copy = latency + rows * n * w.dtype.itemsize / bandwidth
    more = max(1, round(copy / (2.0 * rows * n * n / flops)))
    scale = 1.0 / n

    def step(h, _):
        y = checkpoint_name(jnp.tanh((h @ w) * scale), "jaxaot_probe")
        for _ in range(more):
            y = jnp.tanh((y @ w) * scale)
        return h + y, None

    def loss(policy):
        f = jax.checkpoint(lambda h: jnp.sum(jax.lax.scan(step, h, None, length=iterations)[0].astype(jnp.float32)),
                           policy=policy, prevent_cse=False)
        return jax.jit(jax.grad(f))

    cp = jax.checkpoint_policies
    saved = loss(cp.save_only_these_names("jaxaot_probe"))
    moved = loss(cp.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["jaxaot_probe"],
        offload_src="device", offload_dst=HOST_MEMORY_KIND))
    h = jnp.ones((rows, n), w.dtype)
    return best_seconds(lambda: moved(h)), best_seconds(lambda: saved(h)), copy
