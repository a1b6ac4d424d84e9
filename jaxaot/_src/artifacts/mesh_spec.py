"""Where a sharded artifact runs: its mesh, its arrays' partition specs, and the device-count checks.

The manifest repeats what ``jax.export`` records about shardings (the mesh,
:class:`MeshSpec`, and each array's partition spec) so a reader needs to
deserialize nothing. Device counts are checked at load
(:func:`check_enough_devices`) and at each call (:func:`check_call_devices`),
with an :class:`~jaxaot.errors.ArtifactError` naming both counts, where
``jax.export`` alone says only that the call "is not allowed".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot.errors import ArtifactError

#: Bounds on the mesh a manifest may declare.
MAX_MESH_AXES = 16
MAX_DEVICES = 1 << 20


def spec_to_json(sharding: Any) -> list | None:
    """The partition spec of a ``NamedSharding`` as JSON (None: unsharded or not a named sharding).

    Each entry is None (that dim is not split), an axis name, or a list of axis names.

    Example:
        >>> import jax
        >>> mesh = jax.sharding.AbstractMesh((2, 4), ("data", "model"))
        >>> spec_to_json(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "model"), None)))
        [['data', 'model'], None]
    """
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    return [p if p is None or isinstance(p, str) else [str(a) for a in p] if isinstance(p, (tuple, list)) else str(p)
            for p in spec]


def spec_from_json(spec: Any) -> tuple | None:
    """:func:`spec_to_json` read back: a tuple of None, axis names and tuples of axis names."""
    if spec is None:
        return None
    return tuple(p if p is None or isinstance(p, str) else tuple(p) for p in spec)


def validate_spec(spec: Any, where: str) -> None:
    """Raise :class:`ArtifactError` unless ``spec`` is a short list of None, names or lists of names."""
    if spec is None:
        return
    if not isinstance(spec, (list, tuple)) or len(spec) > 64:
        raise ArtifactError(f"{where} declares a partition spec {str(spec)[:80]} that is not a short list.")
    for p in spec:
        names = [p] if p is None or isinstance(p, str) else p
        if not isinstance(names, (list, tuple)) or len(names) > MAX_MESH_AXES or not all(
                n is None or (isinstance(n, str) and len(n) <= 256) for n in names):
            raise ArtifactError(f"{where} declares a partition spec entry {str(p)[:80]} that is not an axis name.")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The shape of the mesh an artifact was exported on: axis names, sizes and types.

    Attributes:
      axis_names / axis_sizes: as ``jax.sharding.Mesh``'s.
      axis_types: ``jax.sharding.AxisType`` names (``"Auto"``, ``"Explicit"``, ``"Manual"``).
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    axis_types: tuple[str, ...]

    @classmethod
    def of(cls, mesh: Any) -> "MeshSpec":
        """The spec of a ``jax.sharding.Mesh`` or ``AbstractMesh``."""
        return cls(tuple(str(n) for n in mesh.axis_names), tuple(int(s) for s in mesh.axis_sizes),
                   tuple(t.name for t in mesh.axis_types))

    @property
    def num_devices(self) -> int:
        """How many devices the mesh has (the product of its axis sizes)."""
        return math.prod(self.axis_sizes)

    def make(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """A ``jax.sharding.Mesh`` of this shape over ``devices`` (default: the first devices of ``jax.devices()``)."""
        types = tuple(getattr(jax.sharding.AxisType, t) for t in self.axis_types)
        return jax.make_mesh(self.axis_sizes, self.axis_names, axis_types=types, devices=devices)

    def to_json(self) -> dict:
        """The manifest's form: lists of names, sizes and type names."""
        return {"axis_names": list(self.axis_names), "axis_sizes": list(self.axis_sizes),
                "axis_types": list(self.axis_types)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MeshSpec":
        """:meth:`to_json` read back (unvalidated: see :meth:`validate`)."""
        return cls(tuple(d["axis_names"]), tuple(d["axis_sizes"]), tuple(d["axis_types"]))

    def validate(self, where: str) -> None:
        """Raise :class:`ArtifactError` unless the mesh is a few named axes of bounded sizes."""
        n = len(self.axis_names)
        if not 0 < n <= MAX_MESH_AXES or len(self.axis_sizes) != n or len(self.axis_types) != n:
            raise ArtifactError(f"{where}: a mesh needs 1 to {MAX_MESH_AXES} axes, each with a name, size and type.")
        for name, size, kind in zip(self.axis_names, self.axis_sizes, self.axis_types):
            if not isinstance(name, str) or not 0 < len(name) <= 256:
                raise ArtifactError(f"{where}: mesh axis name {str(name)[:80]!r} is not a short string.")
            if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_DEVICES:
                raise ArtifactError(f"{where}: mesh axis {name!r} has size {size!r}, not 1..{MAX_DEVICES}.")
            if kind not in jax.sharding.AxisType.__members__:
                raise ArtifactError(f"{where}: mesh axis {name!r} has an unknown type {str(kind)[:40]!r}.")
        if self.num_devices > MAX_DEVICES:
            raise ArtifactError(f"{where}: a mesh of {self.num_devices} devices is refused (> {MAX_DEVICES}).")

    def __str__(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.axis_sizes))


def _mesh_words(mesh: MeshSpec | None) -> str:
    return f" (mesh {mesh})" if mesh is not None else ""


def check_enough_devices(where: str, num_devices: int, mesh: MeshSpec | None) -> None:
    """Raise :class:`ArtifactError` when this process has fewer devices than the artifact was exported for."""
    have = jax.device_count()
    if num_devices > have:
        raise ArtifactError(
            f"{where} was exported for {num_devices} devices{_mesh_words(mesh)}, but this process has {have} "
            f"{jax.default_backend()} device{'s' if have != 1 else ''}: jax.export runs a sharded program only on "
            f"exactly as many devices as it was exported for. Load it where jax.device_count() >= {num_devices} "
            f"(on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={num_devices} before importing jax; "
            f"across hosts, call jax.distributed.initialize first), or re-export it on a mesh of {have} devices.")


def call_device_count(leaves: Sequence[Any]) -> int | None:
    """On how many devices a call with ``leaves`` runs: its committed arrays' devices; where none is committed, the
    devices of the mesh ``jax.set_mesh`` sets (``jax.export``'s call places such inputs there), else 1.

    None when a leaf is a tracer: the enclosing ``jit`` decides, and ``jax.export`` checks it.
    """
    devices: set = set()
    for x in leaves:
        if C.is_tracer(x):
            return None
        if isinstance(x, jax.Array) and x.committed:
            devices |= x.sharding.device_set
    if not devices:
        mesh = C.device_context()
        return 1 if mesh is None else int(mesh.devices.size)
    return len(devices)


def check_call_devices(name: str, what: str, num_devices: int, mesh: MeshSpec | None, leaves: Sequence[Any]) -> None:
    """Raise :class:`ArtifactError` when a loaded program exported for ``num_devices`` gets arrays on another number.

    Programs exported for one device run anywhere (``jax.export``'s rule); others need their inputs
    on exactly ``num_devices`` devices.
    """
    if num_devices <= 1:
        return
    have = call_device_count(leaves)
    if have is None or have == num_devices:
        return
    placed = (f"on {have} devices" if have > 1 else
              "on one device (no input is committed to a mesh: plain and uncommitted arrays run on one device)")
    raise ArtifactError(
        f"the {what} program of {name} was exported for {num_devices} devices{_mesh_words(mesh)}, but its inputs "
        f"are {placed}: jax.export runs it only on exactly {num_devices} devices. Place the inputs on a mesh of "
        f"{num_devices} devices first (mesh = f.mesh(); args = jax.device_put(args, f.in_shardings(mesh))), "
        + (f"or re-export the function on a mesh of {have} devices." if have > 1 else
           "or re-export the function from unsharded inputs to run it on one device."))


def check_call_platform(name: str, what: str, platforms: Sequence[str], leaves: Sequence[Any]) -> None:
    """Raise :class:`ArtifactError` when a loaded program gets arrays on a platform it was not exported for.

    The platform is read off the first concrete array (under ``jax.jit`` the
    caller's lowering decides, and ``jax.export`` checks it).
    """
    for x in leaves:
        if isinstance(x, jax.Array) and not C.is_tracer(x):
            here = C.platform_of(next(iter(x.devices())))
            if here not in platforms:
                raise ArtifactError(
                    f"the {what} program of {name} was exported for {', '.join(platforms)}, but its inputs are on "
                    f"{here}: it cannot run there. Put them on a {platforms[0]} device (jax.device_put(x, "
                    f"jax.devices({platforms[0]!r})[0])), or re-export the function with platforms=(..., {here!r}).")
            return
