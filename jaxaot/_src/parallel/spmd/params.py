"""Per-stage parameter trees packed into arrays sharded over the stage axis, and back.

:class:`StageParams` is one global array per parameter entry of the
:class:`~jaxaot._src.parallel.spmd.layout.Layout`, sharded over the stage axis, so
each device holds only its stages' parameters; it is a pytree an optimizer can map
over, and the only form that works across hosts. :func:`pack` builds it from
per-stage trees without gathering on one device; :func:`unpack` goes back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError
from jaxaot._src.parallel.spmd.layout import Layout

P = jax.sharding.PartitionSpec


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class StageParams:
    """A pipeline's parameters (or gradients) packed for the compiled step.

    Attributes:
      entries: one global array per layout entry, ``[stage devices, width, *shape]``.
      layout: where each stage's leaves sit.
      treedefs: each stage's parameter tree structure.
    """

    entries: tuple
    layout: Layout
    treedefs: tuple

    def tree_flatten(self):
        return tuple(self.entries), (self.layout, self.treedefs)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(tuple(children), *aux)


@contextlib.contextmanager
def outside_mesh_context():
    """Leaves a ``jax.set_mesh`` context for the block: per-device work (records built on one device) and the
    step's own shardings (on its mesh, every axis ``Auto``) do not belong to the user's context mesh."""
    if jax.sharding.get_mesh().empty:
        yield
        return
    with jax.set_mesh(None):
        yield


def entry_sharding(mesh: jax.sharding.Mesh, stage_axis: str, spec: Any = None) -> jax.sharding.NamedSharding:
    """An entry's sharding: its first axis over the stage axis, its leaves' dimensions as ``spec`` says."""
    return jax.sharding.NamedSharding(mesh, P(stage_axis, None, *(spec or ())))


def pack(params: Sequence[Any], layout: Layout, stage_device: dict[int, int], mesh: jax.sharding.Mesh,
         stage_axis: str) -> StageParams:
    """``params`` (one tree per stage) as :class:`StageParams` (see the module docstring)."""
    with outside_mesh_context():
        return _pack(params, layout, stage_device, mesh, stage_axis)


def _pack(params: Sequence[Any], layout: Layout, stage_device: dict[int, int], mesh: jax.sharding.Mesh,
          stage_axis: str) -> StageParams:
    flat = [jax.tree_util.tree_flatten(p) for p in params]
    num_devices = mesh.shape[stage_axis]
    entries = []
    for e, ((cell, dtype), width) in enumerate(zip(layout.entries, layout.widths)):
        spec = layout.specs[e] if layout.specs else None
        target = entry_sharding(mesh, stage_axis, spec)
        global_shape = (num_devices, width) + tuple(cell)
        pieces = []
        for dev, index in target.addressable_devices_indices_map(global_shape).items():
            d = index[0].start or 0
            leaves, where = [], []
            for s in (s for s, dd in stage_device.items() if dd == d):
                for p, leaf in zip(layout.places[s], flat[s][0]):
                    if p.entry == e:
                        leaves.append(p.cells(leaf))
                        where.append((p.start, p.count))
            pieces.append(_record_on(dev, tuple(cell), dtype, width, leaves, tuple(where), _static(index[2:])))
        entries.append(jax.make_array_from_single_device_arrays(global_shape, target, pieces))
    return StageParams(tuple(entries), layout, tuple(t for _, t in flat))


def _static(index: Sequence[slice]) -> tuple:
    return tuple((sl.start, sl.stop) for sl in index)


def _record_on(device: Any, cell: tuple, dtype: Any, width: int, leaves: list, where: tuple,
               index: tuple) -> jax.Array:
    """``leaves`` put at their ``(start, count)`` cells of a ``[1, width, *cell]`` record of zeros on
    ``device``, cut to ``index`` (the device's piece of the cells)."""
    present = [jax.device_put(x, device) for x in leaves]
    with jax.default_device(device):
        return _record(present, cell, np.dtype(dtype), width, where, index)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _record(present: list, cell: tuple, dtype: Any, width: int, where: tuple, index: tuple) -> jax.Array:
    out = jnp.zeros((width,) + cell, dtype)
    for x, (start, count) in zip(present, where):
        out = out.at[start:start + count].set(x.astype(dtype).reshape((count,) + cell))
    return out[None][(slice(None), slice(None)) + tuple(slice(a, b) for a, b in index)]


def _stage_index(mesh: jax.sharding.Mesh, stage_axis: str) -> dict:
    """``{device: its coordinate on the stage axis}``."""
    axis = mesh.axis_names.index(stage_axis)
    return {mesh.devices[idx]: idx[axis] for idx in np.ndindex(mesh.devices.shape)}


def _sub_mesh(mesh: jax.sharding.Mesh, stage_axis: str, d: int) -> jax.sharding.Mesh:
    """The devices at coordinate ``d`` of the stage axis, as a mesh of the other axes."""
    axis = mesh.axis_names.index(stage_axis)
    names = tuple(n for n in mesh.axis_names if n != stage_axis)
    return jax.sharding.Mesh(np.take(mesh.devices, d, axis=axis), names)


def unpack(packed: StageParams, stage_device: dict[int, int], mesh: jax.sharding.Mesh, stage_axis: str) -> list:
    """Per-stage trees from ``packed``, each leaf on its stage's devices (sharded as its entry says); packed StageParams
    of another mesh (or device order) are refused, as the step refuses them."""
    if not isinstance(packed, StageParams):
        raise InvalidInputError(f"unshard_params takes the StageParams a step packed, got {type(packed).__name__}.")
    if any(getattr(e.sharding, "mesh", mesh) != mesh for e in packed.entries[:1]):
        raise InvalidInputError("these StageParams were packed for another pipeline or mesh: unpack them with "
                                "that step's unshard_params.")
    with outside_mesh_context():
        return _unpack(packed, stage_device, mesh, stage_axis)


def _unpack(packed: StageParams, stage_device: dict[int, int], mesh: jax.sharding.Mesh, stage_axis: str) -> list:
    where = _stage_index(mesh, stage_axis)
    lay = packed.layout
    shard_of: list[dict[int, Any]] = []
    for x in packed.entries:
        by_stage: dict[int, Any] = {}
        for shard in x.addressable_shards:
            by_stage.setdefault(where[shard.device], shard.data)
        shard_of.append(by_stage)
    out = []
    for s, treedef in enumerate(packed.treedefs):
        d = stage_device[s]
        if any(d not in by_stage for by_stage in shard_of):
            raise InvalidInputError(
                f"stage {s}'s parameters live on devices of another process: across hosts, keep the packed "
                "StageParams (step.shard_params) and pass them to the step as they are.")
        leaves = []
        for p in lay.places[s]:
            spec = lay.specs[p.entry] if lay.specs else None
            if spec is None:
                leaves.append(p.leaf(shard_of[p.entry][d][0, p.start:p.start + p.count].reshape(p.shape)))
            else:  # sharded over the other axes: cut on the mesh, then onto the stage's sub-mesh
                whole = _take(packed.entries[p.entry], d, p.start, jax.sharding.NamedSharding(mesh, spec))
                leaves.append(p.leaf(jax.device_put(whole, jax.sharding.NamedSharding(_sub_mesh(mesh, stage_axis, d),
                                                                                        spec))))
        leaves = [C.typed_as(x, jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=True)) if p.weak else x
                  for p, x in zip(lay.places[s], leaves)]
        out.append(jax.tree_util.tree_unflatten(treedef, leaves))
    return out


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _take(x: jax.Array, d: int, j: int, sharding: Any) -> jax.Array:
    return jax.lax.with_sharding_constraint(x[d, j], sharding)


def stage_avals(packed: StageParams) -> list:
    """Each stage's parameter tree as ``jax.ShapeDtypeStruct`` leaves."""
    lay = packed.layout
    return [jax.tree_util.tree_unflatten(treedef, lay.leaf_avals(s)) for s, treedef in enumerate(packed.treedefs)]
