"""What one eqn costs to run: the :class:`OpCosts` protocol and its FLOP estimate, :class:`FlopCosts`.

The min-cut's knapsack recomputes first what costs least per byte saved, and the
offload planner's timeline needs how long each eqn runs: both ask an
:class:`OpCosts`, any object with ``seconds(eqn)`` and a ``note``.
:class:`FlopCosts` is a roofline of FLOPs and bytes; measured costs
(:class:`~jaxaot._src.partition.costs.measured_costs.MeasuredCosts`, the default on
accelerators) also see dtypes, memory-bound shapes and convolution algorithms.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition import FlopCosts, OpCosts
    >>> eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((64, 32)), jnp.ones((32, 16))).jaxpr.eqns[0]
    >>> FlopCosts(device_flops=1e9).seconds(eqn)  # 2 * 64 * 16 * 32 FLOPs at 1 GFLOP/s
    6.5536e-05
    >>> isinstance(FlopCosts(), OpCosts)
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, runtime_checkable

from jaxaot.errors import PartitionError
from jaxaot._src.pytrees import nbytes as aval_nbytes
from jaxaot._src.partition.costs import cost_model

#: The FLOP/s :class:`FlopCosts` assumes when given none; only ratios matter to the knapsack.
NOMINAL_FLOPS = 1e12


@runtime_checkable
class OpCosts(Protocol):
    """The extension point: seconds one run of an eqn takes on the device the plan is for.

    ``seconds`` must be positive and deterministic for equal eqns within one plan
    (the knapsack sorts by it). ``note`` says where the costs came from; the
    partition carries it (``Partition.cost_note``) and ``lower()`` prints it.
    An optional ``prefetch(eqns)`` is called with the eqns about to be priced, before
    their ``seconds``, for costs that measure many eqns faster together.
    """

    note: str

    def seconds(self, eqn: Any) -> float:
        """Seconds one run of ``eqn`` takes."""


@dataclasses.dataclass(frozen=True)
class FlopCosts:
    """Costs estimated from each eqn's FLOP count (a matmul's or convolution's from its shapes).

    Attributes:
      device_flops: FLOP/s of the device.
      device_bandwidth: bytes/s of its memory; eqns that XLA does not fuse into their neighbours
        (matmuls, convolutions, large reductions, loops) then cost at least their operands' and
        results' bytes over it. None: FLOPs alone.
    """

    device_flops: float = NOMINAL_FLOPS
    device_bandwidth: float | None = None

    @property
    def note(self) -> str:
        return "recompute costs: FLOP estimates" + (" and bytes moved" if self.device_bandwidth else "")

    def seconds(self, eqn: Any) -> float:
        """``flops / device_flops``, or bytes moved over ``device_bandwidth`` where that is slower.

        Fusible eqns count FLOPs alone: XLA fuses them into their neighbours'
        kernels, whose traffic is counted there.
        """
        t = cost_model.flops(eqn) / self.device_flops
        if self.device_bandwidth and cost_model.classify(eqn) is not cost_model.Recompute.CHEAP:
            moved = sum(aval_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "shape"))
            t = max(t, moved / self.device_bandwidth)
        return t


@dataclasses.dataclass(frozen=True)
class CheckedCosts:
    """A user's :class:`OpCosts` whose every answer is checked: a NaN, an infinity, a negative number or a
    non-number would order the knapsack arbitrarily, so it is refused with the eqn that got it."""

    inner: Any

    @property
    def note(self) -> str:
        return self.inner.note

    def prefetch(self, eqns: list) -> None:
        prefetch = getattr(self.inner, "prefetch", None)
        if prefetch is not None:
            prefetch(eqns)

    def seconds(self, eqn: Any) -> float:
        value = self.inner.seconds(eqn)
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = None
        if isinstance(value, bool) or seconds is None or not math.isfinite(seconds) or seconds < 0:
            raise PartitionError(f"op_costs {type(self.inner).__name__}.seconds returned {value!r} for the eqn "
                                 f"{eqn.primitive.name} ({_shapes(eqn)}): it must return a finite number of "
                                 f"seconds, 0 or more.")
        return seconds


def _shapes(eqn: Any) -> str:
    return ", ".join(str(v.aval.str_short()) for v in eqn.outvars if hasattr(v.aval, "str_short")) or "no outputs"
