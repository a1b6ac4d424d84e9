"""The calling contract of an exported function: its array specs, structures and residual wiring.

Array specs are ``{"shape": [4, "b"], "dtype": "float32", "weak_type": false}``:
symbolic dims are strings in ``jax.export.symbolic_shape`` syntax. The
signature follows the :class:`~jaxaot.partition.Partition` contract: the backward's
residuals are the inputs at ``saved_inputs`` followed by the forward outputs
(real or temporary) at ``saved_outputs``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Mapping

import jax

from jaxaot._src.pytrees import dtype_name, leaf_paths
from jaxaot._src.artifacts.mesh_spec import MeshSpec, spec_from_json, spec_to_json, validate_spec
from jaxaot._src.artifacts.treedef_json import treedef_from_json
from jaxaot.errors import ArtifactError

#: Bounds on what a manifest may declare: a hostile artifact cannot make ``load`` allocate by them.
MAX_RANK = 64
MAX_DIM = 1 << 48
MAX_LEAVES = 1 << 20
MAX_CONSTRAINT_CHARS = 1000
_DTYPE_NAME = re.compile(r"[A-Za-z0-9_<>:,. ]{1,64}")  # float32, bfloat16, key<fry>, ...


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape (ints, or strings for symbolic dims), dtype and, in a sharded artifact, partition spec of one array.

    ``sharding`` is the ``PartitionSpec`` the program takes or returns the array
    in, on the artifact's mesh (:class:`~jaxaot._src.artifacts.mesh_spec.MeshSpec`):
    a tuple of None, axis names and tuples of axis names; None when unsharded.
    """

    shape: tuple[int | str, ...]
    dtype: str
    weak_type: bool = False
    sharding: tuple | None = None

    @classmethod
    def of(cls, aval: Any, sharding: Any = None) -> "ArraySpec":
        """The spec of ``aval``, placed by ``sharding`` (a ``NamedSharding``; other shardings record nothing)."""
        shape = tuple(str(d) if jax.export.is_symbolic_dim(d) else int(d) for d in aval.shape)
        return cls(shape, dtype_name(aval.dtype), bool(getattr(aval, "weak_type", False)),
                   spec_from_json(spec_to_json(sharding)))

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "dtype": self.dtype, "weak_type": self.weak_type}
        if self.sharding is not None:
            d["sharding"] = [p if p is None or isinstance(p, str) else list(p) for p in self.sharding]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "an array spec") -> "ArraySpec":
        """The spec of :meth:`to_json`; :class:`ArtifactError` naming ``where`` for a malformed one."""
        _expect(d, Mapping, where)
        sharding = d.get("sharding")
        validate_spec(sharding, where)
        return cls(tuple(_expect(d.get("shape"), list, f"{where}.shape")), _expect(d.get("dtype"), str, f"{where}.dtype"),
                   _expect(d.get("weak_type", False), bool, f"{where}.weak_type"), spec_from_json(sharding))

    def validate(self, where: str) -> None:
        """Raise :class:`ArtifactError` unless the shape is a short list of bounded ints or short strings."""
        if len(self.shape) > MAX_RANK:
            raise ArtifactError(f"{where} declares rank {len(self.shape)} (> {MAX_RANK}): refused.")
        for d in self.shape:
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise ArtifactError(f"{where} declares a dimension {d!r} that is neither an int nor a symbol.")
            if isinstance(d, int) and not 0 <= d <= MAX_DIM:
                raise ArtifactError(f"{where} declares a dimension {d} outside 0..{MAX_DIM}: refused.")
            if isinstance(d, str) and len(d) > 256:
                raise ArtifactError(f"{where} declares a symbolic dimension of {len(d)} characters: refused.")
        if not _DTYPE_NAME.fullmatch(self.dtype):
            raise ArtifactError(f"{where} declares an unknown dtype {self.dtype[:64]!r}.")

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class RuntimeCheck:
    """A flag an exported program returns instead of calling back into Python.

    ``kind="loop_overflow"``: a ``jaxaot.loops.while_loop`` ran past ``max_steps``;
    the loaded function raises :class:`~jaxaot.errors.LoopOverflowError`.
    """

    kind: str
    max_steps: int


def _expect(value: Any, kind: type, where: str) -> Any:
    """``value``, or an :class:`ArtifactError` naming ``where`` when it is not a ``kind`` (bools are not ints)."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ArtifactError(f"manifest field {where!r} is {_JSON_TYPES.get(type(value), type(value).__name__)}, "
                            f"not {_JSON_TYPES[kind]}: the manifest is corrupt.")
    return value


_JSON_TYPES = {Mapping: "an object", dict: "an object", list: "a list", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean", type(None): "null"}


def _check_from_json(c: Any, where: str) -> RuntimeCheck:
    _expect(c, Mapping, where)
    if set(c) != {"kind", "max_steps"}:
        raise ArtifactError(f"manifest field {where!r} has the keys {sorted(c)}, not ['kind', 'max_steps'].")
    kind, max_steps = _expect(c["kind"], str, f"{where}.kind"), _expect(c["max_steps"], int, f"{where}.max_steps")
    if kind != "loop_overflow" or not 0 < max_steps <= MAX_DIM:
        raise ArtifactError(f"manifest field {where!r} declares an unknown run-time check {kind[:64]!r} or "
                            f"max_steps={max_steps}.")
    return RuntimeCheck(kind, max_steps)


@dataclasses.dataclass(frozen=True)
class AOTSignature:
    """The calling contract of an exported function.

    Attributes:
      in_structure / out_structure: JSON pytree structures of the positional
        arguments tuple and of the outputs (``in_tree`` / ``out_tree`` decode them).
      in_specs / out_specs: an :class:`ArraySpec` per flat input / output.
      grad_inputs: flat inputs that get a gradient (the differentiable ones).
      cotangent_outputs: flat outputs that take a cotangent.
      saved_inputs: flat inputs the backward captures (residuals, first).
      saved_outputs: forward outputs (``< len(out_specs)``: real, else temporary)
        the backward captures (residuals, after the inputs).
      num_temporaries: extra forward outputs that exist only for the backward.
      residual_specs: an :class:`ArraySpec` per residual, in backward order.
      forward_checks / inference_checks: :class:`RuntimeCheck` flags the program
        returns after its other outputs.
      static_args: repr of the static arguments baked in, if any.
      static_argnums: the positions of those arguments in the call before export.
      weak_grads: per gradient (``grad_inputs`` order), when JAX hands it back weakly typed: None never, else
        the flat outputs whose cotangents must all be weak (``()``: always); None for the whole field: not
        recorded, and the programs' strong gradients stand (``jax.export`` keeps no weak types).
      mesh: the :class:`~jaxaot._src.artifacts.mesh_spec.MeshSpec` of a sharded
        artifact (its programs run on exactly ``mesh.num_devices`` devices), else None.
      dim_constraints: the symbolic dimensions' constraints (``"b >= 4"``), which a call's sizes must meet
        (``jax.export`` keeps them in its programs but not in their Python types).
    """

    in_structure: Mapping[str, Any]
    out_structure: Mapping[str, Any]
    in_specs: tuple[ArraySpec, ...]
    out_specs: tuple[ArraySpec, ...]
    grad_inputs: tuple[int, ...]
    cotangent_outputs: tuple[int, ...]
    saved_inputs: tuple[int, ...]
    saved_outputs: tuple[int, ...]
    num_temporaries: int
    residual_specs: tuple[ArraySpec, ...]
    forward_checks: tuple[RuntimeCheck, ...] = ()
    inference_checks: tuple[RuntimeCheck, ...] = ()
    static_args: str | None = None
    static_argnums: tuple[int, ...] = ()
    weak_grads: tuple[tuple[int, ...] | None, ...] | None = None
    mesh: MeshSpec | None = None
    dim_constraints: tuple[str, ...] = ()

    @functools.cached_property
    def in_tree(self) -> Any:
        return treedef_from_json(self.in_structure)

    @functools.cached_property
    def out_tree(self) -> Any:
        return treedef_from_json(self.out_structure)

    @property
    def num_outputs(self) -> int:
        return len(self.out_specs)

    @property
    def differentiable(self) -> tuple[bool, ...]:
        return tuple(i in self.grad_inputs for i in range(len(self.in_specs)))

    @functools.cached_property
    def in_paths(self) -> tuple[str, ...]:
        return tuple(leaf_paths(self.in_tree, "arg"))

    @functools.cached_property
    def out_paths(self) -> tuple[str, ...]:
        return tuple(leaf_paths(self.out_tree, "output"))

    def validate(self, where: str) -> None:
        """Raise :class:`ArtifactError` unless every spec, index and structure is in bounds.

        Decodes both pytree structures (bounded in depth and size) and checks
        that they have as many leaves as there are specs.
        """
        for name in ("in_specs", "out_specs", "residual_specs"):
            specs = getattr(self, name)
            if len(specs) > MAX_LEAVES:
                raise ArtifactError(f"{where}: {name} has {len(specs)} entries (> {MAX_LEAVES}): refused.")
            for i, spec in enumerate(specs):
                spec.validate(f"{where}: {name}[{i}]")
        n_in, n_out = len(self.in_specs), len(self.out_specs)
        if not isinstance(self.num_temporaries, int) or not 0 <= self.num_temporaries <= MAX_LEAVES:
            raise ArtifactError(f"{where}: num_temporaries={self.num_temporaries!r} is out of range.")
        for name, bound in (("grad_inputs", n_in), ("saved_inputs", n_in), ("cotangent_outputs", n_out),
                            ("saved_outputs", n_out + self.num_temporaries), ("static_argnums", MAX_LEAVES)):
            for i in getattr(self, name):
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < bound:
                    raise ArtifactError(f"{where}: {name} holds {i!r}, not an index below {bound}.")
        if self.weak_grads is not None:
            if len(self.weak_grads) != len(self.grad_inputs):
                raise ArtifactError(f"{where}: weak_grads has {len(self.weak_grads)} entries for "
                                    f"{len(self.grad_inputs)} gradients.")
            for need in self.weak_grads:
                for i in need or ():
                    if isinstance(i, bool) or not isinstance(i, int) or i not in self.cotangent_outputs:
                        raise ArtifactError(f"{where}: weak_grads holds {i!r}, not an output that takes a cotangent.")
        if len(self.saved_inputs) + len(self.saved_outputs) != len(self.residual_specs):
            raise ArtifactError(f"{where}: {len(self.residual_specs)} residual specs for "
                                f"{len(self.saved_inputs) + len(self.saved_outputs)} saved values.")
        for name, tree, n in (("in_structure", self.in_tree, n_in), ("out_structure", self.out_tree, n_out)):
            if tree.num_leaves != n:
                raise ArtifactError(f"{where}: {name} has {tree.num_leaves} leaves but there are {n} specs.")
        if len(self.dim_constraints) > MAX_LEAVES or any(
                not isinstance(c, str) or len(c) > MAX_CONSTRAINT_CHARS for c in self.dim_constraints):
            raise ArtifactError(f"{where}: dim_constraints must be at most {MAX_LEAVES} strings of at most "
                                f"{MAX_CONSTRAINT_CHARS} characters.")
        if self.mesh is not None:
            if not isinstance(self.mesh, MeshSpec):
                raise ArtifactError(f"{where}: mesh is not a mesh description.")
            self.mesh.validate(f"{where}: mesh")

    def to_json(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("specs"):
                v = [s.to_json() for s in v]
            elif f.name.endswith("checks"):
                v = [dataclasses.asdict(c) for c in v]
            elif f.name == "mesh":
                if v is None:
                    continue
                v = v.to_json()
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AOTSignature":
        """The signature of :meth:`to_json`; :class:`ArtifactError` naming the field for a malformed one.

        Every field's JSON type is checked here (:meth:`validate` then bounds
        the values), so a hostile manifest gets a typed error, not an
        ``AttributeError`` from deep inside.
        """
        _expect(d, Mapping, "signature")
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f"signature.{f.name}"
            if f.name not in d:
                if f.default is dataclasses.MISSING:
                    raise ArtifactError(f"manifest field {name!r} is missing: the manifest is corrupt.")
                continue
            v = d[f.name]
            if f.name.endswith("specs"):
                v = tuple(ArraySpec.from_json(s, f"{name}[{i}]") for i, s in enumerate(_expect(v, list, name)))
            elif f.name.endswith("checks"):
                v = tuple(_check_from_json(c, f"{name}[{i}]") for i, c in enumerate(_expect(v, list, name)))
            elif f.name == "mesh":
                v = None if v is None else MeshSpec.from_json(_expect(v, Mapping, name))
            elif f.name.endswith("structure"):
                v = _expect(v, Mapping, name)
            elif f.name == "num_temporaries":
                v = _expect(v, int, name)
            elif f.name == "static_args":
                v = None if v is None else _expect(v, str, name)
            elif f.name == "dim_constraints":
                v = tuple(_expect(c, str, f"{name}[{i}]") for i, c in enumerate(_expect(v, list, name)))
            elif f.name == "weak_grads":
                v = None if v is None else tuple(None if e is None else tuple(_expect(e, list, f"{name}[{i}]"))
                                                 for i, e in enumerate(_expect(v, list, name)))
            else:  # index lists
                v = tuple(_expect(v, list, name))
            kw[f.name] = v
        return cls(**kw)
