"""The planner's plan as a ``jax.checkpoint`` policy: :func:`remat_policy`.

``remat_policy(fn, *example_args)`` runs the min-cut on ``fn``'s joint graph and
returns a :class:`RematPolicy` for ``jax.checkpoint(fn, policy=p)``, so jitted code
gets the planner's choice. The policy answers ``True`` for the keys (primitive,
input avals, plain params) of eqns whose outputs the plan saves. Where keys are
shared by saved and recomputed eqns, or the function has loops and calls, it
approximates, never recomputing more than the plan: ``exact`` says whether JAX's
replayed residuals are the plan's, and ``approximations`` says why not.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition import remat_policy
    >>> f = lambda w, x: jnp.sum(jnp.sin(jnp.tanh(x @ w)))
    >>> w, x = jnp.ones((4, 4)), jnp.ones((8, 4))
    >>> p = remat_policy(f, w, x)
    >>> p.exact, p.describe()  # the matmul's output (written anyway); the backward recomputes tanh
    (True, ['dot_general(f32[8,4], f32[4,4])'])
    >>> dw = jax.jit(jax.grad(jax.checkpoint(f, policy=p)))(w, x)
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections import Counter
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np
import jax.numpy as jnp
from jax import ad_checkpoint

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, nbytes
from jaxaot.errors import InvalidInputError
from jaxaot._src.partition.budget import MemoryBudget, parse_memory_budget
from jaxaot._src.partition.core import EqnKind, Partition, classify_eqns
from jaxaot._src.partition.costs import HOST_MEMORY_KIND
from jaxaot._src.partition.mincut.rematerialize import min_cut_rematerialization_partition
from jaxaot._src.partition.offload import saved_vars
from jaxaot._src.tracing import JointGraph, in_backward_scope, trace_joint

#: A key: ``(primitive name, ((shape, dtype) per input), ((param, value) per param))``.
Key = tuple


# --------------------------------------------------------------------------- keys
class _Opaque(Exception):
    """A param value that is not plain data (a jaxpr, a callable, a sharding)."""


_OPAQUE = "<opaque>"


def _plain(x: Any) -> Any:
    """``x`` as hashable plain data that two traces agree on, or raise :class:`_Opaque`."""
    if isinstance(x, float) and x != x:
        return "nan"  # NaN is unequal to itself: keys of two traces would never match
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return x
    if isinstance(x, enum.Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
        return np.dtype(x).name
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (tuple, list)):
        return tuple(_plain(v) for v in x)
    raise _Opaque


def _param(value: Any) -> Any:
    try:
        return _plain(value)
    except _Opaque:
        return _OPAQUE


def _aval_key(aval: Any) -> tuple:
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return (type(aval).__name__,)
    return tuple(d if isinstance(d, int) else str(d) for d in shape), str(dtype)


def eqn_key(prim_name: str, avals: Sequence[Any], params: dict) -> Key:
    """The key of an eqn as :class:`RematPolicy` sees it (see the module doc)."""
    return (
        prim_name,
        tuple(_aval_key(a) for a in avals),
        tuple(sorted((k, _param(v)) for k, v in params.items())),
    )


def _key_of(eqn: Any) -> Key:
    return eqn_key(eqn.primitive.name, [v.aval for v in eqn.invars], eqn.params)


def format_key(key: Key) -> str:
    """``dot_general(f32[8,16], f32[16,32])``: a key, its params left out."""
    name, avals, _ = key
    args = ", ".join(format_aval(SimpleNamespace(shape=a[0], dtype=a[1])) if len(a) == 2 else a[0] for a in avals)
    return f"{name}({args})"


# --------------------------------------------------------------------------- the policy
@dataclasses.dataclass(frozen=True, repr=False)
class RematPolicy:
    """A ``jax.checkpoint`` policy that reproduces a partition's save/recompute choice.

    Call it as JAX does, ``policy(prim, *avals, **params) -> bool``. It answers by primitive, input shapes and
    params: at shapes it was not planned on it saves nothing (``nothing_saveable``'s choice).

    Attributes:
      saved_keys: the keys (:func:`eqn_key`) of the eqns whose outputs JAX saves.
      exact: whether JAX, under this policy, saves exactly the plan's values.
      approximations: one sentence per way in which it does not (empty when exact).
      memory_budget: the min-cut's budget, a fraction or bytes (None for a custom ``partition_fn``).
      planned_residuals / planned_bytes: how many values, and bytes, the plan
        saves that are not inputs of the function.
      policy_residuals / policy_bytes: the same for what JAX will save under this
        policy, predicted on the joint graph (None where it cannot be predicted).
      offloaded_keys: those of ``saved_keys`` whose outputs the plan offloads to
        host memory (the policy answers ``jax.ad_checkpoint.Offloadable`` for
        them; the rest of ``saved_keys`` get True).
    """

    saved_keys: frozenset
    exact: bool
    approximations: tuple[str, ...] = ()
    memory_budget: float | int | None = None
    planned_residuals: int = 0
    planned_bytes: int = 0
    policy_residuals: int | None = None
    policy_bytes: int | None = None
    offloaded_keys: frozenset = frozenset()

    def __call__(self, prim: Any, /, *avals: Any, **params: Any) -> Any:
        key = eqn_key(prim.name, avals, params)
        if key in self.offloaded_keys:
            return ad_checkpoint.Offloadable(src="device", dst=HOST_MEMORY_KIND)
        return key in self.saved_keys

    def describe(self) -> list[str]:
        """The saved keys, printed, sorted."""
        return sorted(format_key(k) for k in self.saved_keys)

    def __repr__(self) -> str:
        keys = self.describe()
        shown = ", ".join(keys[:4]) + (f", ... ({len(keys) - 4} more)" if len(keys) > 4 else "")
        budget = "" if self.memory_budget is None else f"memory_budget={self.memory_budget}, "
        predicted = "?" if self.policy_bytes is None else f"{self.policy_residuals} values, {self.policy_bytes} B"
        return (
            f"RematPolicy({budget}exact={self.exact}, saves [{shown}]; plan: {self.planned_residuals} values, "
            f"{self.planned_bytes} B; under the policy: {predicted}; {len(self.approximations)} approximations)"
        )


# --------------------------------------------------------------------------- the plan, read back
@dataclasses.dataclass(frozen=True)
class _Plan:
    joint: JointGraph  # the joint graph the partition was split from
    saved: tuple  # joint vars the forward saves that are not primal inputs
    recomputed: frozenset  # ids of the forward eqns the backward recomputes
    offloaded: frozenset = frozenset()  # those of saved the partition moves to host memory between programs


def _read_plan(joint: JointGraph, part: Partition) -> _Plan:
    src = part.split_from if part.split_from is not None else joint
    jaxpr = C.jaxpr_of(src.jaxpr)
    inputs = set(jaxpr.invars[: src.num_primals])
    known = inputs | set(jaxpr.constvars) | {v for e in jaxpr.eqns for v in e.outvars}
    bwd = C.jaxpr_of(part.backward)
    every = saved_vars(part)  # sees through offload's copies
    saved = [v for v in every if v not in inputs]
    offloaded = frozenset(v for v, r in zip(every, part.residuals) if r.offloaded and not r.in_joint_host)
    if not all(v in known for v in saved):
        raise InvalidInputError(
            "partition_fn returned a partition that was not split from the joint graph it was given "
            "(build it with jaxaot.partition.split_joint(joint, saved_values)).")
    kinds = classify_eqns(src)
    forward = {id(e) for e, k in zip(jaxpr.eqns, kinds) if k is not EqnKind.BACKWARD}
    recomputed = frozenset(id(e) for e in bwd.eqns if id(e) in forward)  # the copies back are new eqns
    return _Plan(src, tuple(saved), recomputed, offloaded)


# --------------------------------------------------------------------------- building the policy
def _visible(eqn: Any) -> bool:
    """Whether jax.checkpoint asks the policy about this (non-backward) eqn."""
    return not in_backward_scope(eqn) and eqn.primitive not in C.partial_eval_jaxpr_custom_rules


def _structural(eqn: Any) -> bool:
    """An eqn with bodies that JAX partially evaluates by the primitive's own rule."""
    return eqn.primitive in C.partial_eval_jaxpr_custom_rules and bool(C.eqn_subjaxprs(eqn))


def _bytes(vs: Sequence[Any]) -> int:
    return sum(nbytes(v.aval) for v in vs)


def _policy_from_plan(plan: _Plan, primal_plan: Any, memory_budget: float | int | None) -> RematPolicy:
    jaxpr = C.jaxpr_of(plan.joint.jaxpr)
    kinds = classify_eqns(plan.joint)
    producer = {v: e for e, k in zip(jaxpr.eqns, kinds) if k is not EqnKind.BACKWARD for v in e.outvars}
    notes: list[str] = []

    # The keys the policy saves: those of the eqns producing the plan's saved values.
    save_eqns = list({id(e): e for e in (producer[v] for v in plan.saved)}.values())
    complex_ = [e for e in save_eqns if any(jnp.issubdtype(v.aval.dtype, jnp.complexfloating) for v in e.outvars)]
    if complex_:  # jax.checkpoint passes each saved value through reduce_precision, which refuses complex dtypes
        notes.append(f"the plan saves complex outputs of {_count(complex_)}, which jax.checkpoint cannot save: "
                     "the policy recomputes them")
        save_eqns = [e for e in save_eqns if all(e is not c for c in complex_)]
    unseen = [e for e in save_eqns if not _visible(e) and not _structural(e)]
    if unseen:
        notes.append(
            f"the plan saves outputs of {_count(unseen)} that jax.checkpoint computes in the backward, "
            "where the policy is not asked: JAX saves (or recomputes) their operands instead")
    saved_keys = frozenset(_key_of(e) for e in save_eqns if _visible(e))
    host_keys = {_key_of(producer[v]) for v in plan.offloaded if _visible(producer[v])}
    device_keys = {_key_of(producer[v]) for v in plan.saved if v not in plan.offloaded and _visible(producer[v])}
    both = host_keys & device_keys
    if both:
        notes.append(f"{len(both)} key{'s' if len(both) > 1 else ''} of offloaded values also produce values the "
                     "plan keeps on the device: the policy keeps those on the device")
    offloaded_keys = frozenset(host_keys - device_keys)

    # Mixed decisions: eqns the plan recomputes that share a saved key.
    saved_count = Counter(_key_of(e) for e in save_eqns if _visible(e))
    mixed = Counter(
        _key_of(e) for e in jaxpr.eqns
        if id(e) in plan.recomputed and _visible(e) and _key_of(e) in saved_keys)
    for key, n in sorted(mixed.items(), key=lambda kv: format_key(kv[0])):
        s = saved_count[key]
        notes.append(
            f"{s} {key[0]} eqn{'s' if s > 1 else ''} with key {format_key(key)} "
            f"{'are' if s > 1 else 'is'} saved and {n} recomputed; the policy saves all {s + n}, "
            "so JAX may save more than the plan")

    # Loops, conds, nested checkpoints: in the function as traced (a nested checkpoint is
    # expanded in the joint graph by its own policy) or in the joint graph's forward.
    structural = [e for e in C.jaxpr_of(plan.joint.primal).eqns if _structural(e)] or [
        e for e, k in zip(jaxpr.eqns, kinds) if k is not EqnKind.BACKWARD and _structural(e)]
    if structural:
        notes.append(
            f"the function has {_count(structural)}: jax.checkpoint asks the policy about the eqns of "
            "their bodies, on which the plan decided nothing (they get the same keyed answers)")
    if primal_plan is not None:
        notes.append("the min-cut rewrote the function's scans (per-iteration residuals), which a "
                     "policy cannot express: the policy follows the rewritten program's top level")

    predicted = None if structural or primal_plan is not None else _replay(plan.joint, kinds, saved_keys)
    exact = not notes and predicted is not None and set(predicted) == set(plan.saved)
    if not notes and not exact:  # pragma: no cover - the replay disagrees with the plan unexpectedly
        notes.append("JAX's residuals under the policy differ from the plan's")
    return RematPolicy(
        saved_keys=saved_keys,
        exact=exact,
        approximations=tuple(notes),
        memory_budget=memory_budget,
        planned_residuals=len(plan.saved),
        planned_bytes=_bytes(plan.saved),
        policy_residuals=None if predicted is None else len(predicted),
        policy_bytes=None if predicted is None else _bytes(predicted),
        offloaded_keys=offloaded_keys,
    )


_PRIMITIVE_NAMES = {"remat2": "jax.checkpoint"}


def _count(eqns: Sequence[Any]) -> str:
    """``2 rev eqns and 1 scan eqn``."""
    c = Counter(_PRIMITIVE_NAMES.get(e.primitive.name, e.primitive.name) for e in eqns)
    parts = [f"{n} {name} eqn{'s' if n > 1 else ''}" for name, n in sorted(c.items())]
    return " and ".join(parts)


def _replay(joint: JointGraph, kinds: Sequence[EqnKind], saved_keys: frozenset) -> list:
    """The non-input values JAX saves under the policy, replayed on the joint graph.

    JAX's rule: the backward (tangent) eqns read primal values; an eqn the policy
    saves hands its outputs over, any other is recomputed and its operands are
    needed in turn; inputs and constants are always there.
    """
    jaxpr = C.jaxpr_of(joint.jaxpr)
    always = set(jaxpr.invars[: joint.num_primals]) | set(jaxpr.constvars)
    producer = {v: e for e, k in zip(jaxpr.eqns, kinds) if k is not EqnKind.BACKWARD for v in e.outvars}

    def saves(eqn: Any) -> bool:
        if eqn.effects:  # JAX runs effectful eqns once, in the forward
            return True
        return _visible(eqn) and _key_of(eqn) in saved_keys

    wanted = [v for e, k in zip(jaxpr.eqns, kinds) if k is EqnKind.BACKWARD for v in e.invars]
    wanted += list(jaxpr.outvars[joint.num_outputs:])
    saved: dict = {}
    seen: set = set()
    while wanted:
        v = wanted.pop()
        if C.is_literal(v) or v in seen or v in always or v not in producer:
            continue
        seen.add(v)
        eqn = producer[v]
        if saves(eqn):
            saved[v] = None
        else:
            wanted.extend(eqn.invars)
    return list(saved)


# --------------------------------------------------------------------------- public entry point
def remat_policy(
    fn: Callable[..., Any],
    *example_args: Any,
    memory_budget: float | int | str = 1.0,
    partition_fn: Callable[[JointGraph], Partition] | None = None,
    offload: bool | str = False,
    device_model: Any = None,
    op_costs: Any = "auto",
    **example_kwargs: Any,
) -> RematPolicy:
    """A ``jax.checkpoint`` policy that reproduces the min-cut's plan for ``fn``.

    Args:
      fn: the function to checkpoint; traced at ``example_args`` /
        ``example_kwargs`` (arrays or ``jax.ShapeDtypeStruct``); every inexact
        input is differentiated.
      memory_budget: the min-cut's budget: a fraction in ``[0, 1]``, or bytes of the step's compiled
        peak (``"1.4GB"``), read as every entry point reads it
        (:func:`~jaxaot.partition.parse_memory_budget`,
        :func:`~jaxaot.partition.min_cut_rematerialization_partition`).
      partition_fn: another partitioner to export instead (then leave
        ``memory_budget`` at 1).
      op_costs: what prices recomputation below budget 1 (the min-cut's option:
        measured on accelerators by default, FLOP estimates on CPUs).
      offload, device_model: plan offloading too
        (:func:`~jaxaot.partition.min_cut_rematerialization_partition`'s options): the
        policy answers ``jax.ad_checkpoint.Offloadable`` (device to
        ``pinned_host``) for what the plan offloads between the programs.

    Returns:
      A :class:`RematPolicy`: pass it as ``jax.checkpoint(fn, policy=...)``;
      ``exact`` and ``approximations`` say how faithfully JAX will follow the plan.

    Raises:
      InvalidInputError: ``fn`` or ``partition_fn`` is not callable, the budget
        is neither a number nor a string, or both a budget and a ``partition_fn`` are given.
      InvalidValueError: the budget means neither a fraction nor bytes (negative, ``1.5``, ``"0GB"``).
      MemoryBudgetError: no plan's compiled peak fits a byte budget.
    """
    if not callable(fn):
        raise InvalidInputError(
            f"remat_policy expects a callable fn (the function to checkpoint), got {type(fn).__name__} {fn!r}: "
            f"pass the function, then its example arguments: remat_policy(loss, w, x, memory_budget=0.5).")
    budget = parse_memory_budget(memory_budget)
    if partition_fn is not None:
        if not callable(partition_fn):
            raise InvalidInputError(f"partition_fn must be callable (a JointGraph -> Partition function, "
                                    f"jaxaot.partition.default_partition say), got {type(partition_fn).__name__} "
                                    f"{partition_fn!r}.")
        if budget != MemoryBudget(fraction=1.0):
            raise InvalidInputError("pass memory_budget or partition_fn, not both: the budget is the min-cut's.")
    joint = trace_joint(fn, *example_args, **example_kwargs)
    partition = partition_fn or functools.partial(min_cut_rematerialization_partition, memory_budget=budget,
                                                  offload=offload, device_model=device_model, op_costs=op_costs)
    part = partition(joint)
    if not isinstance(part, Partition):
        raise InvalidInputError(f"partition_fn returned {type(part).__name__}, not a jaxaot Partition.")
    plan = _read_plan(joint, part)
    return _policy_from_plan(plan, part.primal_plan, None if partition_fn is not None else budget.value)
