"""Multi-device programs on JAX's own SPMD engine: sharding helpers and pipeline schedules.

jaxaot does not distribute anything itself. Sharded programs are compiled for
the shardings JAX's arrays carry (``jax.sharding.NamedSharding`` on a
``jax.sharding.Mesh``); pipelines run each stage's split executables on its
own device or sub-mesh and move activations with ``jax.device_put``.

Modules, each one concept, importing only downward:

* ``schedule``: :class:`Schedule` and :class:`Action` (schedules are data,
  validated before they run);
* ``simulate``: :func:`simulate`, a schedule's step time and bubble fraction
  predicted from per-op times (:class:`OpTimes`);
* ``builtin``: the built-in schedules (:func:`gpipe`, :func:`one_f_one_b`,
  :func:`interleaved`, :func:`zero_bubble`, :func:`tuned_zero_bubble`) and
  :func:`make_schedule`;
* ``microbatch``: splitting a batch into microbatches;
* ``stage``: one stage's split executables (forward, fused backward, and the
  backward split into input-gradient B and weight-gradient W);
* ``executor``: runs a schedule's actions, asynchronously, across devices;
* ``pipeline``: :func:`pipeline`, the public entry.
"""

from jaxaot.parallel.schedule import Action, Schedule
from jaxaot.parallel.simulate import OpTimes, Simulation, simulate
from jaxaot.parallel.builtin import gpipe, interleaved, make_schedule, one_f_one_b, tuned_zero_bubble, zero_bubble
from jaxaot.parallel.pipeline import Pipeline, PipelineReport, pipeline

__all__ = [
    "Action",
    "OpTimes",
    "Pipeline",
    "PipelineReport",
    "Schedule",
    "Simulation",
    "gpipe",
    "interleaved",
    "make_schedule",
    "one_f_one_b",
    "pipeline",
    "simulate",
    "tuned_zero_bubble",
    "zero_bubble",
]
