"""Pipeline parallelism: schedules, their simulator, and ``pipeline``, one SPMD program over a mesh."""

import typing as _typing

from jaxaot._src import deprecations as _deprecations
from jaxaot._src.parallel import (
    pipeline as pipeline,
    Pipeline as Pipeline,
    PipelineReport as PipelineReport,
    StageParams as StageParams,
    Schedule as Schedule,
    Action as Action,
    make_schedule as make_schedule,
    gpipe as gpipe,
    one_f_one_b as one_f_one_b,
    interleaved as interleaved,
    zero_bubble as zero_bubble,
    tuned_zero_bubble as tuned_zero_bubble,
    OpTimes as OpTimes,
    Simulation as Simulation,
    simulate as simulate,
    simulate_lockstep as simulate_lockstep,
)

__all__ = [
    "pipeline", "Pipeline", "PipelineReport", "StageParams", "Schedule", "Action", "make_schedule", "gpipe",
    "one_f_one_b", "interleaved", "zero_bubble", "tuned_zero_bubble", "OpTimes", "Simulation", "simulate",
    "simulate_lockstep",
]

# The old layout's paths, for one release: ``import jaxaot.parallel.<module>`` and names its package exported.
__path__: list[str] = []
if not _typing.TYPE_CHECKING:
    __getattr__ = _deprecations.face_getattr("jaxaot.parallel", "jaxaot._src.parallel")
