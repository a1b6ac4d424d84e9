"""A value Python looks at during a lazy recording, computed by one compiled program.

When the forward asks for a value (``if loss > 0``), the not yet computed
operations it depends on run as one program (:func:`plan`), compiled once per
structure and kept on the tape's trie node, instead of one dispatch each.
:mod:`.replay` calls the same executables, so a replayed step sees the values a
recording would. A program that does not compile runs op by op, as eager JAX.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded.step_cache import LOOKS


class Plan:
    """How to compute one value from known ones: ``exe(*values[ins])``, or the operations one by one."""

    __slots__ = ("exe", "ins", "vid", "eqns")

    def __init__(self, exe: Any, ins: tuple, vid: int, eqns: tuple) -> None:
        self.exe, self.ins, self.vid, self.eqns = exe, ins, vid, eqns

    def run(self, values: list, trace: Any) -> Any:
        """The value, from ``values`` (by value number; the plan's own operations' outputs are filled in when
        they run one by one, in ``trace``)."""
        if self.exe is not None:
            with C.set_current_trace(trace):  # JAX's fast dispatch path runs only outside any other trace
                return self.exe(*[values[v] for v in self.ins])
        for e in self.eqns:
            outs = C.bind_on(trace, e.prim, [values[v] for v in e.ins], e.params, e.staged)
            for v, o in zip(e.outs, outs):
                values[v] = o
        return values[self.vid]


def look_source(node: Any, plan: Plan | None) -> Any:
    """Where in the user's code a look is: a computed look's trie ``node`` keeps it from its first time there
    (``plan``: the look's, None when the value was known and the trie did not move)."""
    if plan is None:
        return C.source_info()
    if node.info is None:
        node.info = C.source_info()
    return node.info


def place_ahead(plan: Plan, known_at: dict) -> None:
    """Keep ``plan`` on the trie node from which all its inputs are known (``known_at``: value number ->
    ``(order, node)`` where it became known), so that later recordings start it there (:func:`start_ahead`)."""
    if plan.exe is None or not plan.ins:
        return
    at = [known_at.get(v) for v in plan.ins]
    if any(a is None for a in at):
        return
    node = max(at, key=lambda a: a[0])[1]
    node.ahead += (plan,)


def known(tape: Any, vid: int, node: Any) -> None:
    """``vid``'s value became known on ``tape`` at trie ``node``: start the plans kept there (lazy recording)."""
    known_at = tape.known_at
    known_at[vid] = (len(known_at), node)
    if node.ahead and not tape.eager:
        start_ahead(node, tape.values, tape.parent, tape.started, tape.ahead)


def known_all(tape: Any, vids: Sequence[int], node: Any) -> None:
    """:func:`known` of several values that became known together, at trie ``node``."""
    known_at = tape.known_at
    for vid in vids:
        known_at[vid] = (len(known_at), node)
    if node.ahead and not tape.eager:
        start_ahead(node, tape.values, tape.parent, tape.started, tape.ahead)


def start_ahead(node: Any, values: list, trace: Any, started: dict, step: Any = None) -> None:
    """Start the plans ``node`` keeps (:func:`place_ahead`) on the known ``values``: the program runs while
    the forward is recorded further, and Python, when it looks, gets the result at once. ``started``: plan ->
    ``(result, node)``. The same program on the same values: the value Python gets is the one it would.
    Plans whose value the ``step`` started ahead returns start none (the step gives it, :mod:`.ahead`)."""
    served = step.looks if step is not None else ()
    for plan in node.ahead:
        if plan in served:
            continue
        ins = [values[v] for v in plan.ins]
        if any(x is None for x in ins):
            continue
        try:
            with C.set_current_trace(trace):
                out = plan.exe(*ins)
        except Exception:  # noqa: BLE001 - it runs again when Python looks, and raises there
            continue
        if getattr(out, "size", 2) == 1:
            out.copy_to_host_async()  # queued behind the program: on the host when Python looks
        started[plan] = (out, node)


def unused(started: dict) -> None:
    """Drop the plans started ahead that a recording never asked for from their nodes (the recording went
    another way after them; they would start for nothing again)."""
    for plan, (_, node) in started.items():
        node.ahead = tuple(p for p in node.ahead if p is not plan)
    started.clear()


def needed(tape: Any, vid: int) -> tuple[list[int], set[int]]:
    """The operations ``vid`` depends on whose values are unknown (in order), and the known values they read."""
    values, eqns = tape.values, tape.eqns
    producer = {v: i for i, e in enumerate(eqns) for v in e.outs}
    ops, reads, stack = set(), set(), [producer[vid]]
    while stack:
        i = stack.pop()
        if i in ops:
            continue
        ops.add(i)
        for v in eqns[i].ins:
            if values[v] is None:
                stack.append(producer[v])
            else:
                reads.add(v)
    return sorted(ops), reads


def plan(tape: Any, vid: int) -> Plan:
    """The :class:`Plan` computing ``vid`` on ``tape``, its program compiled on first sight of its structure."""
    order, reads = needed(tape, vid)
    keyed = {e[0]: e[3] for e in tape.inputs if len(e) > 3 and e[0] in reads}  # a literal's value, an array's place
    lit_keys = {v: k for v, k in keyed.items() if tape.kinds[v] == "lit"}
    literals = {v: tape.values[v] for v in lit_keys}
    feed = tuple(sorted(v for v in reads if v not in literals))
    akeys = tape.akeys
    key = ("force", tuple(tape.eqn_key(i) for i in order), tuple((v, akeys[v], keyed.get(v)) for v in feed),
           tuple(sorted(lit_keys.items())), vid, tape.placement, tape.config)
    eqns = tuple(tape.eqns[i] for i in order)
    fed = [tape.values[v] for v in feed]
    try:
        exe, _ = LOOKS.get(key, None, lambda: _compile(eqns, feed, literals, vid, fed),
                            lambda: f"a value Python looked at, computed by one program of {len(order)} operations")
    except Exception:  # noqa: BLE001 - not compilable: the operations run one by one (the plan says so)
        exe = None
    return Plan(exe, feed, vid, eqns)


def _compile(eqns: Sequence[Any], feed: tuple, literals: dict, vid: int, fed: list) -> tuple[Any, dict]:
    def run(*xs):
        env = dict(zip(feed, xs))
        env.update(literals)
        for e in eqns:
            outs = C.bind_on(None, e.prim, [env[v] for v in e.ins], e.params, e.staged, e.source_info)
            env.update(zip(e.outs, outs))
        return env[vid]

    t = time.perf_counter()
    exe = jax.jit(run).lower(*fed).compile()
    return exe, {"compile_look": time.perf_counter() - t}
