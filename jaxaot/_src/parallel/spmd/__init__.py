"""The compiled pipeline: a whole schedule as one SPMD program on JAX's own engine.

``shard_map`` over the mesh's pipeline axis, one ``lax.scan`` over the schedule's
ticks, a ``lax.cond`` per op and stage running a stage's jaxaot-partitioned pass on
its records in place, and ``lax.ppermute`` carrying activations forward and
cotangents back. :class:`CompiledExecutor` traces the stages and compiles the step
once per input signature, and checks it fits the devices before it first runs.
"""

from jaxaot._src.parallel.spmd.layout import Layout, Place, build
from jaxaot._src.parallel.spmd.ticks import TickPlan, check_ring, plan
from jaxaot._src.parallel.spmd.passes import StagePasses
from jaxaot._src.parallel.spmd.params import StageParams, pack, stage_avals, unpack
from jaxaot._src.parallel.spmd.tick_loop import Axes, Layouts, build_step
from jaxaot._src.parallel.spmd.memory import check_fits
from jaxaot._src.parallel.spmd.compiled_executor import CompiledExecutor, auto_mesh, check_mesh
from jaxaot._src.parallel.spmd.calibrate import pass_times

__all__ = ["Axes", "CompiledExecutor", "Layout", "Layouts", "Place", "StageParams", "StagePasses", "TickPlan",
           "auto_mesh", "build", "build_step", "check_fits", "check_mesh", "check_ring", "pack", "pass_times", "plan",
           "stage_avals", "unpack"]
