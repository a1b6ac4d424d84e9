"""Running one training step of a pipeline: a schedule's actions, dispatched in issue order.

:func:`run_schedule` walks the schedule's actions once, in order, calling one
compiled executable of the action's stage per action (F, B, W or BW,
:mod:`jaxaot._src.parallel.stage`) and moving activations and cotangents between
stage devices with ``jax.device_put``. Nothing blocks, so devices overlap as the
schedule allows. The walk counts each stage's live residual sets from the
dictionaries that hold them, to check the schedule's memory promise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from jaxaot._src.parallel.schedule import Schedule
from jaxaot._src.parallel.stage import Stage, StagePrograms


@jax.jit
def _add(acc: list, grads: list) -> list:
    return jax.tree_util.tree_map(lambda a, b: a + b, acc, grads)


@jax.jit
def _mean(losses: list) -> jax.Array:
    return sum(losses[1:], losses[0]) / len(losses)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one step computed.

    Attributes:
      loss: the mean of the microbatches' losses (on the last stage's device).
      grads: per stage, its parameters' summed gradients per leaf (None where not differentiated).
      peak_live: per stage, the most microbatches whose residuals were alive at once.
    """

    loss: jax.Array
    grads: list[list[Any]]
    peak_live: tuple[int, ...]


def run_schedule(schedule: Schedule, stages: Sequence[Stage], programs: Sequence[StagePrograms],
                 params: Sequence[list], inputs: Sequence[list], targets: Sequence[list],
                 loss_cotangent: list) -> StepResult:
    """Dispatch one training step (see the module docstring).

    Args:
      schedule: the actions to run, in issue order.
      stages / programs: each stage and its programs for this signature.
      params: per stage, its parameter leaves (on its device).
      inputs: per microbatch, the first stage's input leaves (on its device).
      targets: per microbatch, the target leaves (on the last stage's device).
      loss_cotangent: the last stage's cotangent (``[1 / num_microbatches]``, on its device).
    """
    last = len(stages) - 1
    acts: list[dict[int, list]] = [dict(enumerate(inputs))] + [{} for _ in range(last)]
    cts: list[dict[int, list]] = [{} for _ in stages]
    residuals: list[dict[int, list]] = [{} for _ in stages]
    pending_w: list[dict[int, list]] = [{} for _ in stages]
    acc: list[list | None] = [None] * len(stages)
    peak = [0] * len(stages)
    losses = []
    for a in schedule.actions:
        s, m, p = a.stage, a.microbatch, programs[a.stage]
        if a.op == "F":
            leaves = params[s] + acts[s].pop(m) + (targets[m] if s == last else [])
            outs, residuals[s][m] = p.forward(leaves)
            peak[s] = max(peak[s], len(residuals[s]))
            if s == last:
                losses.append(outs[0])
            else:
                acts[s + 1][m] = stages[s + 1].place(list(outs))
            continue
        if a.op == "W":
            grads = p.backward_weight(pending_w[s].pop(m))
        else:
            ct = loss_cotangent if s == last else cts[s].pop(m)
            res = residuals[s].pop(m)
            if a.op == "BW":
                grads, act_grads = p.backward(res, ct)
            else:
                act_grads, pending_w[s][m] = p.backward_input(res, ct)
                grads = None
            del res
            if s > 0:
                cts[s - 1][m] = stages[s - 1].place([act_grads[k] for k in programs[s - 1].cotangent_outputs])
        if grads is not None:
            acc[s] = _accumulate(acc[s], p.param_grads_of(grads))
    return StepResult(_mean(losses), [g or [] for g in acc], tuple(peak))


def _accumulate(acc: list | None, grads: list) -> list:
    return list(grads) if acc is None else _add(acc, grads)
