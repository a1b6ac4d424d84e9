"""Multi-device programs on JAX's own SPMD engine: sharding helpers and pipeline schedules.

jaxaot does not distribute anything itself. Sharded programs are compiled for
the shardings JAX's arrays carry (``jax.sharding.NamedSharding`` on a
``jax.sharding.Mesh``); a pipeline is one ``shard_map`` program over the mesh's
pipeline axis (``spmd``), or, with ``executor="python"``, each stage's split
executables dispatched from Python (``executor``).

Modules, each one concept, importing only downward:

* ``schedule``: :class:`Schedule` and :class:`Action` (schedules are data,
  validated before they run);
* ``simulate``: :func:`simulate`, a schedule's step time and bubble fraction
  predicted from per-op times (:class:`OpTimes`), and :func:`simulate_lockstep`
  for the compiled step's shared clock;
* ``builtin``: the built-in schedules (:func:`gpipe`, :func:`one_f_one_b`,
  :func:`interleaved`, :func:`zero_bubble`, :func:`tuned_zero_bubble`) and
  :func:`make_schedule`;
* ``microbatch``: splitting a batch into microbatches;
* ``stage``: one stage's split executables (forward, fused backward, and the
  backward split into input-gradient B and weight-gradient W);
* ``op_times``: per-pass times of the stages' executables, for the simulator;
* ``executor``: the Python executor: a schedule's actions, dispatched asynchronously across devices;
* ``spmd``: the compiled executor: the whole schedule as one SPMD program (a sub-package);
* ``report``: :class:`PipelineReport`, what ``lower`` finds per stage;
* ``pipeline``: :func:`pipeline`, the public entry.
"""

from jaxaot._src.parallel.schedule import Action, Schedule
from jaxaot._src.parallel.simulate import OpTimes, Simulation, simulate, simulate_lockstep
from jaxaot._src.parallel.builtin import gpipe, interleaved, make_schedule, one_f_one_b, tuned_zero_bubble, zero_bubble
from jaxaot._src.parallel.report import PipelineReport
from jaxaot._src.parallel.spmd import StageParams
from jaxaot._src.parallel.pipeline import Pipeline, pipeline

__all__ = [
    "Action",
    "OpTimes",
    "Pipeline",
    "PipelineReport",
    "Schedule",
    "Simulation",
    "StageParams",
    "gpipe",
    "interleaved",
    "make_schedule",
    "one_f_one_b",
    "pipeline",
    "simulate",
    "simulate_lockstep",
    "tuned_zero_bubble",
    "zero_bubble",
]
