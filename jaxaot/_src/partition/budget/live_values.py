"""What holds a step's peak: the largest values live at it, by source line.

XLA reports how high a program peaks, not what is alive there. To say what to
change when no plan fits, :func:`peak_holders` replays the step's top-level eqns in
XLA's usual order, keeps each value alive to its last reader, and lists the largest
values live where the bytes are highest, by the source line that made them. XLA's
schedule may differ; the compiled peak stays the number a budget is held to.
"""

from __future__ import annotations

import collections
from typing import Any

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, var_device_nbytes
from jaxaot._src.partition.core import Partition


def _just_in_time(jaxpr: Any, num_cotangents: int) -> list[int]:
    """The backward's eqns with each recomputation emitted just before the first gradient eqn that needs it
    (as XLA schedules them), gradient eqns (those a cotangent reaches) in program order."""
    eqns = jaxpr.eqns
    producer = {v: i for i, e in enumerate(eqns) for v in e.outvars if not C.is_drop_var(v)}
    reached = set(jaxpr.invars[:num_cotangents])
    roots = []
    for i, e in enumerate(eqns):
        if any(not C.is_literal(v) and v in reached for v in e.invars):
            reached.update(e.outvars)
            roots.append(i)
    order, done = [], set()
    for root in roots + list(range(len(eqns))):
        stack = [(root, False)]
        while stack:
            i, ready = stack.pop()
            if ready:
                order.append(i)
                continue
            if i in done:
                continue
            done.add(i)
            stack.append((i, True))
            deps = sorted({producer[v] for v in eqns[i].invars if not C.is_literal(v) and v in producer}, reverse=True)
            stack.extend((d, False) for d in deps if d not in done)
    return order


def _replay(jaxpr: Any, order: list[int], live: dict, labels: dict, keep: set, best: tuple) -> tuple:
    """Run ``jaxpr``'s eqns in ``order`` over ``live`` (var -> bytes), each value freed after its last reader;
    ``best`` is ``(bytes, snapshot)``, the highest so far."""
    last: dict = {v: len(order) for v in keep}
    for step, i in enumerate(order):
        for v in jaxpr.eqns[i].invars:
            if not C.is_literal(v) and v not in keep:
                last[v] = step
    for step, i in enumerate(order):
        eqn = jaxpr.eqns[i]
        source = C.eqn_source(eqn)
        for v in eqn.outvars:
            if not C.is_drop_var(v):
                live[v] = var_device_nbytes(v)
                labels[v] = f"{format_aval(v.aval)} {eqn.primitive.name} @ {source}"
        total = sum(live.values())
        if total > best[0]:
            best = (total, dict(live))
        for v in [v for v in live if last.get(v, -1) <= step]:
            del live[v]
    return best


def peak_holders(part: Partition, top: int = 5) -> tuple[int, list[tuple[int, str]]]:
    """``(live bytes at the replayed peak, [(bytes, description), ...])`` of ``part``'s step, largest first.

    Values made on one source line are summed into one entry (a line that makes
    four 8 MiB score matrices reads ``32 MiB ... x4``).
    """
    fwd, bwd = C.jaxpr_of(part.forward), C.jaxpr_of(part.backward)
    live: dict = {}
    labels: dict = {}
    for i, v in enumerate(fwd.invars):
        live[v], labels[v] = var_device_nbytes(v), f"input[{i}] {format_aval(v.aval)}"
    inputs = set(fwd.invars)
    best = _replay(fwd, list(range(len(fwd.eqns))), live, labels,
                   inputs | set(v for v in fwd.outvars if not C.is_literal(v)), (sum(live.values()), dict(live)))
    # Hand over: the residuals become the backward's inputs; the forward's other results go. A saved
    # input is the input's buffer (held already); an offloaded residual waits in host memory.
    n_ct = len(part.cotangent_outputs)
    n_in = len(part.saved_inputs)
    produced = [fwd.invars[i] for i in part.saved_inputs] + [fwd.outvars[i] for i in part.saved_outputs]
    held = {v: live.get(v, 0) for v in fwd.invars}
    for k, (v, r, res) in enumerate(zip(produced, bwd.invars[n_ct:], part.residuals)):
        if r in held and k < n_in:
            continue  # the input itself
        held[r] = 0 if k < n_in or res.offloaded else var_device_nbytes(r)
        labels[r] = labels.get(v, str(v))
    for j, v in enumerate(bwd.invars[:n_ct]):
        held[v], labels[v] = var_device_nbytes(v), f"cotangent[{j}] {format_aval(v.aval)}"
    keep = inputs | {v for v in bwd.outvars if not C.is_literal(v)}
    best = _replay(bwd, _just_in_time(bwd, n_ct), held, labels, keep, best)
    total, snapshot = best
    by_line: dict[str, list[int]] = collections.defaultdict(list)
    for v, n in snapshot.items():
        if n:
            by_line[labels.get(v, str(v))].append(n)
    rows = sorted(((sum(ns), line + (f" x{len(ns)}" if len(ns) > 1 else "")) for line, ns in by_line.items()),
                  key=lambda r: -r[0])
    return total, rows[:top]
