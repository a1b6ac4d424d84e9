"""What each input and output of a compiled module call is: :class:`CallMetadata`.

:class:`CallMetadata` is PyTorch's ``ViewAndMutationMeta`` in JAX terms: per
flat program input, its name, kind (parameter, state or user input), whether it
is differentiated and whether the call mutates it; per flat output, its name,
kind (user output or mutated state), whether it is an input or an earlier
output passed through, which input it overwrites and whether the backward takes
a cotangent for it. :class:`ModuleLowered` pairs it with the runtime's
:class:`jaxaot.AOTLowered`; ``aot_model.lower(...)`` returns one.

Example:
    >>> print(CallMetadata((InputInfo("w", "parameter", True, False),),
    ...                    (OutputInfo("output", "user_output", None, None, None, True),)))
    input   kind         diff       mutated
    w       parameter    yes        no
    output  kind         cotangent  is_input/dup/mutates
    output  user_output  yes        None/None/None
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import describe_path
from jaxaot._src.runtime import AOTLowered


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One flat input of the compiled program.

    Attributes:
      name: ``lin.kernel`` (parameter), ``bn.mean`` / ``batch_stats.bn.mean``
        (state), ``arg[0]`` / ``kwarg['mask']`` / ``rngs['dropout']`` (user input).
      kind: ``"parameter"``, ``"state"`` or ``"user_input"``.
      differentiable: whether the program computes a gradient for it.
      mutated: whether the call writes a new value to it.
    """

    name: str
    kind: str
    differentiable: bool
    mutated: bool


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """One flat output of the compiled program.

    Attributes:
      name: ``output[0]`` style for user outputs, the state's name for mutated state.
      kind: ``"user_output"`` or ``"mutated_state"``.
      is_input: the flat input this output literally is (the runtime passes it
        through without running anything), else None.
      duplicate_of: an earlier output this one is literally the same value as, else None.
      mutates: for mutated state, the flat input it overwrites (None for state
        the call created).
      takes_cotangent: whether the backward takes a cotangent for it.
    """

    name: str
    kind: str
    is_input: int | None
    duplicate_of: int | None
    mutates: int | None
    takes_cotangent: bool


@dataclasses.dataclass(frozen=True)
class CallMetadata:
    """Per-input and per-output facts of one compiled call (cf. ``ViewAndMutationMeta``)."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.inputs) if x.mutated)

    @property
    def num_mutated_state_outputs(self) -> int:
        return sum(o.kind == "mutated_state" for o in self.outputs)

    def __str__(self) -> str:
        rows = [("input", "kind", "diff", "mutated")]
        rows += [(x.name, x.kind, _yn(x.differentiable), _yn(x.mutated)) for x in self.inputs]
        rows += [("output", "kind", "cotangent", "is_input/dup/mutates")]
        rows += [(o.name, o.kind, _yn(o.takes_cotangent), f"{o.is_input}/{o.duplicate_of}/{o.mutates}")
                 for o in self.outputs]
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _yn(b: bool) -> str:
    return "yes" if b else "no"


@dataclasses.dataclass(frozen=True)
class ModuleLowered:
    """What ``aot_model.lower(...)`` returns: the runtime's view plus :class:`CallMetadata`.

    Attributes:
      lowered: the :class:`jaxaot.AOTLowered` of the pure function; its
        attributes (``forward``, ``backward``, ``joint``, ``saved``, ...) are also
        reachable directly on this object.
      meta: the :class:`CallMetadata` of its flat inputs and outputs.
    """

    lowered: AOTLowered
    meta: CallMetadata

    def __getattr__(self, name: str) -> Any:
        # Everything else (joint, forward, backward, saved, ...) is the runtime's view.
        if name == "lowered":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.lowered, name)


# --------------------------------------------------------------------------- building it
def user_input_names(trees: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """``(name, "user_input")`` per flat leaf of each ``(label, tree)``; label ``"input"`` is ``(args, kwargs)``."""
    with_paths = jax.tree_util.tree_flatten_with_path
    return [(describe_path(label, p), "user_input") for label, tree in trees for p, _ in with_paths(tree)[0]]


def _duplicates(outvars: Sequence[Any]) -> list[int | None]:
    first: dict = {}
    dup = []
    for j, v in enumerate(outvars):
        if C.is_literal(v):
            dup.append(None)
            continue
        dup.append(first.get(v))
        first.setdefault(v, j)
    return dup


def build_metadata(lowered: AOTLowered, inputs: Sequence[tuple[str, str]]) -> CallMetadata:
    """:class:`CallMetadata` from a lowered pure function and the ``(name, kind)`` of each flat input.

    The program's output tree must be ``(user outputs, StateDelta or None)``
    (see :class:`jaxaot._src.nn.state.StateDelta`).
    """
    joint = lowered.joint
    user_out, delta = jax.tree.unflatten(joint.out_tree, list(range(joint.out_tree.num_leaves)))
    out_names = [describe_path("output", p) for p, _ in jax.tree_util.tree_flatten_with_path(user_out)[0]]
    mutated = delta.mutated_inputs if delta is not None else frozenset()
    infos = tuple(
        InputInfo(name, kind, bool(d), i in mutated)
        for i, ((name, kind), d) in enumerate(zip(inputs, joint.differentiable))
    )
    n_user = len(out_names)
    targets = delta.output_targets() if delta is not None else []
    state_names = delta.output_names() if delta is not None else []
    dups = _duplicates(C.jaxpr_of(joint.jaxpr).outvars[: joint.num_outputs])
    outs = []
    for j in range(joint.num_outputs):
        user = j < n_user
        target = None if user else targets[j - n_user]
        name = out_names[j] if user else state_names[j - n_user]
        outs.append(OutputInfo(name, "user_output" if user else "mutated_state", joint.output_is_input[j],
                               dups[j], target, bool(joint.needs_cotangent[j])))
    return CallMetadata(infos, tuple(outs))
