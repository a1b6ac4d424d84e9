"""``AOTLowered``: everything jaxaot built for one input signature, for people to read.

``aot_fn.lower(...)`` returns one: the joint graph, the partition, the three
programs, every saved value with its shape, bytes, producer and source line,
the recomputed eqns, the time each stage took and the executables with the
backend's memory and cost analyses. ``str()`` prints the programs and the
residual table; in Jupyter it draws the split (:mod:`jaxaot.viz`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxaot.partition.split import Partition, Residual
from jaxaot.tracing.joint import JointGraph

@dataclasses.dataclass(frozen=True)
class AOTLowered:
    """Everything jaxaot built for one input signature (from ``aot_fn.lower``).

    Attributes:
      joint: the :class:`JointGraph`.
      partition: the :class:`Partition`.
      inference / forward / backward: closed jaxprs of the three programs.
      saved: the :class:`Residual` of each saved value (shape, dtype, bytes,
        producing eqn and source line).
      recomputed: forward eqns the backward recomputes.
      compile_times: seconds spent tracing, partitioning and compiling each.
      executables: the compiled executables by name.
    """

    joint: JointGraph
    partition: Partition
    inference: Any
    compile_times: Mapping[str, float]
    executables: Mapping[str, Any]

    @property
    def forward(self) -> Any:
        return self.partition.forward

    @property
    def backward(self) -> Any:
        return self.partition.backward

    @property
    def saved(self) -> tuple[Residual, ...]:
        return self.partition.residuals

    @property
    def saved_bytes(self) -> int:
        return self.partition.saved_bytes

    @property
    def recomputed(self) -> tuple[str, ...]:
        return tuple(self.partition.recomputed)

    def memory_analysis(self) -> dict[str, Any]:
        """Per executable, the backend's memory analysis (None where unavailable).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> sorted(low.memory_analysis())
            ['backward', 'forward', 'inference']
        """
        return {k: _safe(lambda e=e: e.memory_analysis()) for k, e in self.executables.items()}

    def cost_analysis(self) -> dict[str, Any]:
        """Per executable, the backend's cost analysis (None where unavailable).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> sorted(low.cost_analysis())
            ['backward', 'forward', 'inference']
        """
        return {k: _safe(lambda e=e: e.cost_analysis()) for k, e in self.executables.items()}

    def residual_table(self) -> str:
        """The saved values as a text table: source, shape, dtype, bytes, producer, line.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> print(low.residual_table().splitlines()[1].split()[:5])
            ['0', 'temporary[1]', '[3]', 'float32', '12']
        """
        rows = [("#", "source", "shape", "dtype", "bytes", "producer", "line")]
        for i, r in enumerate(self.saved):
            rows.append((str(i), f"{r.source}[{r.index}]", str(list(r.aval.shape)), str(r.aval.dtype),
                         str(r.nbytes), r.producer, r.source_line))
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

    def __str__(self) -> str:
        times = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.compile_times.items())
        parts = [
            f"== forward: {len(self.partition.residuals)} residuals, {self.saved_bytes} bytes saved ==",
            str(self.forward),
            "== backward ==",
            str(self.backward),
            "== residuals ==",
            self.residual_table(),
        ]
        if self.recomputed:
            parts += ["== recomputed in backward ==", *self.recomputed]
        parts.append(f"== times: {times} ==")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        """Jupyter's view: the split as a graph plus the residual table (:func:`jaxaot.viz.to_html`)."""
        # Deferred: jaxaot.viz sits above the runtime (it draws this object) and
        # pulls in the optional graphviz/matplotlib; it loads only when displayed.
        from jaxaot import viz

        return viz.to_html(self)


def _safe(f: Callable[[], Any]) -> Any:
    try:
        return f()
    except Exception:  # backends without analyses raise various errors
        return None
