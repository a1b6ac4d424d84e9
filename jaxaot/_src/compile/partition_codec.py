"""A partition as a cache entry: its saved set, as positions of vars in the joint graph.

A position is ``["i", k]`` (input), ``["c", k]`` (const) or ``["e", k, j]`` (an
eqn's output); :func:`~jaxaot._src.partition.split_joint` rebuilds the partition
from them, after replaying a primal rewrite (``primal_plan``) and re-applying
offloads. Any saved set gives correct gradients, so a stale entry costs memory or
time, never correctness; a partition that cannot be reproduced is not stored. The
payload is JSON, with a summary that checks the decoded partition.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

from jaxaot._src import compat as C
from jaxaot._src.files import parse_json
from jaxaot._src.pytrees import dtype_name
from jaxaot._src.compile.store import FORMAT_VERSION
from jaxaot.errors import PartitionError
from jaxaot._src.partition import Partition, StepPeak, apply_offload, replay_joint, saved_vars, split_joint
from jaxaot._src.tracing import JointGraph, JointRecipe

#: How deep a stored record's JSON may nest (positions, and a primal plan nested as deep as its scans).
MAX_DEPTH = 256
_COMPARED_FIELDS = ("num_outputs", "cotangent_outputs", "saved_inputs", "saved_outputs", "grad_inputs",
                    "residuals", "recomputed")


def encode(joint: JointGraph, part: Partition) -> bytes | None:
    """The payload that rebuilds ``part`` from ``joint``; None if no saved set reproduces it."""
    plan = part.primal_plan
    source = part.split_from if plan is not None else joint
    if source is None:
        return None
    pos = _var_positions(C.jaxpr_of(source.jaxpr))
    saved = saved_vars(part)  # through the host copies of offloaded residuals
    if not all(not C.is_literal(v) and v in pos for v in saved):
        return None  # the partitioner rewrote the joint graph without telling how: not replayable
    offloaded = [j for j, r in enumerate(part.residuals) if r.offloaded]
    try:
        rebuilt_source = _split_source(joint, plan)
        rebuilt = split_joint(rebuilt_source, _vars_at(C.jaxpr_of(rebuilt_source.jaxpr), [pos[v] for v in saved]))
        rebuilt = apply_offload(rebuilt, offloaded, part.offload_note)
    except Exception:
        return None
    if not _same_partition(rebuilt, part):
        return None
    record = {"format": FORMAT_VERSION, "saved": [pos[v] for v in saved], "summary": _summary(part), "plan": plan,
              "offloaded": offloaded, "offload_note": part.offload_note, "cost_note": part.cost_note,
              "step_peak": None if part.step_peak is None else dataclasses.asdict(part.step_peak)}
    return json.dumps(record, sort_keys=True).encode()


def decode(recipe: JointRecipe, payload: bytes | memoryview, joint: Callable[[], JointGraph]) -> Partition | None:
    """The partition of ``recipe``'s joint graph that :func:`encode` stored; None if the payload does not rebuild it.

    ``joint()`` returns that joint graph; it is called only for an entry without a
    primal rewrite (one with a rewrite is split from the joint graph of the replayed
    rewrite, built from ``recipe`` alone).
    """
    try:
        record = parse_json(payload, MAX_DEPTH)
        if record.get("format") != FORMAT_VERSION:
            return None
        plan = record.get("plan")
    except Exception:
        return None
    traced = joint() if plan is None else None  # outside the try: its errors are the caller's, not the entry's
    try:
        source = traced if plan is None else replay_joint(recipe, plan)
        part = split_joint(source, _vars_at(C.jaxpr_of(source.jaxpr), record["saved"]))
        if plan is not None:
            part = dataclasses.replace(part, primal_plan=plan, split_from=source)
        part = apply_offload(part, record.get("offloaded", []), record.get("offload_note", ""))
        part = dataclasses.replace(part, cost_note=str(record.get("cost_note", "")))
        peak = record.get("step_peak")
        if peak is not None:
            part = dataclasses.replace(part, step_peak=StepPeak(**{k: None if v is None else int(v)
                                                                   for k, v in peak.items()}))
    except Exception:
        return None
    return part if _summary(part) == record.get("summary") else None


def _split_source(joint: JointGraph, plan: Any) -> JointGraph:
    """The joint graph a partition is split from: ``joint``, or its primal with a rewrite replayed."""
    return joint if plan is None else replay_joint(joint, plan)


def _var_positions(jaxpr: Any) -> dict[Any, list]:
    pos: dict[Any, list] = {}
    for k, v in enumerate(jaxpr.invars):
        pos.setdefault(v, ["i", k])
    for k, v in enumerate(jaxpr.constvars):
        pos.setdefault(v, ["c", k])
    for k, eqn in enumerate(jaxpr.eqns):
        for j, v in enumerate(eqn.outvars):
            if not C.is_drop_var(v):
                pos.setdefault(v, ["e", k, j])
    return pos


def _vars_at(jaxpr: Any, positions: Sequence[Sequence[Any]]) -> list:
    out = []
    for p in positions:
        tag, k = p[0], int(p[1])
        if tag == "i":
            out.append(jaxpr.invars[k])
        elif tag == "c":
            out.append(jaxpr.constvars[k])
        elif tag == "e":
            out.append(jaxpr.eqns[k].outvars[int(p[2])])
        else:
            raise PartitionError(f"unknown var position {p!r} in a saved partition")
    return out


def _summary(part: Partition) -> dict:
    return {
        "saved_inputs": list(part.saved_inputs),
        "saved_outputs": list(part.saved_outputs),
        "residuals": [[[str(d) for d in r.aval.shape], dtype_name(r.aval.dtype)] for r in part.residuals],
        "offloaded": [j for j, r in enumerate(part.residuals) if r.offloaded],
    }


def _same_partition(a: Partition, b: Partition) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _COMPARED_FIELDS) and (
        str(a.forward) == str(b.forward) and str(a.backward) == str(b.backward)
    )
