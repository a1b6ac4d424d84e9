"""Per-stage pass times for the simulator, measured on the stages' own executables.

:func:`measure` compiles and runs every pass of every stage, then times each
``repeats`` times, dispatching it ``back_to_back`` times per sample as a running
pipeline does; passes take turns round by round, so machine drift hits all alike,
and the median is kept. ``transfer[s]`` is the slower of stage ``s``'s two moves.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot._src.parallel.simulator import OpTimes
from jaxaot._src.parallel.stage import Stage, StagePrograms


def measure(stages: Sequence[Stage], programs: Sequence[StagePrograms], params: Sequence[Any], inputs: Any,
            targets: Any, loss_cotangent: list, *, repeats: int = 5, back_to_back: int = 4) -> OpTimes:
    """Per-stage F, B, W, BW and transfer times (see the module docstring)."""
    probes = _op_probes(stages, programs, params, inputs, targets, loss_cotangent)
    runs: dict[tuple[str, int], list[float]] = {key: [] for key in probes}
    for _ in range(repeats):
        for key, fn in probes.items():
            t = time.perf_counter()
            outs = [fn() for _ in range(max(1, back_to_back))]
            jax.block_until_ready(outs)
            runs[key].append((time.perf_counter() - t) / max(1, back_to_back))
    n = range(len(stages))
    med = {key: statistics.median(ts) for key, ts in runs.items()}
    per_op = {op: tuple(med[(op, s)] for s in n) for op in ("F", "B", "W", "BW")}
    transfer = tuple(max(med.get(("activation", s), 0.0), med.get(("cotangent", s), 0.0)) for s in n)
    return OpTimes(per_op["F"], per_op["B"], per_op["W"], per_op["BW"], transfer)


def _op_probes(stages: Sequence[Stage], programs: Sequence[StagePrograms], params: Sequence[Any], inputs: Any,
               targets: Any, loss_cotangent: list) -> dict[tuple[str, int], Callable[[], Any]]:
    """``{(pass, stage): run it on microbatch 0}``, after running each once (so each is compiled).

    Passes are ``F``, ``B``, ``W``, ``BW``, and ``activation`` / ``cotangent`` for
    the transfers into a stage from its neighbours on other devices.
    """
    last = len(stages) - 1
    probes: dict[tuple[str, int], Callable[[], Any]] = {}
    acts = jax.tree_util.tree_leaves(inputs)
    saved = []
    for s, p in enumerate(programs):
        leaves = jax.tree_util.tree_leaves(params[s]) + acts + (jax.tree_util.tree_leaves(targets) if s == last else [])
        probes[("F", s)] = functools.partial(p.forward, leaves)
        outs, res = p.forward(leaves)
        saved.append(res)
        if s < last:
            if stages[s + 1].placement != stages[s].placement:
                probes[("activation", s + 1)] = functools.partial(stages[s + 1].place, list(outs))
            acts = stages[s + 1].place(list(outs))
    ct = loss_cotangent
    for s in range(last, -1, -1):
        p, res = programs[s], saved[s]
        probes[("BW", s)] = functools.partial(p.backward, res, ct)
        probes[("B", s)] = functools.partial(p.backward_input, res, ct)
        act_grads, wargs = p.backward_input(res, ct)
        probes[("W", s)] = functools.partial(p.backward_weight, wargs)
        if s > 0:
            back = [act_grads[k] for k in programs[s - 1].cotangent_outputs]
            if stages[s - 1].placement != stages[s].placement:
                probes[("cotangent", s - 1)] = functools.partial(stages[s - 1].place, back)
            ct = stages[s - 1].place(back)
    for fn in probes.values():
        jax.block_until_ready(fn())
    return probes
