"""The calling contract of an exported function: its array specs, structures and residual wiring.

Array specs are ``{"shape": [4, "b"], "dtype": "float32", "weak_type": false}``:
symbolic dims are strings in ``jax.export.symbolic_shape`` syntax. The
signature follows the :class:`~jaxaot.Partition` contract: the backward's
residuals are the inputs at ``saved_inputs`` followed by the forward outputs
(real or temporary) at ``saved_outputs``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax

from jaxaot._pytrees import dtype_name, leaf_paths
from jaxaot.artifacts.treedef_json import treedef_from_json


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape (ints, or strings for symbolic dims) and dtype of one flat array."""

    shape: tuple[int | str, ...]
    dtype: str
    weak_type: bool = False

    @classmethod
    def of(cls, aval: Any) -> "ArraySpec":
        shape = tuple(str(d) if jax.export.is_symbolic_dim(d) else int(d) for d in aval.shape)
        return cls(shape, dtype_name(aval.dtype), bool(getattr(aval, "weak_type", False)))

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "weak_type": self.weak_type}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ArraySpec":
        return cls(tuple(d["shape"]), str(d["dtype"]), bool(d.get("weak_type", False)))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class RuntimeCheck:
    """A flag an exported program returns instead of calling back into Python.

    ``kind="loop_overflow"``: a ``jaxaot.while_loop`` ran past ``max_steps``;
    the loaded function raises :class:`~jaxaot.errors.LoopOverflowError`.
    """

    kind: str
    max_steps: int


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

    def to_json(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("specs"):
                v = [s.to_json() for s in v]
            elif f.name.endswith("checks"):
                v = [dataclasses.asdict(c) for c in v]
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AOTSignature":
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name.endswith("specs"):
                v = tuple(ArraySpec.from_json(s) for s in v)
            elif f.name.endswith("checks"):
                v = tuple(RuntimeCheck(**c) for c in v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)
