"""What a pipeline's ``lower`` reports per stage, for one input signature (nothing runs)."""

from __future__ import annotations

import dataclasses

from jaxaot._src.parallel import microbatch
from jaxaot._src.parallel.schedule import Schedule


@dataclasses.dataclass(frozen=True)
class PipelineReport:
    """What :meth:`jaxaot.parallel.Pipeline.lower` finds, per stage, for one input signature (nothing is run).

    Attributes:
      schedule: the :class:`~jaxaot.parallel.Schedule` the step runs.
      placements: each stage's device (or mesh).
      input_specs: each stage's input activations for one microbatch (``jax.ShapeDtypeStruct`` trees).
      residual_bytes: bytes of one microbatch's residuals, parameters left out (alive anyway).
      weight_pass_bytes: bytes one microbatch keeps alive from its B to its W (the B/W split's handoff
        and the residuals W reads).
      peak_live_microbatches: the most microbatches whose residuals the schedule keeps alive at once.
      ideal_peak_bytes: (compiled executor) the least one device of the SPMD step can hold: the largest
        device's parameters and gradients, its peak live microbatches times the largest stage's residuals
        (and W arguments), one message each way. ``step.peak_bytes`` compares with it.
    """

    schedule: Schedule
    placements: tuple
    input_specs: tuple
    residual_bytes: tuple[int, ...]
    weight_pass_bytes: tuple[int, ...]
    peak_live_microbatches: tuple[int, ...]
    ideal_peak_bytes: int | None = None

    @property
    def peak_residual_bytes(self) -> tuple[int, ...]:
        """Per stage, residual bytes at the schedule's peak (``residual_bytes * peak_live_microbatches``)."""
        return tuple(b * n for b, n in zip(self.residual_bytes, self.peak_live_microbatches))

    def __str__(self) -> str:
        rows = [f"pipeline: schedule {self.schedule.name!r}, {self.schedule.num_stages} stages, "
                f"{self.schedule.num_microbatches} microbatches, {self.schedule.num_devices} devices",
                "stage  device  input            residuals/mb  B->W/mb  peak live  peak residuals"]
        for s, place in enumerate(self.placements):
            rows.append(f"{s:<6} {str(getattr(place, 'id', place)):<7} {microbatch.describe(self.input_specs[s]):<16} "
                        f"{self.residual_bytes[s]:>12}  {self.weight_pass_bytes[s]:>7}  "
                        f"{self.peak_live_microbatches[s]:>9}  {self.peak_residual_bytes[s]:>14}")
        return "\n".join(rows)
