"""The compiled pipeline: a whole schedule as one SPMD program on JAX's own engine.

``shard_map`` over the mesh's pipeline axis, ``lax.ppermute`` carrying
activations forward and cotangents back, one ``lax.scan`` over the schedule's
ticks, in each a ``lax.cond`` per op and stage that runs a stage's
jaxaot-partitioned pass on its records in place. Modules, each one concept,
importing only downward:

* ``layout``: records, every stage's leaves in buffers of one shape on every device, sized by the largest stage;
* ``ticks``: a schedule as a table of ticks, with every buffer slot allocated (:class:`TickPlan`);
* ``passes``: one stage's F, B, W and BW as traceable functions of its partition (:class:`StagePasses`);
* ``params``: per-stage parameter trees packed over the stage axis (:class:`StageParams`);
* ``program``: the SPMD step itself (:func:`build_step`);
* ``memory``: whether a compiled step fits its devices, checked before it first runs (:func:`check_fits`);
* ``executor``: per input signature, trace the stages and compile the step (:class:`CompiledExecutor`);
* ``calibrate``: the passes' times inside compiled loops, for the lockstep simulator (:func:`pass_times`).
"""

from jaxaot._src.parallel.spmd.layout import Layout, Place, build
from jaxaot._src.parallel.spmd.ticks import TickPlan, check_ring, plan
from jaxaot._src.parallel.spmd.passes import StagePasses
from jaxaot._src.parallel.spmd.params import StageParams, pack, stage_avals, unpack
from jaxaot._src.parallel.spmd.program import Axes, Layouts, build_step
from jaxaot._src.parallel.spmd.memory import check_fits
from jaxaot._src.parallel.spmd.executor import CompiledExecutor, auto_mesh, check_mesh
from jaxaot._src.parallel.spmd.calibrate import pass_times

__all__ = ["Axes", "CompiledExecutor", "Layout", "Layouts", "Place", "StageParams", "StagePasses", "TickPlan",
           "auto_mesh", "build", "build_step", "check_fits", "check_mesh", "check_ring", "pack", "pass_times", "plan",
           "stage_avals", "unpack"]
