"""Stage 2's product: a :class:`Partition`, and the one mechanism that builds it.

A partitioner decides which values the forward saves; :func:`split_joint` does the
rest: the forward computes the outputs and saved values, the backward computes the
gradients from the cotangents and saved values, recomputing what was not saved. The
backward's signature follows TorchScript's ``differentiate()``: ``(cotangents...,
saved inputs..., saved forward outputs...) -> grads``, no value emitted twice.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Iterable, Protocol, runtime_checkable

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, in_host_memory, nbytes, shape_dtype_struct, var_device_nbytes
from jaxaot.errors import InvalidInputError, PartitionError
from jaxaot._src.tracing import JointGraph


class EqnKind(enum.Enum):
    FORWARD = "forward"  # depends on a primal input, on no cotangent
    BACKWARD = "backward"  # depends on a cotangent
    CONSTANT = "constant"  # depends on neither: free to compute on either side


def classify_eqns(joint: JointGraph) -> list[EqnKind]:
    """The :class:`EqnKind` of each eqn of the joint jaxpr."""
    jaxpr = C.jaxpr_of(joint.jaxpr)
    primal_dep = set(jaxpr.invars[: joint.num_primals])
    kinds = []
    for eqn, bwd in zip(jaxpr.eqns, joint.is_backward):
        if bwd:
            kinds.append(EqnKind.BACKWARD)
        elif eqn.effects or any(not C.is_literal(v) and v in primal_dep for v in eqn.invars):
            # Effectful eqns belong to the forward: they must run once, in order.
            primal_dep.update(eqn.outvars)
            kinds.append(EqnKind.FORWARD)
        else:
            kinds.append(EqnKind.CONSTANT)
    return kinds


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value the forward hands to the backward.

    Attributes:
      aval: its ``jax.ShapeDtypeStruct``.
      source: ``"input"`` (a primal input, captured, never re-emitted),
        ``"output"`` (a real output of the forward) or ``"temporary"``
        (an extra forward output that exists only for the backward).
      index: the primal input index, or the forward output index.
      producer: the primitive that computed it (``"input"`` for inputs).
      source_line: the user's ``file:line (function)`` of that eqn.
      offloaded: whether it waits in host memory between the programs rather than on the device
        (``docs/concepts/memory_planner.md``, "Offloading to host memory").
      in_joint_host: offloaded by the joint graph itself (its value is already in
        host memory there: a JAX offload policy's residual, or a scan body's
        offloaded values stacked by JAX), so the programs add no copies for it.
    """

    aval: Any
    source: str
    index: int
    producer: str
    source_line: str
    offloaded: bool = False
    in_joint_host: bool = False

    @property
    def nbytes(self) -> int:
        return nbytes(self.aval)

    def __str__(self) -> str:
        return (
            f"{self.source}[{self.index}] {self.aval.dtype}{list(self.aval.shape)} "
            f"{self.nbytes} B <- {self.producer} @ {self.source_line}" + (" (offloaded)" if self.offloaded else "")
        )


@dataclasses.dataclass(frozen=True)
class Partition:
    """A joint graph split into a forward and a backward program.

    Attributes:
      forward: closed jaxpr ``(primals...) -> (outputs..., temporaries...)``.
      backward: closed jaxpr ``(cotangents..., saved inputs..., saved outputs...)
        -> (grads...)``, one grad per differentiable input.
      num_outputs: how many forward outputs are real outputs.
      cotangent_outputs: indices of the real outputs that take a cotangent.
      saved_inputs: primal input indices the backward captures.
      saved_outputs: forward output indices (real or temporary) it captures.
      grad_inputs: primal input indices that get a gradient.
      residuals: a :class:`Residual` per saved value, inputs first.
      recomputed: the forward eqns the backward recomputes (printed form).
      primal_plan / split_from: see below; None for partitions of the joint as traced.
      offload_note: why nothing was offloaded when offloading was asked for
        (``docs/concepts/memory_planner.md``, "Offloading to host memory"), else empty.
      cost_note: what priced recomputation when the plan traded bytes for it
        (an :class:`~jaxaot.partition.OpCosts`: measured or FLOP-estimated), else empty.
      step_peak: for a plan chosen under a byte ``memory_budget``, the compiled peaks of its step
        and the budget (:class:`~jaxaot.partition.StepPeak`), else None.
    """

    forward: Any
    backward: Any
    num_outputs: int
    cotangent_outputs: tuple[int, ...]
    saved_inputs: tuple[int, ...]
    saved_outputs: tuple[int, ...]
    grad_inputs: tuple[int, ...]
    residuals: tuple[Residual, ...]
    recomputed: Sequence[str] = ()
    #: When a partitioner rewrote the primal before splitting (min-cut's scan
    #: rematerialization), the JSON-able plan that replays the rewrite and the
    #: joint graph the split was taken from; the compile cache uses both.
    primal_plan: Any = None
    split_from: Any = dataclasses.field(default=None, compare=False, repr=False)
    offload_note: str = ""
    cost_note: str = ""
    step_peak: Any = dataclasses.field(default=None, compare=False)

    @property
    def saved_bytes(self) -> int:
        """Bytes of every saved value, inputs included."""
        return sum(r.nbytes for r in self.residuals)

    @property
    def device_saved_bytes(self) -> int:
        """Bytes of the saved values that stay in device memory (``saved_bytes`` less the offloaded ones)."""
        return sum(r.nbytes for r in self.residuals if not r.offloaded)

    @property
    def held_bytes(self) -> int:
        """Bytes on the device where the forward hands over to the backward, the device residuals and the inputs
        not saved (a fused step of this plan peaks at least this high)."""
        saved = set(self.saved_inputs)
        unsaved = [v for i, v in enumerate(C.jaxpr_of(self.forward).invars) if i not in saved]
        return self.device_saved_bytes + sum(var_device_nbytes(v) for v in unsaved)

    @property
    def saved_activation_bytes(self) -> int:
        """Bytes of the saved values that are not primal inputs."""
        return sum(r.nbytes for r in self.residuals if r.source != "input")

    @property
    def gradient_note(self) -> str:
        """Why the backward computes nothing, where it does not (no input takes a gradient, or no output a
        cotangent, and every gradient is then zero); else ``""``."""
        if not self.grad_inputs:
            return "no input takes a gradient: integer and boolean inputs have none"
        return "" if self.cotangent_outputs else "no output takes a cotangent: every gradient is zero"

    @property
    def num_temporaries(self) -> int:
        return len(C.jaxpr_of(self.forward).outvars) - self.num_outputs


@runtime_checkable
class Partitioner(Protocol):
    """The extension point of stage 2: choose what the forward saves.

    A partitioner takes the :class:`~jaxaot.partition.JointGraph` and returns a
    :class:`Partition`, usually ``split_joint(joint, saved_vars)``: it only
    chooses the saved set, and :func:`~jaxaot.partition.split_joint` builds the programs. Options
    go in with ``functools.partial``. :func:`~jaxaot.partition.default_partition` and
    :func:`~jaxaot.partition.min_cut_rematerialization_partition` are partitioners; pass
    one to ``aot_function(..., partition_fn=...)``.
    """

    def __call__(self, joint: JointGraph, /) -> Partition: ...


# --------------------------------------------------------------------------- mechanism
def _producers(jaxpr: Any) -> dict:
    return {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}


def _needed_eqns(eqns: Sequence[Any], wanted: Iterable[Any], available: set, keep) -> tuple[list, set]:
    """Eqns (in order) needed to compute ``wanted`` from ``available``, plus ``keep``-ers.

    Returns the eqns and the set of vars they need that nothing produced.
    """
    needed = {v for v in wanted if not C.is_literal(v) and v not in available}
    chosen = []
    for eqn in reversed(eqns):
        if keep(eqn) or any(v in needed for v in eqn.outvars):
            chosen.append(eqn)
            needed.difference_update(eqn.outvars)
            needed.update(v for v in eqn.invars if not C.is_literal(v) and v not in available)
    chosen.reverse()
    return chosen, needed


def _describe(eqn: Any) -> str:
    outs = ", ".join(format_aval(v.aval, short=False) for v in eqn.outvars)
    ins = ", ".join(format_aval(v.aval, short=False) for v in eqn.invars)
    return f"{outs} = {eqn.primitive}({ins})  @ {C.eqn_source(eqn)}"


class EqnDescriptions(Sequence):
    """A read-only sequence of eqn descriptions, formatted only when read.

    Formatting (source lines above all) dominates partitioning time on large
    graphs, and most callers never look.
    """

    def __init__(self, eqns: Sequence[Any] = ()):
        self._eqns = tuple(eqns)

    def __len__(self) -> int:
        return len(self._eqns)

    @property
    def eqns(self) -> tuple:
        """The eqns themselves (what recomputing costs is asked of them)."""
        return self._eqns

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [_describe(e) for e in self._eqns[i]]
        return _describe(self._eqns[i])

    def __eq__(self, other: Any) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(id(e) for e in self._eqns))

    def __repr__(self) -> str:
        return f"EqnDescriptions({list(self)!r})"


def check_joint(joint: Any, who: str) -> None:
    """Raise :class:`~jaxaot.errors.InvalidInputError` unless ``joint`` is a :class:`JointGraph` (``who``: the
    partitioner the message names)."""
    if not isinstance(joint, JointGraph):
        raise InvalidInputError(
            f"{who} partitions a JointGraph (jaxaot.partition.trace_joint(fn, *args), or what aot_function passes "
            f"its partition_fn), got {type(joint).__name__}: {joint!r:.80}.")


def split_joint(joint: JointGraph, saved: Iterable[Any]) -> Partition:
    """Build the :class:`Partition` in which the forward saves the vars ``saved``.

    ``saved`` holds vars of the joint jaxpr that do not depend on cotangents.
    The backward recomputes any other forward value it needs; if it would need a
    primal input or an effectful eqn that is not saved, a :class:`PartitionError`
    says so.

    Raises:
      InvalidInputError: ``joint`` is not a :class:`JointGraph`, or ``saved`` is not an iterable of its
        jaxpr's vars.
    """
    check_joint(joint, "split_joint")
    closed = joint.jaxpr
    jaxpr = C.jaxpr_of(closed)
    if isinstance(saved, (str, bytes)) or not isinstance(saved, Iterable):
        raise InvalidInputError(f"split_joint: saved must be an iterable of the joint jaxpr's vars, got "
                                f"{type(saved).__name__}: {saved!r:.80}.")
    saved = list(saved)
    defined = {*jaxpr.invars, *jaxpr.constvars, *(v for e in jaxpr.eqns for v in e.outvars)}
    stray = [v for v in saved if not C.is_literal(v) and v not in defined]
    if stray:
        raise InvalidInputError(f"split_joint: saved holds {len(stray)} value(s) that are not vars of the joint "
                                f"jaxpr (joint.jaxpr.jaxpr's invars and eqns' outvars), such as {stray[0]!r:.80}.")
    kinds = classify_eqns(joint)
    kind_of = {id(e): k for e, k in zip(jaxpr.eqns, kinds)}
    n_in, n_out = joint.num_primals, joint.num_outputs
    primals = list(jaxpr.invars[:n_in])
    cotangents = list(jaxpr.invars[n_in:])
    outputs = list(jaxpr.outvars[:n_out])
    grads = list(jaxpr.outvars[n_out:])
    consts = set(jaxpr.constvars)
    saved = list(dict.fromkeys(v for v in saved if not C.is_literal(v)))

    # Backward: everything the grads need, from cotangents, saved values and consts.
    available = set(saved) | set(cotangents) | consts
    bwd_eqns, missing = _needed_eqns(
        jaxpr.eqns, grads, available, keep=lambda e: bool(e.effects) and kind_of[id(e)] is EqnKind.BACKWARD
    )
    if missing:
        names = ", ".join(sorted(str(v) for v in missing))
        raise PartitionError(f"the backward needs {names}, which the partition neither saves nor can recompute.")
    recomputed = [e for e in bwd_eqns if kind_of[id(e)] is not EqnKind.BACKWARD]
    for e in recomputed:
        if e.effects:
            raise PartitionError(f"the partition would recompute an effectful eqn: {_describe(e)}")

    # Which saved values come from where: inputs, real outputs, or new temporaries.
    input_pos = {v: i for i, v in enumerate(primals)}
    output_pos: dict = {}
    for i, v in enumerate(outputs):
        if not C.is_literal(v):
            output_pos.setdefault(v, i)
    used_by_bwd = {v for e in bwd_eqns for v in e.invars if not C.is_literal(v)} | {
        v for v in grads if not C.is_literal(v)
    }
    saved = [v for v in saved if v in used_by_bwd]
    saved_in = sorted((v for v in saved if v in input_pos), key=input_pos.__getitem__)
    saved_out = [v for v in saved if v not in input_pos and v not in consts]
    temporaries = [v for v in saved_out if v not in output_pos]
    fwd_outvars = outputs + temporaries
    for j, v in enumerate(temporaries):
        output_pos[v] = n_out + j

    fwd_eqns, missing = _needed_eqns(
        jaxpr.eqns,
        fwd_outvars,
        set(primals) | consts,
        keep=lambda e: bool(e.effects) and kind_of[id(e)] is not EqnKind.BACKWARD,
    )
    if missing:  # pragma: no cover - forward values never depend on cotangents
        raise PartitionError(f"saved values depend on cotangents: {sorted(map(str, missing))}")

    fwd_consts = _used_consts(jaxpr, fwd_eqns, fwd_outvars)
    bwd_consts = _used_consts(jaxpr, bwd_eqns, grads)
    const_vals = dict(zip(jaxpr.constvars, C.consts_of(closed)))
    forward = C.make_closed_jaxpr(fwd_consts, primals, fwd_outvars, fwd_eqns, [const_vals[v] for v in fwd_consts])
    backward = C.make_closed_jaxpr(
        bwd_consts, cotangents + saved_in + saved_out, grads, bwd_eqns, [const_vals[v] for v in bwd_consts]
    )

    producers = _producers(jaxpr)
    residuals = tuple(
        _residual(v, "input", input_pos[v], None) for v in saved_in
    ) + tuple(
        _residual(v, "output" if output_pos[v] < n_out else "temporary", output_pos[v], producers.get(v))
        for v in saved_out
    )
    return Partition(
        forward=forward,
        backward=backward,
        num_outputs=n_out,
        cotangent_outputs=joint.cotangent_outputs,
        saved_inputs=tuple(input_pos[v] for v in saved_in),
        saved_outputs=tuple(output_pos[v] for v in saved_out),
        grad_inputs=joint.grad_inputs,
        residuals=residuals,
        recomputed=EqnDescriptions(recomputed),
    )


def _used_consts(jaxpr: Any, eqns: Sequence[Any], outvars: Sequence[Any]) -> list:
    used = {v for e in eqns for v in e.invars if not C.is_literal(v)} | {
        v for v in outvars if not C.is_literal(v)
    }
    return [v for v in jaxpr.constvars if v in used]


def _residual(v: Any, source: str, index: int, eqn: Any) -> Residual:
    aval, host = shape_dtype_struct(v.aval), in_host_memory(v.aval)  # host: a JAX offload policy's residual
    if eqn is None:
        return Residual(aval, source, index, "input", "", offloaded=host, in_joint_host=host)
    return Residual(aval, source, index, str(eqn.primitive), C.eqn_source(eqn), offloaded=host, in_joint_host=host)


def forward_values_used_by_backward(joint: JointGraph) -> list:
    """Primal-dependent values that backward eqns (or the grads) read directly.

    This is what JAX's own linearization saves; :func:`default_partition` saves
    exactly this set.
    """
    jaxpr = C.jaxpr_of(joint.jaxpr)
    kinds = classify_eqns(joint)
    forward_vals = set(jaxpr.invars[: joint.num_primals])
    for eqn, k in zip(jaxpr.eqns, kinds):
        if k is EqnKind.FORWARD:
            forward_vals.update(eqn.outvars)
    used: dict = {}
    for eqn, k in zip(jaxpr.eqns, kinds):
        if k is not EqnKind.FORWARD:
            for v in eqn.invars:
                if not C.is_literal(v) and v in forward_vals:
                    used[v] = None
    for v in jaxpr.outvars[joint.num_outputs :]:
        if not C.is_literal(v) and v in forward_vals:
            used[v] = None
    return list(used)
