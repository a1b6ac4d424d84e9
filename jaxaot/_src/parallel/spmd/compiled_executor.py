"""The compiled pipeline executor: per input signature, trace the stages and compile the whole step once.

:class:`CompiledExecutor` serves ``executor="compiled"``: per input signature it
checks the stages chain on one device's microbatch, traces and partitions each
stage (:class:`~jaxaot._src.parallel.spmd.passes.StagePasses`), builds and jits the
SPMD step, and checks its compiled peak against the devices' memory before the
first run. Parameters go in as per-stage trees or packed
:class:`~jaxaot._src.parallel.spmd.params.StageParams`, and gradients come back alike.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.parallel import microbatch
from jaxaot._src.parallel.schedule import Schedule
from jaxaot._src.parallel.spmd import params as packing
from jaxaot._src.parallel.spmd.memory import check_fits
from jaxaot._src.parallel.spmd.passes import StagePasses
from jaxaot._src.parallel.spmd.tick_loop import Axes, Layouts, build_step
from jaxaot._src.parallel.spmd.ticks import TickPlan, plan
from jaxaot._src.parallel.stage import Stage, float0_like
from jaxaot._src.partition import compiled_peak
from jaxaot._src.units import format_bytes

P = jax.sharding.PartitionSpec


@dataclasses.dataclass
class Compiled:
    """One signature's step: the jitted program, its layouts and what building it took.

    Attributes:
      step: the jitted step; executable: its XLA executable (after the first call).
      layouts / passes / specs: the records, the stages' passes, each stage's input activations.
      description: the signature in words; seconds: ``trace`` (stages traced and partitioned),
        ``lower`` and ``compile_pipeline_step``.
      fits: whether the compiled peak was found to fit this process's devices (checked before the first run).
    """

    step: Callable
    layouts: Layouts
    passes: list
    specs: list
    description: str
    seconds: dict
    executable: Any = None
    fits: bool = False


def auto_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """``mesh`` with every axis ``Auto``, as the step uses it: ``jax.make_mesh`` makes ``Explicit`` axes by
    default on recent JAX, whose sharding-in-types rules would bind the stages' own code; the step shards
    explicitly itself (``shard_map`` over the stage and data axes) and leaves the rest to XLA."""
    auto = jax.sharding.AxisType.Auto
    if all(t == auto for t in mesh.axis_types):
        return mesh
    return jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(auto,) * len(mesh.axis_names))


def check_mesh(mesh: Any, stage_axis: str, data_axes: Sequence[str] | None = None) -> Axes:
    """The mesh's axes for the compiled step, or a typed error saying what to change. ``data_axes`` None (the
    default): the mesh's ``"data"`` axis where it has one, else no data parallelism; given, each must be an axis
    of the mesh other than ``stage_axis``."""
    if not isinstance(mesh, jax.sharding.Mesh):
        raise InvalidInputError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    names = tuple(mesh.axis_names)
    if stage_axis not in names:
        raise InvalidValueError(
            f"the mesh's axes are {names}, with no pipeline axis {stage_axis!r}: name one axis {stage_axis!r} "
            f"(Mesh(devices, ('stage', 'data'))), or pass stage_axis= naming the one to pipeline over.")
    if data_axes is None:
        data = ("data",) if "data" in names and stage_axis != "data" else ()
    else:
        data = tuple(data_axes)
        missing = [a for a in data if a not in names]
        if missing:
            raise InvalidValueError(
                f"data_axes={data} names {', '.join(map(repr, missing))}, which the mesh does not have: its axes "
                f"are {names}. Name the axes to split the microbatches over among them, or pass data_axes=() for "
                "no data parallelism.")
        if stage_axis in data or len(set(data)) != len(data):
            raise InvalidValueError(f"data_axes={data} must name distinct axes other than the pipeline axis "
                                    f"{stage_axis!r}; the mesh's axes are {names}.")
    auto = tuple(a for a in names if a != stage_axis and a not in data)
    return Axes(stage_axis, data, mesh.shape[stage_axis], auto)


class CompiledExecutor:
    """Runs a pipeline as one compiled SPMD program (see the module docstring)."""

    def __init__(self, stages: Sequence[Stage], loss_fn: Callable, schedule: Schedule, num_microbatches: int,
                 mesh: jax.sharding.Mesh, axes: Axes, param_specs: Sequence[Any] | None = None):
        self.stages = list(stages)
        self.stage_fns = [st.fn for st in self.stages]
        self.loss_fn = loss_fn
        self.schedule = schedule
        self.num_microbatches = num_microbatches
        self.mesh = mesh
        self.axes = axes
        self.tick_plan: TickPlan = plan(schedule)
        self.stage_device = schedule.stage_device()
        self._split_stages = {a.stage for a in schedule.actions if a.op == "B"}
        self._compiled: dict[Any, Compiled] = {}
        self.hits = 0
        self._replicated = jax.sharding.NamedSharding(mesh, P())
        self.param_specs = param_specs

    @property
    def data_size(self) -> int:
        return int(np.prod([self.mesh.shape[a] for a in self.axes.data], dtype=np.int64))

    # -- signatures
    def local_microbatch(self, name: str, tree: Any) -> Any:
        """One device's microbatch of ``tree`` (``jax.ShapeDtypeStruct`` leaves), checked to divide evenly."""
        m, k = self.num_microbatches, self.data_size
        microbatch.check_batch(name, tree, m)

        def one(x: Any) -> jax.ShapeDtypeStruct:
            size = np.shape(x)[0] // m
            if size % k:
                raise InvalidValueError(
                    f"the pipeline's {name} have a microbatch of {size} (batch {np.shape(x)[0]} / {m} microbatches), "
                    f"which the data axes {self.axes.data} of {k} devices do not split evenly: make the batch a "
                    f"multiple of {m * k}.")
            t = microbatch.leaf_type(x)
            return jax.ShapeDtypeStruct((size // k,) + tuple(t.shape[1:]), t.dtype, weak_type=t.weak_type)

        return jax.tree_util.tree_map(one, tree)

    def compiled(self, param_avals: Sequence[Any], inputs: Any, targets: Any) -> Compiled:
        """The step for this signature, traced once. The stages trace under the step's mesh with its pipeline and
        data axes manual, as they run inside its ``shard_map``: a stage's ``with_sharding_constraint`` over the
        other axes (a PartitionSpec or a NamedSharding) means there what it means inside the step."""
        key = _signature(param_avals, inputs, targets)
        hit = self._compiled.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        manual = {a: jax.sharding.AxisType.Manual for a in (self.axes.stage, *self.axes.data)}
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh.update_axis_types(manual)):
            return self._trace(key, param_avals, inputs, targets)

    def _trace(self, key: Any, param_avals: Sequence[Any], inputs: Any, targets: Any) -> Compiled:
        t0 = time.perf_counter()
        x = self.local_microbatch("inputs", inputs)
        t = self.local_microbatch("targets", targets)
        specs_in = microbatch.stage_input_specs(self.stage_fns, self.loss_fn, param_avals, x, t)
        passes = []
        for s, (stage, p, a) in enumerate(zip(self.stages, param_avals, specs_in)):
            sp = stage.programs(p, a, t if stage.is_last else None)
            split = sp.split if s in self._split_stages else None
            passes.append(StagePasses(s, sp.training, sp.num_params, sp.num_activations,
                                      jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(a), split))
        t1 = time.perf_counter()
        loss_dtype = passes[-1].output_avals[0].dtype
        specs = self._flat_specs(param_avals)
        step, lay = build_step(self.tick_plan, passes, self.mesh, self.axes, self.num_microbatches, loss_dtype, specs)
        shardings = [packing.entry_sharding(self.mesh, self.axes.stage, sp)
                     for sp in (lay.params.specs or [None] * len(lay.params.entries))]
        text = f"params: {microbatch.describe(list(param_avals))}, inputs: {microbatch.describe(inputs)}, " \
               f"targets: {microbatch.describe(targets)}"
        jitted = jax.jit(step, in_shardings=(shardings, self._replicated, self._replicated),
                         out_shardings=(self._replicated, shardings))
        out = Compiled(jitted, lay, passes, list(specs_in), text, {"trace": t1 - t0})
        self._compiled[key] = out
        return out

    # -- the step
    def shard_params(self, params: Sequence[Any], param_avals: Sequence[Any], inputs: Any,
                     targets: Any) -> packing.StageParams:
        c = self.compiled(param_avals, inputs, targets)
        return packing.pack(params, c.layouts.params, self.stage_device, self.mesh, self.axes.stage)

    def place(self, tree: Any) -> list:
        """``tree``'s leaves as arrays replicated over the mesh (any process holds the same values)."""
        out = []
        for x in jax.tree_util.tree_leaves(tree):
            if isinstance(x, jax.Array) and x.sharding == self._replicated:
                out.append(x)
            elif isinstance(x, jax.Array) and x.sharding.device_set == set(self.mesh.devices.flat):
                out.append(jax.device_put(x, self._replicated))  # onto the step's mesh (its axes all Auto)
            elif self._replicated.is_fully_addressable:
                out.append(jax.device_put(x, self._replicated))
            else:
                host = np.asarray(x)
                out.append(jax.make_array_from_callback(host.shape, self._replicated, lambda idx, h=host: h[idx]))
        return out

    def __call__(self, params: Any, inputs: Any, targets: Any, param_avals: Sequence[Any]) -> tuple[Any, Any]:
        with packing.outside_mesh_context():
            return self._call(params, inputs, targets, param_avals)

    def _call(self, params: Any, inputs: Any, targets: Any, param_avals: Sequence[Any]) -> tuple[Any, Any]:
        c = self.compiled(param_avals, inputs, targets)
        packed_in = isinstance(params, packing.StageParams)
        packed = params if packed_in else packing.pack(params, c.layouts.params, self.stage_device, self.mesh,
                                                      self.axes.stage)
        if packed.layout != c.layouts.params or any(
                getattr(e.sharding, "mesh", self.mesh) != self.mesh for e in packed.entries[:1]):
            raise InvalidInputError("these StageParams were packed for another pipeline, mesh or signature: unpack "
                                    "them with that step's unshard_params and pack them with this step's shard_params "
                                    "for these inputs.")
        args = (list(packed.entries), self.place(inputs), self.place(targets))
        self._executable(c, args)
        if not c.fits:
            check_fits(compiled_peak(c.executable), [d for d in self.mesh.devices.flat if d.process_index ==
                                                     jax.process_index()], args, self._peak_parts(c), self.schedule)
            c.fits = True
        loss, grads = c.executable(*args)
        grads = packing.StageParams(tuple(grads), packed.layout, packed.treedefs)
        if packed_in:
            return loss, grads
        trees = packing.unpack(grads, self.stage_device, self.mesh, self.axes.stage)
        return loss, [jax.tree_util.tree_map(_gradient, g, a) for g, a in zip(trees, param_avals)]

    def _peak_parts(self, c: Compiled) -> str:
        """What the step's buffers hold per device, in words."""
        lay, slots = c.layouts, self.tick_plan.slots
        parts = [f"{slots['residuals']} residual slots of {format_bytes(lay.residuals.nbytes)}"]
        if slots["weights"]:
            parts.append(f"{slots['weights']} W-argument slots of {format_bytes(lay.weights.nbytes)}")
        parts.append(f"parameters and gradients {format_bytes(2 * lay.params.nbytes)}")
        return ", ".join(parts) + ", the passes' temporaries, the inputs and targets"

    def _flat_specs(self, param_avals: Sequence[Any]) -> list | None:
        """Per stage, each parameter leaf's sharding over the automatic axes (from ``param_specs``)."""
        if self.param_specs is None:
            return None
        if len(self.param_specs) != len(param_avals):
            raise InvalidInputError(f"param_specs must hold one tree of PartitionSpecs per stage "
                                    f"({len(param_avals)}), got {len(self.param_specs)}.")
        out = []
        for s, (spec, avals) in enumerate(zip(self.param_specs, param_avals)):
            treedef = jax.tree_util.tree_structure(avals)
            try:
                flat = treedef.flatten_up_to(spec)
            except (ValueError, TypeError) as e:
                raise InvalidInputError(f"param_specs[{s}] does not match stage {s}'s parameters: {e}") from None
            for leaf in flat:
                if leaf is not None and not isinstance(leaf, P):
                    raise InvalidInputError(f"param_specs[{s}] holds {leaf!r}: give a PartitionSpec (or None) per "
                                            "parameter leaf.")
                named = [n for a in (leaf or ()) if a is not None for n in (a if isinstance(a, tuple) else (a,))]
                unknown = [n for n in named if n not in self.mesh.axis_names]
                if unknown:
                    raise InvalidValueError(
                        f"param_specs[{s}] holds {leaf}, which names {', '.join(map(repr, unknown))}: not an axis of "
                        f"the mesh, whose axes are {tuple(self.mesh.axis_names)}. Shard a stage's parameters over "
                        f"the mesh's other axes {self.axes.auto} (not the pipeline or data axes).")
                bad = [n for n in named if n not in self.axes.auto]
                if bad:
                    raise InvalidValueError(
                        f"param_specs[{s}] shards over {bad}, but a stage's parameters may only be sharded over "
                        f"the mesh's other axes {self.axes.auto} (not the pipeline or data axes).")
            paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(avals)[0]]
            for path, leaf, aval in zip(paths, flat, jax.tree_util.tree_leaves(avals)):
                _check_divides(s, path, leaf, aval, self.mesh)
            out.append(flat)
        return out

    @staticmethod
    def _executable(c: Compiled, args: tuple) -> Any:
        """``c``'s XLA executable, lowered and compiled at its first use (the times go to ``c.seconds``)."""
        if c.executable is None:
            t0 = time.perf_counter()
            lowered = c.step.lower(*args)
            t1 = time.perf_counter()
            c.executable = lowered.compile()
            c.seconds.update(lower=t1 - t0, compile_pipeline_step=time.perf_counter() - t1)
        return c.executable

    def executable(self, params: Any, inputs: Any, targets: Any, param_avals: Sequence[Any]) -> Any:
        """The step's XLA executable for these arguments (compiled once per signature, shared with the step)."""
        c = self.compiled(param_avals, inputs, targets)
        packed = params if isinstance(params, packing.StageParams) else packing.pack(
            params, c.layouts.params, self.stage_device, self.mesh, self.axes.stage)
        return self._executable(c, (list(packed.entries), self.place(inputs), self.place(targets)))

    def signatures(self) -> list[Compiled]:
        """The compiled signatures, in the order they were first seen."""
        return list(self._compiled.values())

    def lower(self, params: Any, inputs: Any, targets: Any, param_avals: Sequence[Any]) -> Any:
        """The jitted step lowered for these arguments (``.compile().memory_analysis()`` for its peak)."""
        c = self.compiled(param_avals, inputs, targets)
        packed = params if isinstance(params, packing.StageParams) else packing.pack(
            params, c.layouts.params, self.stage_device, self.mesh, self.axes.stage)
        return c.step.lower(list(packed.entries), self.place(inputs), self.place(targets))


def _signature(param_avals: Sequence[Any], inputs: Any, targets: Any) -> Any:
    """Structure, shapes, dtypes and weak types (a weak type changes how the stages trace)."""
    leaves, treedef = jax.tree_util.tree_flatten((list(param_avals), inputs, targets))
    types = [microbatch.leaf_type(x) for x in leaves]
    return treedef, tuple((tuple(t.shape), t.dtype, t.weak_type) for t in types)


def _gradient(g: Any, aval: Any) -> Any:
    """A parameter's gradient as ``jax.grad(..., allow_int=True)`` gives it: float0 zeros for a leaf that is not
    inexact (integers, bools, PRNG keys), ``aval``'s weak type otherwise."""
    if not C.is_inexact(aval.dtype):
        return float0_like(aval)
    return C.typed_as(g, aval)


def _check_divides(stage: int, path: str, spec: Any, aval: Any, mesh: jax.sharding.Mesh) -> None:
    """Refuse a parameter's ``PartitionSpec`` with more entries than the parameter has dimensions, or whose mesh axes
    do not divide the dimension they split, naming the parameter (XLA would name the stages' packed array instead)."""
    if spec is not None and len(spec) > len(aval.shape):
        raise InvalidValueError(
            f"param_specs[{stage}]{path} = {spec} names {len(spec)} dimensions, but the parameter is "
            f"{tuple(aval.shape)} (rank {len(aval.shape)}): give at most one entry per dimension.")
    for dim, axes in enumerate(spec or ()):
        if axes is None:
            continue
        size = math.prod(mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,)))
        if aval.shape[dim] % size:
            raise InvalidValueError(
                f"param_specs[{stage}]{path} = {spec} splits dimension {dim} of a {tuple(aval.shape)} parameter over "
                f"{size} devices, which does not divide {aval.shape[dim]}: choose axes whose sizes divide it, or "
                f"leave that dimension unsharded (None).")
