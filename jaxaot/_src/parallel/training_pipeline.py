"""``jaxaot.parallel.pipeline``: pipeline-parallel training steps, compiled as one SPMD program.

Stages ``stage_fn(params_i, activations)`` and a ``loss_fn`` become a step
``loss, grads = step(params, inputs, targets)`` equal to ``jax.value_and_grad`` of
the unpipelined composition over the mean microbatch loss. Each stage is an
:func:`jaxaot.aot_function`, its backward split into B and W where the schedule
defers weight gradients. The ``"compiled"`` executor (default,
``docs/concepts/pipeline.md``) runs the whole schedule as one ``shard_map``
program, with data and tensor parallelism on the mesh's other axes; the
``"python"`` executor dispatches each stage's executables, for what that cannot run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.parallel import microbatch, op_times, spmd
from jaxaot._src.parallel.builtin import make_schedule
from jaxaot._src.parallel.python_executor import run_schedule
from jaxaot._src.parallel.report import PipelineReport
from jaxaot._src.parallel.simulator import OpTimes
from jaxaot._src.parallel.stage import Placement, Stage, StagePrograms, float0_like
from jaxaot._src.partition import Partitioner, compiled_peak, default_partition
from jaxaot._src.runtime import CacheEntryInfo, CacheInfo

EXECUTORS = ("compiled", "python")


def _concrete(*trees: Any) -> None:
    """A step runs its own compiled programs on concrete arrays: under ``jax.jit``, ``jax.grad`` or ``vmap`` it
    raises :class:`~jaxaot.errors.InvalidInputError` (jit the optimizer update on its own)."""
    if any(C.is_tracer(x) for x in jax.tree_util.tree_leaves(trees)):
        raise InvalidInputError(
            "a pipeline step runs its compiled schedule on concrete arrays and returns the loss and the gradients: "
            "call it outside jax.jit, jax.grad and jax.vmap, and jit the optimizer update on its own (the step "
            "itself is already compiled).")


def _weight_pass_bytes(schedule: Any, programs: Sequence[StagePrograms]) -> tuple:
    """Per stage, what its B keeps alive for its W: nothing where the schedule runs no W there (a BW instead)."""
    split = {a.stage for a in schedule.actions if a.op == "W"}
    return tuple(p.split.live_bytes if s in split else 0 for s, p in enumerate(programs))


def _measure_source(source: Any, **counts: Any) -> str:
    """:meth:`Pipeline.measure_op_times`'s ``source``, checked with its counts (each a positive int)."""
    if source not in ("compiled", "executables"):
        raise InvalidValueError(f"source must be 'compiled' or 'executables', got {source!r}.")
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InvalidValueError(f"measure_op_times: {name} must be a positive int, got {n!r}.")
    return source


class Pipeline:
    """A pipeline-parallel training step; build it with :func:`pipeline`.

    Attributes:
      stages: the stages, in order: each function's :func:`jaxaot.aot_function` (``aot``), on its device.
      schedule: the :class:`~jaxaot.parallel.Schedule` each step runs.
      num_microbatches: how many microbatches a batch is split into.
      executor: ``"compiled"`` or ``"python"``.
      mesh: the compiled executor's mesh (None for ``"python"``).
      last_peak_live: per stage, the most microbatches whose residuals the last
        step held at once (None before the first step).
    """

    def __init__(self, stage_fns: Sequence[Callable], loss_fn: Callable, schedule: Any, num_microbatches: int,
                 devices: Sequence[Placement] | None, partition_fn: Partitioner, *, mesh: Any = None,
                 stage_axis: str = "stage", data_axes: Sequence[str] | None = None, executor: str = "compiled",
                 param_specs: Sequence[Any] | None = None):
        self.stage_fns, self.loss_fn, self.num_microbatches = list(stage_fns), loss_fn, num_microbatches
        self.executor = executor
        n = len(self.stage_fns)
        if executor == "compiled":
            built = make_schedule(schedule, n, num_microbatches) if mesh is None and devices is None else None
            devices = devices if built is None else _first_devices(built, _NO_MESH.format(stage_axis))
            mesh = spmd.auto_mesh(_mesh_for(mesh, devices, stage_axis))
            axes = spmd.check_mesh(mesh, stage_axis, None if data_axes is None else tuple(data_axes))
            self.schedule = (built if built is not None and built.num_devices == axes.num_devices
                             else make_schedule(schedule, n, num_microbatches, axes.num_devices))
            self.mesh = mesh
            first = _stage_devices(mesh, stage_axis)
            self.devices = [first[d] for d in range(self.schedule.num_devices)]
        else:
            if mesh is not None:
                raise InvalidInputError("mesh= needs the compiled executor: drop executor='python', or pass "
                                        "devices=[...] (a device or sub-mesh per schedule device).")
            self.schedule = make_schedule(schedule, n, num_microbatches, None if devices is None else len(devices))
            self.mesh = None
            self.devices = list(devices) if devices is not None else _first_devices(self.schedule)
            _check_local(self.devices)
        where = self.schedule.stage_device()
        self.stages = [Stage(s, fn, self.devices[where[s]], partition_fn, loss_fn if s == n - 1 else None)
                       for s, fn in enumerate(self.stage_fns)]
        if param_specs is not None and executor != "compiled":
            raise InvalidInputError("param_specs needs the compiled executor; with executor='python', shard each "
                                    "stage's parameters over its sub-mesh yourself.")
        self._compiled = (spmd.CompiledExecutor(self.stages, loss_fn, self.schedule, num_microbatches, self.mesh, axes,
                                                param_specs) if executor == "compiled" else None)
        self._programs: dict[Any, list[StagePrograms]] = {}
        self._specs: dict[Any, list] = {}
        self._hits = 0
        self.last_peak_live: tuple[int, ...] | None = None

    # -- the step
    def __call__(self, params: Any, inputs: Any, targets: Any) -> tuple[jax.Array, Any]:
        """One training step: ``(mean microbatch loss, per-stage gradients)``; nothing blocks.

        With the compiled executor, ``params`` may come packed by :meth:`shard_params`; the grads then do too.
        """
        _concrete(params, inputs, targets)
        if self._compiled is not None:
            loss, grads = self._compiled(params, inputs, targets, self._param_avals(params))
            self.last_peak_live = tuple(self.schedule.peak_live_microbatches())
            return loss, grads if isinstance(grads, spmd.StageParams) else _like(params, grads)
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
        return result.loss, _like(params, grads)

    def shard_params(self, params: Sequence[Any], inputs: Any, targets: Any) -> spmd.StageParams:
        """``params`` packed for the compiled step (each device holds its stages' leaves).

        Pack once and pass the result to every step (an optimizer can ``jax.tree.map`` over it): the step then
        skips packing, and returns gradients packed the same way. Across hosts this is the only form that
        works: every process passes the same full list here, and contributes its own devices' pieces.
        """
        ex = self._require_compiled("shard_params")
        self._check_params(params)
        return ex.shard_params(params, self._param_avals(params), inputs, targets)

    def unshard_params(self, packed: spmd.StageParams) -> list:
        """Per-stage trees from packed parameters or gradients (every stage's devices must be this process's)."""
        ex = self._require_compiled("unshard_params")
        return spmd.unpack(packed, ex.stage_device, ex.mesh, ex.axes.stage)

    def lower(self, params: Any, inputs: Any, targets: Any) -> PipelineReport:
        """Trace and partition every stage for these arguments (no stage program compiles or runs)."""
        if self._compiled is not None:
            c = self._compiled.compiled(self._param_avals(params), inputs, targets)
            return PipelineReport(
                schedule=self.schedule, input_specs=tuple(c.specs),
                placements=tuple(self.devices[d] for d in self._compiled.stage_device.values()),
                residual_bytes=tuple(sum(_nbytes(a) for a in p.stored_residuals) for p in c.passes),
                weight_pass_bytes=tuple(sum(_nbytes(a) for a in p.stored_weight_args) for p in c.passes),
                peak_live_microbatches=tuple(self.schedule.peak_live_microbatches()),
                ideal_peak_bytes=c.layouts.ideal_bytes(self._compiled.tick_plan.slots))
        placed, xs, ts, programs = self._prepare(params, inputs, targets)
        return PipelineReport(
            schedule=self.schedule, placements=tuple(st.placement for st in self.stages),
            input_specs=tuple(self._specs[_key(placed, xs[0], ts[0])]),
            residual_bytes=tuple(p.residual_bytes for p in programs),
            weight_pass_bytes=_weight_pass_bytes(self.schedule, programs),
            peak_live_microbatches=tuple(self.schedule.peak_live_microbatches()),
        )

    def compile(self, params: Any, inputs: Any, targets: Any) -> Any:
        """The compiled step's XLA executable for these arguments (``memory_analysis()``: per-device bytes)."""
        ex = self._require_compiled("compile")
        return ex.executable(params, inputs, targets, self._param_avals(params))

    def peak_bytes(self, params: Any, inputs: Any, targets: Any) -> int | None:
        """The compiled step's peak device bytes, per device (None where the backend does not say)."""
        return compiled_peak(self.compile(params, inputs, targets))

    def measure_op_times(self, params: Sequence[Any], inputs: Any, targets: Any, *, repeats: int = 5,
                         back_to_back: int = 4, source: str | None = None) -> OpTimes:
        """Per-stage F, B, W, BW (and transfer) times: the :class:`~jaxaot.parallel.OpTimes` the simulators take.

        ``source="compiled"`` (the compiled executor's default): the passes as the compiled step inlines
        them, each timed in a compiled loop on one device (no transfers), for
        :func:`~jaxaot.parallel.simulate_lockstep`. ``source="executables"`` (the Python executor's): the
        stages' own executables on their devices, ``back_to_back`` dispatches per sample, and the transfers
        between devices, for :func:`~jaxaot.parallel.simulate`.
        """
        source = _measure_source(source or ("compiled" if self._compiled is not None else "executables"),
                                 repeats=repeats, back_to_back=back_to_back)
        params = self.unshard_params(params) if isinstance(params, spmd.StageParams) else params  # per stage
        if source == "compiled":
            ex = self._require_compiled("measure_op_times(source='compiled')")
            c = ex.compiled(self._param_avals(params), inputs, targets)
            one = lambda tree, name: [x[:s.shape[0]] for x, s in zip(  # noqa: E731
                jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(ex.local_microbatch(name, tree)))]
            return spmd.pass_times(c.passes, [jax.tree_util.tree_leaves(p) for p in params], one(inputs, "inputs"),
                                   one(targets, "targets"), 1.0 / self.num_microbatches, repeats=repeats)
        placed, xs, ts, programs = self._prepare(params, inputs, targets)
        return op_times.measure(self.stages, programs, placed, xs[0], ts[0], self._loss_cotangent(programs[-1]),
                                repeats=repeats, back_to_back=back_to_back)

    def cache_info(self) -> CacheInfo:
        """The step's signatures (``hits``: steps that found theirs, ``misses``: signatures traced) and, per
        stage, its entries (``program``: ``stage0``, ...): what it compiled, the seconds and the reason. With
        the compiled executor, an entry ``step`` per signature holds the one executable, ``pipeline_step``;
        the stages are traced and partitioned, then inlined into it, so their entries compile nothing.

        Example:
            >>> from jaxaot.parallel import pipeline
            >>> import jax, jax.numpy as jnp
            >>> layer = lambda w, x: jnp.tanh(x @ w)
            >>> step = pipeline([layer, layer], lambda y, t: jnp.mean((y - t) ** 2), schedule="gpipe",
            ...                 num_microbatches=2, devices=[jax.devices()[0]] * 2, executor="python")
            >>> for _ in range(2):
            ...     _ = step([jnp.eye(3), jnp.eye(3)], jnp.ones((4, 3)), jnp.zeros((4, 3)))
            >>> info = step.cache_info()
            >>> info.hits, info.misses, [e.program for e in info.entries]
            (1, 1, ['stage0', 'stage1'])
        """
        stages = CacheInfo.combine({f"stage{st.index}": st.aot.cache_info() for st in self.stages})
        if self._compiled is None:
            return CacheInfo(self._hits, len(self._programs), stages.entries)
        ex = self._compiled
        steps = tuple(CacheEntryInfo(c.description, "first call" if k == 0 else "new input signature",
                                     ("pipeline_step",), program="step", compiles=("pipeline_step",),
                                     times=dict(c.seconds))
                      for k, c in enumerate(ex.signatures()))
        return CacheInfo(ex.hits, len(steps), steps + stages.entries)

    # -- per signature (python executor)
    def _prepare(self, params: Sequence[Any], inputs: Any, targets: Any) -> tuple[list, list, list, list]:
        """Placed parameters, microbatches and the stages' programs (traced at a signature's first call)."""
        self._check_params(params)
        m = self.num_microbatches
        microbatch.check_batch("inputs", inputs, m)
        microbatch.check_batch("targets", targets, m)
        placed = [st.place(p) for st, p in zip(self.stages, params)]
        xs = microbatch.split(self.stages[0].place(inputs), m)
        ts = microbatch.split(self.stages[-1].place(targets), m)
        key = _key(placed, xs[0], ts[0])
        programs = self._programs.get(key)
        if programs is not None:
            self._hits += 1
        else:
            specs = microbatch.stage_input_specs([st.call for st in self.stages], self.loss_fn, placed, xs[0], ts[0])
            programs = [st.programs(st.spec(p), st.spec(a), st.spec(ts[0]) if st.is_last else None)
                        for st, p, a in zip(self.stages, placed, specs)]
            self._programs[key] = programs
            self._specs[key] = specs
        return placed, xs, ts, programs

    def _check_params(self, params: Any) -> None:
        if not isinstance(params, (list, tuple)) or len(params) != len(self.stages):
            raise InvalidInputError(
                f"params must be a list with one parameter tree per stage ({len(self.stages)}), got "
                f"{type(params).__name__}" + (f" of {len(params)}" if isinstance(params, (list, tuple)) else ""))

    def _param_avals(self, params: Any) -> list:
        if isinstance(params, spmd.StageParams):
            return spmd.stage_avals(params)
        self._check_params(params)
        return [jax.tree_util.tree_map(microbatch.leaf_type, p) for p in params]

    def _require_compiled(self, what: str) -> spmd.CompiledExecutor:
        if self._compiled is None:
            raise InvalidInputError(f"step.{what} belongs to the compiled executor; this step runs "
                                    "executor='python'.")
        return self._compiled

    def _loss_cotangent(self, last: StagePrograms) -> list:
        dtype = last.output_specs()[0].dtype
        return [self.stages[-1].place(np.asarray(1.0 / self.num_microbatches, dtype))]

    def __repr__(self) -> str:
        return (f"<Pipeline {self.schedule.name} ({self.executor}): {len(self.stages)} stages, "
                f"{self.num_microbatches} microbatches, {self.schedule.num_devices} devices>")


def _like(params: Sequence[Any], grads: list) -> Any:
    """``grads`` (one tree per stage) in the container ``params`` came in, as ``jax.grad`` returns them."""
    if type(params) is list:
        return grads
    if hasattr(params, "_fields"):  # a namedtuple
        return type(params)(*grads)
    return tuple(grads) if isinstance(params, tuple) else grads


def _key(params: Any, x: Any, t: Any) -> Any:
    """The input signature of a step: structure, shapes, dtypes, weak types and shardings."""
    leaves, treedef = jax.tree_util.tree_flatten((params, x, t))
    return treedef, tuple((v.shape, v.dtype, v.aval.weak_type, v.sharding) for v in leaves)


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


#: What to pass instead, when a compiled pipeline given no mesh finds too few devices.
_NO_MESH = "pass a mesh with a {!r} axis of that many, or executor='python' with devices=[...]"


def _check_local(devices: Sequence[Any]) -> None:
    """The Python executor dispatches every stage from this process: each stage's devices must be its own."""
    for where in devices:
        held = [where] if isinstance(where, jax.Device) else list(
            where.devices.flat if isinstance(where, jax.sharding.Mesh) else where.device_set)
        other = next((d for d in held if d.process_index != jax.process_index()), None)
        if other is not None:
            raise InvalidValueError(
                f"executor='python' runs every stage from this process (process {jax.process_index()}), but {other} "
                f"belongs to process {other.process_index}: give each process's pipeline its own devices "
                "(jax.local_devices()), or span processes with executor='compiled' and a mesh over every device.")


def _first_devices(schedule: Any, remedy: str = "pass devices=[...] with executor='python'") -> list:
    """The first ``schedule.num_devices`` devices JAX has (for a pipeline given no mesh or devices), or an error
    that says what to pass instead (``remedy``)."""
    available = jax.devices()
    if len(available) < schedule.num_devices:
        raise InvalidValueError(
            f"the {schedule.name!r} schedule of {schedule.num_stages} stages needs {schedule.num_devices} devices, "
            f"but JAX has {len(available)}: {remedy} (a device may appear more than once).")
    return available[:schedule.num_devices]


def _stage_devices(mesh: jax.sharding.Mesh, stage_axis: str) -> dict[int, Any]:
    """Per coordinate of the stage axis, the first device there (where per-stage trees come back)."""
    axis = mesh.axis_names.index(stage_axis)
    out: dict[int, Any] = {}
    for idx in np.ndindex(mesh.devices.shape):
        out.setdefault(idx[axis], mesh.devices[idx])
    return out


def _mesh_for(mesh: Any, devices: Any, stage_axis: str) -> Any:
    """The compiled executor's mesh: ``mesh``, or one axis over ``devices``."""
    if mesh is not None:
        if devices is not None:
            raise InvalidInputError("pass mesh= or devices=, not both: the mesh names the devices.")
        return mesh
    if any(not isinstance(d, jax.Device) for d in devices) or len(set(devices)) != len(devices):
        raise InvalidValueError(
            "the compiled executor runs one schedule device per physical device, on a mesh: devices must be "
            "distinct jax devices. For stages sharing a device, or a sub-mesh per stage, pass executor='python'; "
            "for data parallelism inside stages, pass mesh=Mesh(devices, ('stage', 'data')).")
    return jax.sharding.Mesh(np.array(list(devices)), (stage_axis,))


def pipeline(stages: Sequence[Callable], loss_fn: Callable, schedule: Any = "1f1b", num_microbatches: int = 8,
             devices: Sequence[Placement] | None = None, partition_fn: Partitioner | None = None, *,
             mesh: jax.sharding.Mesh | None = None, stage_axis: str = "stage", data_axes: Sequence[str] | None = None,
             executor: str = "compiled", param_specs: Sequence[Any] | None = None) -> Pipeline:
    """A pipeline-parallel training step (``docs/concepts/pipeline.md``).

    Args:
      stages: ``stage_fn(params_i, activations) -> activations``, in order.
      loss_fn: ``loss_fn(last_activations, targets_microbatch) -> scalar``, one microbatch's loss. With data
        axes, each device's share of a microbatch gets it and the results are averaged: the microbatch's
        loss when ``loss_fn`` is a mean over examples, as the usual losses are.
      schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, ``"zero_bubble"`` or a
        :class:`~jaxaot.parallel.Schedule`.
      num_microbatches: the batch (axis 0 of every input and target leaf) is split in this many.
      devices: one device per schedule device (``executor="python"``: a device or sub-mesh each, repeats
        allowed); default ``jax.devices()[:num_devices]``.
      partition_fn: each stage's partitioner; default :func:`jaxaot.partition.default_partition`.
      mesh: the compiled executor's ``jax.sharding.Mesh``: the ``stage_axis`` axis pipelines, ``data_axes``
        split the microbatches.
      stage_axis / data_axes: the mesh's axis names for the pipeline and for data parallelism. ``data_axes``
        default: the mesh's ``"data"`` axis where it has one, else none (a mesh of ``("stage", "batch")`` splits
        nothing over ``"batch"`` unless ``data_axes=("batch",)`` says so); axes given must be the mesh's. Any
        other axis of the mesh is left to XLA inside each stage (tensor or FSDP parallelism), as ``param_specs``
        says.
      param_specs: per stage, a tree of ``PartitionSpec`` (or None) matching its parameters: how each leaf
        is sharded over the mesh's other axes, e.g. ``P(None, "model")`` for a column-parallel weight.
        Default: replicated over them.
      executor: ``"compiled"`` (one SPMD program, with data and tensor parallelism on the mesh's other
        axes) or ``"python"`` (dispatches each stage's executables, for what one program cannot run).

    Returns:
      a :class:`Pipeline`: ``step(params, inputs, targets) -> (loss, grads)``, plus ``step.lower(...)``,
      ``step.shard_params(...)``, ``step.peak_bytes(...)``, ``step.measure_op_times(...)`` and
      ``step.cache_info()``.

    Raises:
      InvalidInputError: ``stages`` is empty or holds something not callable, ``loss_fn`` or ``partition_fn``
        is not callable, ``num_microbatches`` is not an int, ``devices`` is not a sequence of devices,
        meshes or shardings, ``executor`` is not a str, ``mesh`` is not a Mesh, the axis names are not str.
      InvalidValueError: ``executor`` is unknown, the mesh lacks the pipeline axis or an axis ``data_axes``
        names, devices repeat under the compiled executor, ``param_specs`` shards over the pipeline or data
        axes; see also :func:`~jaxaot.parallel.make_schedule` (and its :class:`~jaxaot.errors.ScheduleError`).

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> layer = lambda w, x: jnp.tanh(x @ w)
        >>> step = jaxaot.parallel.pipeline([layer, layer], lambda y, t: jnp.mean((y - t) ** 2),
        ...                 schedule="gpipe", num_microbatches=2, devices=[jax.devices()[0]] * 2, executor="python")
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
    if not isinstance(executor, str):
        raise InvalidInputError(f"executor must be a str, one of {EXECUTORS}, got {type(executor).__name__}.")
    if executor not in EXECUTORS:
        raise InvalidValueError(f"executor must be one of {EXECUTORS}, got {executor!r}.")
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise InvalidInputError(f"mesh must be a jax.sharding.Mesh with a {stage_axis!r} axis, got "
                                f"{type(mesh).__name__} {mesh!r}.")
    if not isinstance(stage_axis, str) or data_axes is not None and (
            isinstance(data_axes, str) or not isinstance(data_axes, (list, tuple))
            or not all(isinstance(a, str) for a in data_axes)):
        raise InvalidInputError(f"stage_axis must be a str and data_axes a sequence of str, got {stage_axis!r} and "
                                f"{data_axes!r}.")
    if param_specs is not None and (not isinstance(param_specs, (list, tuple)) or len(param_specs) != len(stages)):
        raise InvalidInputError(f"param_specs must be a list with one tree of PartitionSpecs per stage "
                                f"({len(stages)}), got {type(param_specs).__name__} {param_specs!r}.")
    if devices is not None:
        kinds = (jax.Device, jax.sharding.Mesh, jax.sharding.Sharding)
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
            raise InvalidInputError(f"devices must be a non-empty list of devices (or meshes), got "
                                    f"{type(devices).__name__} {devices!r}.")
        bad = next((d for d in devices if not isinstance(d, kinds)), None)
        if bad is not None:
            raise InvalidInputError(f"devices must hold jax devices, meshes or shardings, got {type(bad).__name__} "
                                    f"{bad!r} among them.")
    return Pipeline(stages, loss_fn, schedule, num_microbatches, devices, partition_fn or default_partition,
                    mesh=mesh, stage_axis=stage_axis, data_axes=data_axes, executor=executor,
                    param_specs=param_specs)
