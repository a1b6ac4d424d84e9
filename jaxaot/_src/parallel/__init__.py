"""Multi-device programs on JAX's own SPMD engine: sharding helpers and pipeline schedules.

jaxaot distributes nothing itself: sharded programs are compiled for the shardings
JAX's arrays carry, and a pipeline is one ``shard_map`` program over the mesh's
pipeline axis (``spmd``), or each stage's executables dispatched from Python
(``executor="python"``). Schedules are data (:class:`Schedule`), validated before
they run and simulated from per-op times (:func:`simulate`); :func:`pipeline` is
the entry point.
"""

from jaxaot._src.parallel.schedule import Action, Schedule
from jaxaot._src.parallel.simulator import OpTimes, Simulation, simulate, simulate_lockstep
from jaxaot._src.parallel.builtin import gpipe, interleaved, make_schedule, one_f_one_b, tuned_zero_bubble, zero_bubble
from jaxaot._src.parallel.report import PipelineReport
from jaxaot._src.parallel.spmd import StageParams
from jaxaot._src.parallel.training_pipeline import Pipeline, pipeline

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
