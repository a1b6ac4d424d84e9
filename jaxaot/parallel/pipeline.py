"""``jaxaot.pipeline``: pipeline-parallel training steps from separately compiled stage programs.

A model cut into stages, ``stage_fn(params_i, activations) -> activations``,
and a ``loss_fn(last_activations, targets) -> scalar``, becomes a training step

.. code-block:: python

    step = jaxaot.pipeline(stages, loss_fn, schedule="1f1b", num_microbatches=8)
    loss, grads = step(params, inputs, targets)   # params, grads: one entry per stage

whose ``loss`` is the mean of the microbatches' losses and whose ``grads`` are
its gradients, as ``jax.value_and_grad`` of the unpipelined composition gives
them. How:

1. **Stages.** Each stage is a :func:`jaxaot.aot_function` (the last one of
   ``loss_fn(stage_fn(p, a), t)``) on its device; the runtime traces and
   partitions it, and compiles its forward, its fused backward and the two
   halves of its B/W split (:mod:`jaxaot.partition.bw`), each on first use
   (:mod:`jaxaot.parallel.stage`).
2. **Placement.** ``devices`` holds one device per schedule device (default
   ``jax.devices()[:num_devices]``: one per stage, or one per two stages for
   ``"interleaved"``); stage ``s`` runs on ``devices[schedule.stage_device()[s]]``,
   i.e. ``s % num_devices`` for interleaved schedules. Parameters are put there
   with ``jax.device_put`` (a no-op where they already are) and their gradients
   come back there. A ``jax.sharding.Mesh`` in place of a device replicates the
   stage over that sub-mesh.
3. **Microbatches.** ``inputs`` and ``targets`` (pytrees) are split along axis 0
   (:mod:`jaxaot.parallel.microbatch`); at the first call of each input
   signature, ``jax.eval_shape`` checks that every stage takes what the
   previous one returns (:class:`~jaxaot.errors.StageMismatchError` otherwise).
4. **Schedule.** :func:`~jaxaot.parallel.builtin.make_schedule` builds the
   actions; :func:`~jaxaot.parallel.executor.run_schedule` dispatches them in
   issue order, asynchronously, moving activations and their gradients between
   devices with ``jax.device_put``. The last stage's backward starts from the
   cotangent ``1 / num_microbatches``, so gradients are those of the mean.

Costs: per step, one executable call per action plus the transfers and
gradient adds; the host never blocks, so devices overlap as far as the
schedule allows. Per input signature, one ``eval_shape`` chain, and per stage
a trace, a partition and up to four compilations.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot.parallel import microbatch
from jaxaot.parallel.executor import run_schedule
from jaxaot.parallel.builtin import make_schedule
from jaxaot.parallel.schedule import Schedule
from jaxaot.parallel.simulate import OpTimes
from jaxaot.parallel.stage import Placement, Stage, StagePrograms, float0_like
from jaxaot.partition import Partitioner, default_partition
from jaxaot.runtime import CacheInfo


@dataclasses.dataclass(frozen=True)
class PipelineReport:
    """What :meth:`Pipeline.lower` finds, per stage, for one input signature (nothing is run).

    Attributes:
      schedule: the :class:`~jaxaot.parallel.schedule.Schedule` the step runs.
      placements: each stage's device (or mesh).
      input_specs: each stage's input activations for one microbatch (``jax.ShapeDtypeStruct`` trees).
      residual_bytes: bytes of one microbatch's residuals, parameters left out (alive anyway).
      weight_pass_bytes: bytes one microbatch keeps alive from its B to its W (the B/W split's handoff
        and the residuals W reads).
      peak_live_microbatches: the most microbatches whose residuals the schedule keeps alive at once.
    """

    schedule: Schedule
    placements: tuple
    input_specs: tuple
    residual_bytes: tuple[int, ...]
    weight_pass_bytes: tuple[int, ...]
    peak_live_microbatches: tuple[int, ...]

    @property
    def peak_residual_bytes(self) -> tuple[int, ...]:
        """Per stage, residual bytes at the schedule's peak (``residual_bytes * peak_live_microbatches``)."""
        return tuple(b * n for b, n in zip(self.residual_bytes, self.peak_live_microbatches))

    def __str__(self) -> str:
        rows = [f"pipeline: schedule {self.schedule.name!r}, {self.schedule.num_stages} stages, "
                f"{self.schedule.num_microbatches} microbatches, {self.schedule.num_devices} devices",
                "stage  device  input            residuals/mb  B->W/mb  peak live  peak residuals"]
        for s, place in enumerate(self.placements):
            rows.append(f"{s:<6} {str(getattr(place, 'id', place)):<7} {microbatch.describe(self.input_specs[s]):<16} "
                        f"{self.residual_bytes[s]:>12}  {self.weight_pass_bytes[s]:>7}  "
                        f"{self.peak_live_microbatches[s]:>9}  {self.peak_residual_bytes[s]:>14}")
        return "\n".join(rows)


class Pipeline:
    """A pipeline-parallel training step; build it with :func:`pipeline`.

    Attributes:
      stages: the :class:`~jaxaot.parallel.stage.Stage` objects, in order.
      schedule: the :class:`~jaxaot.parallel.schedule.Schedule` each step runs.
      num_microbatches: how many microbatches a batch is split into.
      last_peak_live: per stage, the most microbatches whose residuals the last
        step held at once (counted as it ran; None before the first step).
    """

    def __init__(self, stage_fns: Sequence[Callable], loss_fn: Callable, schedule: str | Schedule,
                 num_microbatches: int, devices: Sequence[Placement] | None, partition_fn: Partitioner):
        self.stage_fns = list(stage_fns)
        self.loss_fn = loss_fn
        self.num_microbatches = num_microbatches
        n = len(self.stage_fns)
        num_devices = None if devices is None else len(devices)
        self.schedule = make_schedule(schedule, n, num_microbatches, num_devices)
        if devices is None:
            available = jax.devices()
            if len(available) < self.schedule.num_devices:
                raise InvalidValueError(
                    f"the {self.schedule.name!r} schedule of {n} stages needs {self.schedule.num_devices} devices, "
                    f"but JAX has {len(available)}: pass devices=[...] (a device may appear more than once).")
            devices = available[:self.schedule.num_devices]
        self.devices = list(devices)
        where = self.schedule.stage_device()
        self.stages = [Stage(s, fn, self.devices[where[s]], partition_fn, loss_fn if s == n - 1 else None)
                       for s, fn in enumerate(self.stage_fns)]
        self._programs: dict[Any, list[StagePrograms]] = {}
        self._specs: dict[Any, list] = {}
        self._hits = 0
        self.last_peak_live: tuple[int, ...] | None = None

    # -- the step
    def __call__(self, params: Sequence[Any], inputs: Any, targets: Any) -> tuple[jax.Array, list]:
        """One training step: ``(mean microbatch loss, per-stage gradients)``; nothing blocks."""
        placed, xs, ts, programs = self._prepare(params, inputs, targets)
        scale = self._loss_cotangent(programs[-1])
        flat = [jax.tree_util.tree_leaves(p) for p in placed]
        result = run_schedule(self.schedule, self.stages, programs, flat,
                              [jax.tree_util.tree_leaves(x) for x in xs],
                              [jax.tree_util.tree_leaves(t) for t in ts], scale)
        self.last_peak_live = result.peak_live
        grads = []
        for p, leaves, g in zip(placed, flat, result.grads):
            g = g or [None] * len(leaves)
            grads.append(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(p),
                                                      [float0_like(x) if d is None else d for x, d in zip(leaves, g)]))
        return result.loss, grads

    def lower(self, params: Sequence[Any], inputs: Any, targets: Any) -> PipelineReport:
        """Trace and partition every stage for these arguments (no stage program compiles or runs)."""
        placed, xs, ts, programs = self._prepare(params, inputs, targets)
        return PipelineReport(
            schedule=self.schedule,
            placements=tuple(st.placement for st in self.stages),
            input_specs=tuple(self._specs[self._key(placed, xs[0], ts[0])]),
            residual_bytes=tuple(p.residual_bytes for p in programs),
            weight_pass_bytes=tuple(p.split.live_bytes for p in programs),
            peak_live_microbatches=tuple(self.schedule.peak_live_microbatches()),
        )

    def measure_op_times(self, params: Sequence[Any], inputs: Any, targets: Any, *, repeats: int = 5,
                         back_to_back: int = 4) -> OpTimes:
        """Per-stage F, B, W, BW and transfer times, for :func:`~jaxaot.parallel.simulate.simulate`.

        Runs microbatch 0 through every pass of every stage once (which
        compiles), then times every pass ``repeats`` times; each sample
        dispatches the pass ``back_to_back`` times and blocks once, as a running
        pipeline dispatches asynchronously (1 times a lone blocking call, which
        adds the host's launch and synchronisation gap to every pass). The
        passes take turns round by round, so drift of the machine hits all
        alike, and each time is the median over rounds.
        ``transfer[s]`` is the slower of moving stage ``s``'s input activations
        from stage ``s-1`` and its output gradients from stage ``s+1`` (0 where
        both live on one device).
        """
        placed, xs, ts, programs = self._prepare(params, inputs, targets)
        probes = _op_probes(self.stages, programs, placed, xs[0], ts[0], self._loss_cotangent(programs[-1]))
        runs: dict[tuple[str, int], list[float]] = {key: [] for key in probes}
        for _ in range(repeats):
            for key, fn in probes.items():
                t = time.perf_counter()
                outs = [fn() for _ in range(max(1, back_to_back))]
                jax.block_until_ready(outs)
                runs[key].append((time.perf_counter() - t) / max(1, back_to_back))
        n = range(len(self.stages))
        med = {key: statistics.median(ts) for key, ts in runs.items()}
        per_op = {op: tuple(med[(op, s)] for s in n) for op in ("F", "B", "W", "BW")}
        transfer = tuple(max(med.get(("activation", s), 0.0), med.get(("cotangent", s), 0.0)) for s in n)
        return OpTimes(per_op["F"], per_op["B"], per_op["W"], per_op["BW"], transfer)

    # -- per signature
    def _prepare(self, params: Sequence[Any], inputs: Any, targets: Any) -> tuple[list, list, list, list]:
        """Placed parameters, microbatches and the stages' programs (traced at a signature's first call)."""
        if not isinstance(params, (list, tuple)) or len(params) != len(self.stages):
            raise InvalidInputError(
                f"params must be a list with one parameter tree per stage ({len(self.stages)}), got "
                f"{type(params).__name__}" + (f" of {len(params)}" if isinstance(params, (list, tuple)) else ""))
        m = self.num_microbatches
        microbatch.check_batch("inputs", inputs, m)
        microbatch.check_batch("targets", targets, m)
        placed = [st.place(p) for st, p in zip(self.stages, params)]
        xs = microbatch.split(self.stages[0].place(inputs), m)
        ts = microbatch.split(self.stages[-1].place(targets), m)
        key = self._key(placed, xs[0], ts[0])
        programs = self._programs.get(key)
        if programs is not None:
            self._hits += 1
        else:
            specs = microbatch.stage_input_specs(self.stage_fns, self.loss_fn, placed, xs[0], ts[0])
            programs = [st.programs(st.spec(p), st.spec(a), st.spec(ts[0]) if st.is_last else None)
                        for st, p, a in zip(self.stages, placed, specs)]
            self._programs[key] = programs
            self._specs[key] = specs
        return placed, xs, ts, programs

    def cache_info(self) -> CacheInfo:
        """The step's signatures (``hits``: steps that found theirs, ``misses``: signatures traced) and, per
        stage, its entries (``program``: ``stage0``, ...): the executables it compiled (``forward``,
        ``pipeline_backward``, ``backward_input``, ``backward_weight``), the seconds per stage and the reason.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from jaxaot.parallel.pipeline import pipeline
            >>> layer = lambda w, x: jnp.tanh(x @ w)
            >>> step = pipeline([layer, layer], lambda y, t: jnp.mean((y - t) ** 2), schedule="gpipe",
            ...                 num_microbatches=2, devices=[jax.devices()[0]] * 2)
            >>> for _ in range(2):
            ...     _ = step([jnp.eye(3), jnp.eye(3)], jnp.ones((4, 3)), jnp.zeros((4, 3)))
            >>> info = step.cache_info()
            >>> info.hits, info.misses, [e.program for e in info.entries]
            (1, 1, ['stage0', 'stage1'])
        """
        stages = CacheInfo.combine({f"stage{st.index}": st.aot.cache_info() for st in self.stages})
        return CacheInfo(self._hits, len(self._programs), stages.entries)

    @staticmethod
    def _key(params: Any, x: Any, t: Any) -> Any:
        """The input signature of a step: structure, shapes, dtypes, weak types and shardings."""
        leaves, treedef = jax.tree_util.tree_flatten((params, x, t))
        return treedef, tuple((v.shape, v.dtype, v.aval.weak_type, v.sharding) for v in leaves)

    def _loss_cotangent(self, last: StagePrograms) -> list:
        dtype = last.output_specs()[0].dtype
        return [self.stages[-1].place(np.asarray(1.0 / self.num_microbatches, dtype))]

    def __repr__(self) -> str:
        return (f"<Pipeline {self.schedule.name}: {len(self.stages)} stages, {self.num_microbatches} microbatches, "
                f"{self.schedule.num_devices} devices>")


def _op_probes(stages: Sequence[Stage], programs: Sequence[StagePrograms], params: Sequence[Any], inputs: Any,
               targets: Any, loss_cotangent: list) -> dict[tuple[str, int], Callable[[], Any]]:
    """``{(pass, stage): run it on microbatch 0}``, after running each once (so each is compiled).

    Passes are ``F``, ``B``, ``W``, ``BW``, and ``activation`` / ``cotangent`` for
    the transfers into a stage from its neighbours on other devices.
    """
    last = len(stages) - 1
    probes: dict[tuple[str, int], Callable[[], Any]] = {}
    acts = jax.tree_util.tree_leaves(inputs)
    saved = []
    for s, p in enumerate(programs):
        leaves = jax.tree_util.tree_leaves(params[s]) + acts + (jax.tree_util.tree_leaves(targets) if s == last else [])
        probes[("F", s)] = functools.partial(p.forward, leaves)
        outs, res = p.forward(leaves)
        saved.append(res)
        if s < last:
            if stages[s + 1].placement != stages[s].placement:
                probes[("activation", s + 1)] = functools.partial(stages[s + 1].place, list(outs))
            acts = stages[s + 1].place(list(outs))
    ct = loss_cotangent
    for s in range(last, -1, -1):
        p, res = programs[s], saved[s]
        probes[("BW", s)] = functools.partial(p.backward, res, ct)
        probes[("B", s)] = functools.partial(p.backward_input, res, ct)
        act_grads, wargs = p.backward_input(res, ct)
        probes[("W", s)] = functools.partial(p.backward_weight, wargs)
        if s > 0:
            back = [act_grads[k] for k in programs[s - 1].cotangent_outputs]
            if stages[s - 1].placement != stages[s].placement:
                probes[("cotangent", s - 1)] = functools.partial(stages[s - 1].place, back)
            ct = stages[s - 1].place(back)
    for fn in probes.values():
        jax.block_until_ready(fn())
    return probes


def pipeline(stages: Sequence[Callable], loss_fn: Callable, schedule: str | Schedule = "1f1b",
             num_microbatches: int = 8, devices: Sequence[Placement] | None = None,
             partition_fn: Partitioner | None = None) -> Pipeline:
    """A pipeline-parallel training step (see the module docstring).

    Args:
      stages: ``stage_fn(params_i, activations) -> activations``, in order.
      loss_fn: ``loss_fn(last_activations, targets_microbatch) -> scalar``, one microbatch's loss.
      schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, ``"zero_bubble"`` or a
        :class:`~jaxaot.parallel.schedule.Schedule`.
      num_microbatches: the batch (axis 0 of every input and target leaf) is split in this many.
      devices: one device (or ``jax.sharding.Mesh``) per schedule device; default
        ``jax.devices()[:num_devices]``.
      partition_fn: each stage's partitioner; default :func:`jaxaot.default_partition`.

    Returns:
      a :class:`Pipeline`: ``step(params, inputs, targets) -> (loss, grads)``,
      plus ``step.lower(...)``, ``step.measure_op_times(...)`` and ``step.cache_info()``.

    Raises:
      InvalidInputError: ``stages`` is empty or holds something not callable, ``loss_fn`` or ``partition_fn``
        is not callable, ``num_microbatches`` is not an int, ``devices`` is not a sequence of devices,
        meshes or shardings.
      InvalidValueError / ScheduleError: see :func:`~jaxaot.parallel.builtin.make_schedule`.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> from jaxaot.parallel.pipeline import pipeline
        >>> layer = lambda w, x: jnp.tanh(x @ w)
        >>> step = pipeline([layer, layer], lambda y, t: jnp.mean((y - t) ** 2),
        ...                 schedule="gpipe", num_microbatches=2, devices=[jax.devices()[0]] * 2)
        >>> ws = [jnp.eye(3), jnp.eye(3)]
        >>> loss, grads = step(ws, jnp.ones((4, 3)), jnp.zeros((4, 3)))
        >>> [g.shape for g in grads]
        [(3, 3), (3, 3)]
    """
    stages = list(stages)
    if not stages or not all(callable(f) for f in stages):
        raise InvalidInputError("stages must be a non-empty sequence of callables stage_fn(params, activations).")
    if not callable(loss_fn):
        raise InvalidInputError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int):
        raise InvalidInputError(f"num_microbatches must be a positive int, got {type(num_microbatches).__name__} "
                                f"{num_microbatches!r}.")
    if devices is not None:
        kinds = (jax.Device, jax.sharding.Mesh, jax.sharding.Sharding)
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
            raise InvalidInputError(f"devices must be a non-empty list of devices (or meshes), got "
                                    f"{type(devices).__name__} {devices!r}.")
        bad = next((d for d in devices if not isinstance(d, kinds)), None)
        if bad is not None:
            raise InvalidInputError(f"devices must hold jax devices, meshes or shardings, got {type(bad).__name__} "
                                    f"{bad!r} among them.")
    return Pipeline(stages, loss_fn, schedule, num_microbatches, devices, partition_fn or default_partition)
