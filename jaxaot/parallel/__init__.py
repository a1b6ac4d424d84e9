"""Multi-device programs on JAX's own SPMD engine: sharding helpers and pipeline schedules.

jaxaot does not distribute anything itself. Sharded programs are compiled for
the shardings JAX's arrays carry (``jax.sharding.NamedSharding`` on a
``jax.sharding.Mesh``); pipelines run each stage's split executables on its
own device or sub-mesh and move activations with ``jax.device_put``.

Modules, each one concept, importing only downward:

* ``schedule``: :class:`Schedule` and :class:`Action` (schedules are data,
  validated before they run) and the built-in schedules (:func:`gpipe`,
  :func:`one_f_one_b`, :func:`interleaved`, :func:`zero_bubble`);
* ``simulate``: :func:`simulate`, a schedule's step time and bubble fraction
  predicted from per-op times (:class:`OpTimes`);
* ``microbatch``: splitting a batch into microbatches;
* ``stage``: one stage's split executables (forward, fused backward, and the
  backward split into input-gradient B and weight-gradient W);
* ``executor``: runs a schedule's actions, asynchronously, across devices;
* ``pipeline``: :func:`pipeline`, the public entry.
"""

from jaxaot.parallel.schedule import Action, Schedule, gpipe, interleaved, make_schedule, one_f_one_b, zero_bubble
from jaxaot.parallel.simulate import OpTimes, Simulation, simulate
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
    "zero_bubble",
]
