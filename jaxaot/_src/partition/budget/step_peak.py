"""The compiled peak device memory of a partition's training step, measured by XLA.

A byte budget bounds the step's peak, of which residuals are one term among
temporaries, inputs, gradients and XLA's schedule, so only the compiler knows it.
A plan is measured by compiling its fused step (:func:`fused_step`, the program
``jaxaot.value_and_grad`` runs) and, in :func:`measure_step_peak`, the split
programs, with plain ``jax.jit`` and :data:`MEASURE_OPTIONS` (a cheaper compile with
the same peak), reading ``memory_analysis()`` (:func:`compiled_peak`). Peaks are
cached per program and input types for the process; an executable compiled with
the backend's own options may be held for the runtime (:mod:`.measured_executables`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import threading
from typing import Any, Iterable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src import workers
from jaxaot._src.allowance import holding
from jaxaot._src.partition.budget import measured_executables
from jaxaot._src.partition.core import Partition
from jaxaot._src.partition.costs import HOST_MEMORY_KIND, op_profile
from jaxaot._src.partition.costs.autotune_bytes import compile_bytes
from jaxaot._src.partition.step import layout_choice_platforms, step_program
from jaxaot._src.tracing import JointGraph
from jaxaot._src.units import format_bytes


def compiled_peak(exe: Any) -> int | None:
    """Peak device bytes of a compiled executable, where the backend reports it: ``peak_memory_in_bytes``, but on
    the CPU, whose ``peak_memory_in_bytes`` is the arguments and outputs alone (its temporaries left out, however
    large), what its buffer assignment allocates: temporaries, arguments and outputs, less the aliased bytes."""
    ma = op_profile.memory_analysis(exe)
    if ma is None:
        return None
    allocated = int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes
                    - ma.alias_size_in_bytes)
    peak = int(getattr(ma, "peak_memory_in_bytes", 0) or 0)
    if peak >= ma.temp_size_in_bytes and peak and not _peak_leaves_out_temporaries(exe, ma, peak):
        return peak
    return allocated


def _peak_leaves_out_temporaries(exe: Any, ma: Any, peak: int) -> bool:
    """Whether ``peak`` is XLA:CPU's, which counts arguments and outputs only: by the executable's platform, or,
    where that is unknown, by the peak being exactly those while there are temporaries."""
    platform = None
    try:
        shardings = jax.tree_util.tree_leaves(getattr(exe, "input_shardings", None))
        devices = next(iter(shardings)).device_set if shardings else exe.local_devices()
        platform = next(iter(devices)).platform
    except Exception:  # noqa: BLE001 - an executable that names no devices
        pass
    if platform is not None:
        return platform == "cpu"
    outside = ma.argument_size_in_bytes + ma.output_size_in_bytes
    return ma.temp_size_in_bytes > 0 and peak in (outside, outside - ma.alias_size_in_bytes)


@dataclasses.dataclass(frozen=True)
class StepPeak:
    """The compiled peaks of one plan's programs, in bytes per device (None: not measured or not reported).

    Attributes:
      fused: the step as one program (:func:`fused_step`).
      forward / backward: the split programs (None where not measured: on a mesh, where the
        residuals' shardings are the compiled forward's to choose, and under a byte budget, whose
        search measures the fused step only).
      budget: the byte budget the plan was chosen under, if any.
    """

    fused: int | None
    forward: int | None = None
    backward: int | None = None
    budget: int | None = None

    @property
    def split(self) -> int | None:
        """The split step's peak, the larger of the forward's and the backward's."""
        known = [p for p in (self.forward, self.backward) if p is not None]
        return max(known) if known else None

    @property
    def peak(self) -> int | None:
        """The larger of the fused and the split step's peaks, what the plan needs either way."""
        known = [p for p in (self.fused, self.split) if p is not None]
        return max(known) if known else None

    def fits(self, budget: int) -> bool:
        """Whether every measured peak is at most ``budget`` bytes (a plan nothing measured fits)."""
        return all(p is None or p <= budget for p in (self.fused, self.forward, self.backward))

    def __str__(self) -> str:
        text = f"fused {format_bytes(self.fused)}"
        if self.split is not None:
            text += f", split {format_bytes(self.split)} (forward {format_bytes(self.forward)}, " \
                    f"backward {format_bytes(self.backward)})"
        return text + (f"; budget {format_bytes(self.budget)}" if self.budget is not None else "")


def budget_of(part: Partition) -> int | None:
    """The byte budget ``part`` was chosen under (its :class:`StepPeak`'s), or None."""
    return getattr(part.step_peak, "budget", None)


def cotangent_avals(part: Partition, joint: JointGraph) -> list:
    """The backward's cotangent inputs, as ``jax.ShapeDtypeStruct``."""
    return [jax.ShapeDtypeStruct(joint.out_avals[i].shape, joint.out_avals[i].dtype) for i in part.cotangent_outputs]


def fused_step(part: Partition, joint: JointGraph) -> Any:
    """The closed jaxpr ``inputs -> (outputs..., grads...)`` of the step as one program: the fused step
    ``jaxaot.value_and_grad`` runs for a min-cut plan under a byte budget
    (:func:`~jaxaot._src.partition.step.step_program`, every residual behind the barrier, the outputs it
    computes, the residuals' layouts :func:`measured_layouts`), before any other variant of an accelerator's."""
    return step_program(part, _plain(joint.in_avals), joint.out_avals, computed_outputs=computed_outputs(joint),
                        barrier="all", layouts=measured_layouts(joint.in_avals))


def measured_layouts(avals: Sequence[Any]) -> str:
    """The residuals' layouts of the fused step a byte budget's search measures and the runtime then runs:
    ``"pinned"`` where the backend chooses layouts inside a program
    (:func:`~jaxaot._src.partition.step.layout_choice_platforms`), else ``"auto"``. Off a budget an
    accelerator's step keeps pinned layouts unless pinning raises its compiled peak; a plan measured pinned fits
    the budget as it runs, so that comparison costs no compile there."""
    return "pinned" if program_platform(avals) in layout_choice_platforms() else "auto"


def computed_outputs(joint: JointGraph) -> list[int]:
    """The outputs the runtime's executables compute: those of the primal program that are not its inputs
    (an input returned unchanged is handed back without passing through an executable)."""
    primal = C.jaxpr_of(joint.primal)
    inputs = set(primal.invars)
    return [i for i, v in enumerate(primal.outvars) if C.is_literal(v) or v not in inputs]


def _plain(avals: Sequence[Any]) -> list:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)) for a in avals]


def on_mesh(joint: JointGraph) -> bool:
    """Whether any input is laid out over more than one device."""
    for a in joint.in_avals:
        sharding = getattr(a, "sharding", None)
        if sharding is not None and len(sharding_devices(sharding)) > 1:
            return True
    return False


def backward_avals(part: Partition, joint: JointGraph) -> list:
    """The split backward's inputs: cotangents, then residuals (offloaded ones in host memory)."""
    host = None
    avals = cotangent_avals(part, joint)
    for r in part.residuals:
        if r.offloaded:
            if host is None:
                host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=HOST_MEMORY_KIND)
            avals.append(jax.ShapeDtypeStruct(r.aval.shape, r.aval.dtype, sharding=host))
        else:
            avals.append(jax.ShapeDtypeStruct(r.aval.shape, r.aval.dtype))
    return avals


def measure_step_peak(part: Partition, joint: JointGraph, *, split: bool = True, budget: int | None = None
                      ) -> StepPeak:
    """The :class:`StepPeak` of ``part``: its fused step, and with ``split`` its two programs (off a mesh)."""
    fused = program_peak(fused_step(part, joint), joint.in_avals)
    forward = backward = None
    if split and not on_mesh(joint):
        forward = program_peak(part.forward, joint.in_avals)
        backward = program_peak(part.backward, backward_avals(part, joint))
    return StepPeak(fused, forward, backward, budget)


# --------------------------------------------------------------------------- compiled, cached
#: XLA options the planner compiles its measurements with, per platform, in order of preference: the
#: first a backend accepts is used for the process. They make the compile cheaper and keep most of its buffer
#: assignment: the peak as the runtime's compile has it, or, for the sets listed in :data:`INEXACT`, near it
#: (a few bytes above on the zoo; a gather's or a scatter's a quarter below, or some hundred bytes above), so
#: the search measures the plan it chooses again as the runtime compiles it.
#: On XLA:CPU the backend optimization level only changes LLVM's code generation (on the zoo the peaks
#: are equal at 0 and at the default, for a fraction of the compile's time); the older LLVM emitters
#: instead of the fusion emitters make the compile cheaper still and add a few bytes of scratch to the
#: temporaries (``tests/partition/test_peak_budget.py`` checks both on the zoo; ``docs/benchmarks.md``,
#: Findings, has the times). One LLVM module instead of several compiled on threads (the split count) changes
#: no buffer and, on a measurement's small modules, saves the threads' overhead.
MEASURE_OPTIONS: dict[str, tuple[dict[str, Any], ...]] = {
    "cpu": ({"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
             "xla_cpu_parallel_codegen_split_count": 1},
            {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},
            {"xla_backend_optimization_level": 0}),
}
#: The option sets of :data:`MEASURE_OPTIONS` whose peak may differ from the runtime's compile's.
INEXACT = tuple(o for o in MEASURE_OPTIONS["cpu"] if "xla_cpu_use_fusion_emitters" in o)
#: How far over a budget an :data:`INEXACT` measurement may lie and the plan still count as fitting until it would
#: be chosen (then it is measured exactly, as every plan chosen after an inexact measurement is), in bytes.
MEASURE_SLACK = 256

#: XLA options for a preview, per platform: a compile whose peak only anchors the search's predictions, made for a
#: plan that cannot fit (its floor is over the budget). On a GPU, no autotuning and cuBLAS's own choice of kernel: a
#: cold compile without the autotuning that the runtime's compile of the plan chosen pays once anyway, its peak
#: within a few percent of the runtime's, either way. A preview's executable is never kept.
PREVIEW_OPTIONS: dict[str, tuple[dict[str, Any], ...]] = {
    "gpu": ({"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False},),
}

_CACHE: collections.OrderedDict[str, int | None] = collections.OrderedDict()
_CACHE_LIMIT = 1024
_LOCK = threading.Lock()
_COMPILES = [0]
_REFUSED: set[str] = set()  # option sets a backend refused, by their text


def sharding_devices(sharding: Any) -> frozenset:
    """The devices ``sharding`` places on; none for None, or for one on an abstract mesh (inside ``shard_map``, or
    ``jit`` on an Explicit mesh), whose devices are not known yet."""
    try:
        return frozenset(getattr(sharding, "device_set", None) or ())
    except ValueError:  # JAX's AbstractMesh: device_set is not implemented
        return frozenset()


def program_platform(avals: Sequence[Any]) -> str | None:
    """The platform a program of ``avals`` compiles for, read before compiling it: the devices of the first
    input with a sharding, else the default device (``jax_default_device``, else the default backend)."""
    for aval in avals:
        sharding = getattr(aval, "sharding", None)
        devices = sharding_devices(sharding)
        if devices:
            return next(iter(devices)).platform
        device = getattr(getattr(sharding, "mesh", None), "abstract_device", None)  # an abstract mesh's kind
        if isinstance(getattr(device, "platform", None), str):
            return device.platform
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else getattr(device, "platform", None)


def measure_options(avals: Sequence[Any] = (), exact: bool = False) -> tuple[dict[str, Any], ...]:
    """The compiler option sets a measurement on the platform of ``avals`` (the default device's without
    a sharding) tries, in order, the last the backend's defaults (:data:`MEASURE_OPTIONS`); with ``exact``,
    only those that keep the runtime compile's peak."""
    return _then_defaults(o for o in MEASURE_OPTIONS.get(program_platform(avals), ()) if not (exact and o in INEXACT))


def previews(avals: Sequence[Any]) -> bool:
    """Whether the platform of ``avals`` has a preview (:data:`PREVIEW_OPTIONS`) the backend has not refused."""
    return bool(_preview_options(avals)[:-1])


def _preview_options(avals: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    return _then_defaults(PREVIEW_OPTIONS.get(program_platform(avals), ()))


def _then_defaults(sets: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``sets`` less those the backend refused, copied, then the backend's defaults (``{}``)."""
    return (*[dict(o) for o in sets if str(sorted(o.items())) not in _REFUSED], {})


def _compile(lowered: Any, options: Sequence[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """``lowered`` compiled with the first of ``options`` the backend accepts, and those options."""
    for opts in options:
        if not opts:
            return lowered.compile(), opts
        try:
            return lowered.compile(compiler_options=opts), opts
        except Exception as err:  # noqa: BLE001 - an option this XLA does not know: the next set, and never again
            if "option" not in str(err).lower():
                raise
            with _LOCK:
                _REFUSED.add(str(sorted(opts.items())))
    raise AssertionError("unreachable")  # pragma: no cover - the last set is the defaults


class PendingPeak:
    """A program's compiled peak (:func:`program_peak`) as it is measured: compiling on a worker thread
    (:mod:`jaxaot._src.workers`) or known already. :meth:`peak` waits for it. Whoever started the compile
    may :meth:`peak` it with ``keep``; a request that found the same program compiling or cached shares the
    peak alone, as a cache hit does."""

    def __init__(self, closed: Any, avals: Sequence[Any], text: str, inflight: _Inflight | None = None,
                 peak: int | None = None, owner: bool = False):
        self._closed, self._avals, self._text, self._inflight = closed, avals, text, inflight
        self._future, self._peak, self._owner = inflight.future if inflight else None, peak, owner

    def done(self) -> bool:
        """Whether :meth:`peak` would return without waiting."""
        return self._future is None or self._future.done()

    def settle(self) -> None:
        """Let go of the compile, read by nobody: not begun where no other request shares it, else waited for
        (it must not run beside what the caller does next, holding device memory there)."""
        if self._future is not None:
            if self._owner:
                with _LOCK:
                    self._inflight.abandoned = True
            concurrent.futures.wait([self._future])  # never cancelled: others may wait for the same compile

    def peak(self, keep: bool = False) -> int | None:
        """The peak, waited for; with ``keep`` (read on the calling thread, whose default device and matmul
        precision key it) the executable is held for the runtime where this request compiled it: as the runtime's
        own where compiled with the backend's own options, else as provisional (the runtime runs it while its own
        compile finishes). The executable is let go after the first call."""
        if self._future is not None:
            peak, exe, used = self._future.result()
            self._future, self._peak = None, peak
            if keep and self._owner and exe is not None:
                measured_executables.keep(self._closed, self._avals, {}, exe, text=self._text, provisional=bool(used))
        return self._peak


@dataclasses.dataclass
class _Inflight:
    """A compile running for :func:`start_peak`: its future, how many other requests joined it, and whether its
    owner let go of it (:meth:`PendingPeak.settle`)."""

    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    shared: int = 0
    abandoned: bool = False


_INFLIGHT: dict[str, _Inflight] = {}  # key -> its compile, while it runs


def start_peak(closed: Any, avals: Sequence[Any], exact: bool = False, preview: bool = False,
               runtime: bool = False) -> PendingPeak:
    """:func:`program_peak` begun: the program lowered here (lowering reads this thread's configuration), its
    compile handed to a worker; a program of the same key compiling already, or cached, is not compiled again.
    With ``preview``, compiled with the platform's :data:`PREVIEW_OPTIONS`: a peak for predictions alone; with
    ``runtime``, with the backend's own options, as the runtime compiles (its executable the runtime's to take)."""
    options = ({},) if runtime else _preview_options(avals) if preview else measure_options(avals, exact)
    text = str(closed)
    key = hashlib.sha256(f"{text}\n{[_aval_key(a) for a in avals]}\n{options[0]}".encode()).hexdigest()
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return PendingPeak(closed, avals, text, peak=_CACHE[key])
        if key in _INFLIGHT:
            _INFLIGHT[key].shared += 1
            return PendingPeak(closed, avals, text, _INFLIGHT[key])

    def run(*args: Any) -> list:  # the runtime's compile evaluates the program the same way
        return C.eval_closed(closed, *args)

    try:
        lowered = jax.jit(run, keep_unused=True).lower(*avals)
    except Exception:  # noqa: BLE001 - a program this backend refuses has no peak to plan with
        _record(key, None)
        return PendingPeak(closed, avals, text, peak=None)
    with _LOCK:
        if key in _CACHE or key in _INFLIGHT:  # another thread measured or began it while this one lowered
            found = _CACHE.get(key), _INFLIGHT.get(key)
            if found[1] is not None:
                found[1].shared += 1
        else:
            found, inflight = None, _INFLIGHT.setdefault(key, _Inflight())
    if found is not None:
        return PendingPeak(closed, avals, text, found[1], peak=found[0])
    autotunes = not (preview and options[0])  # a preview's options turn the autotuning off
    nbytes = compile_bytes(closed, program_platform(avals)) if autotunes else 0
    workers.submit(_measured, key, lowered, options, inflight, nbytes)
    return PendingPeak(closed, avals, text, inflight, owner=True)


def _measured(key: str, lowered: Any, options: Sequence[dict[str, Any]], inflight: _Inflight,
              nbytes: int = 0) -> None:
    """Sets the compile's future to ``(peak, executable, options used)`` of ``lowered`` (None, None, None where it does
    not compile), the peak cached first. The compile holds ``nbytes`` of the plan-time allowance
    (:mod:`jaxaot._src.allowance`). A compile its owner let go of (:meth:`PendingPeak.settle`) before it
    began, and nobody shares, is not made."""
    future = inflight.future
    try:
        if _abandoned(key, inflight):
            return
        with holding(nbytes):
            if _abandoned(key, inflight):
                return
            exe, used = _compile(lowered, options)
        peak = compiled_peak(exe)
    except Exception:  # noqa: BLE001 - a program this backend refuses has no peak to plan with
        exe, used, peak = None, None, None
    except BaseException as err:  # an interrupt: whoever waits is told
        with _LOCK:
            _INFLIGHT.pop(key, None)
        future.set_exception(err)
        raise
    _record(key, peak, compiled=True)
    future.set_result((peak, exe, used))


def _abandoned(key: str, inflight: _Inflight) -> bool:
    """Whether the compile of ``key`` was let go of by its owner and shared by nobody: then it is dropped (its
    future resolved with nothing, no peak recorded)."""
    with _LOCK:
        if not inflight.abandoned or inflight.shared:
            return False
        _INFLIGHT.pop(key, None)
    inflight.future.set_result((None, None, None))
    return True


def _record(key: str, peak: int | None, compiled: bool = False) -> None:
    with _LOCK:
        _COMPILES[0] += compiled
        _CACHE[key] = peak
        _INFLIGHT.pop(key, None)
        while len(_CACHE) > _CACHE_LIMIT:
            _CACHE.popitem(last=False)


def program_peak(closed: Any, avals: Sequence[Any], exact: bool = False, keep: bool = False) -> int | None:
    """The compiled peak of ``closed`` on ``avals`` (:func:`compiled_peak`), compiled (with
    :func:`measure_options`) once per process per program text and input types; None where the backend
    cannot compile it or reports no peak. Without ``exact`` it may differ from the runtime compile's peak
    (:data:`INEXACT`). With ``keep``, an executable compiled with the backend's
    own options, as the runtime compiles (:func:`jaxaot.compilers.xla`), is held for the runtime to take
    (:mod:`~jaxaot._src.partition.budget.measured_executables`). :func:`start_peak` begins one without waiting."""
    return start_peak(closed, avals, exact).peak(keep)


def _aval_key(a: Any) -> str:
    sharding = getattr(a, "sharding", None)
    return f"{a.dtype}{list(a.shape)}{getattr(a, 'weak_type', False)}{sharding if sharding is not None else ''}"


def compile_count() -> int:
    """How many programs :func:`program_peak` has compiled in this process (cache hits excluded)."""
    return _COMPILES[0]


def cache_size() -> int:
    """How many program peaks are cached."""
    return len(_CACHE)
