"""``ResidualTable``: the saved values of a split, one labelled row each, for people to read.

Each row names its value the way a user wrote it: inputs by pytree path
(``arg[0]['w1']``), outputs by output path, and values the forward computes only
for the backward as ``temporary[k]``. Inputs are listed apart in the totals:
they are alive anyway, so they cost the forward nothing; ``added_bytes`` is what
the forward keeps alive beyond its inputs and outputs' own lifetimes. Values the
partition offloaded to host memory (:mod:`jaxaot._src.partition.offload`) are marked
``offloaded`` (the others ``saved``) and their bytes counted apart
(``offloaded_bytes``; ``device_bytes`` is what stays in device memory).

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum()).lower(jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> [(row.label, row.kind) for row in low.residuals][:2]
    [('arg[0]', 'input'), ('arg[1]', 'input')]
    >>> low.residuals.added_bytes == low.saved_bytes - low.residuals.input_bytes
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Sequence

from jaxaot._src import compat as C
from jaxaot._src import display as _display
from jaxaot._src.pytrees import dtype_name, leaf_paths_or_positions
from jaxaot._src.partition import Partition
from jaxaot._src.tracing import JointGraph


@dataclasses.dataclass(frozen=True)
class ResidualRow:
    """One saved value: its label, shape, dtype, bytes, where it comes from and who made it."""

    label: str
    kind: str  # "input", "output" or "temporary"
    shape: tuple
    dtype: str
    nbytes: int
    producer: str
    source_line: str
    sharding: str = ""  #: on a mesh, its ``PartitionSpec`` (empty when unsharded or not yet known)
    device_nbytes: int | None = None  #: on a mesh, the bytes one device holds (None when unsharded)
    offloaded: bool = False  #: in host memory between the forward and the backward

    @property
    def placement(self) -> str:
        """``"offloaded"`` (in host memory between the programs) or ``"saved"`` (in device memory)."""
        return "offloaded" if self.offloaded else "saved"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ResidualTable(Sequence[ResidualRow]):
    """The residuals of one split: a sequence of :class:`ResidualRow`.

    ``str()`` gives a text table, Jupyter shows it as HTML, :meth:`to_rows`
    gives plain dicts (for pandas, say). ``input_bytes`` are the saved inputs'
    bytes (alive anyway), ``added_bytes`` those the forward adds, ``nbytes``
    their sum (``Partition.saved_bytes``).
    """

    def __init__(self, rows: Sequence[ResidualRow], recomputed: Sequence[str] = (), offload_note: str = "",
                 cost_note: str = ""):
        self._rows = tuple(rows)
        self.recomputed = tuple(recomputed)
        self.offload_note = offload_note  #: why nothing was offloaded, when offloading was asked for
        self.cost_note = cost_note  #: what priced recomputation, when the plan traded bytes for it

    @classmethod
    def of(cls, partition: Partition, joint: JointGraph | None = None,
           shardings: Sequence[Any] | None = None) -> "ResidualTable":
        """The table of ``partition``; ``joint`` supplies the pytree paths of inputs and outputs.

        ``shardings``: on a mesh, per residual its ``jax.sharding.Sharding`` (None
        where not known yet: XLA chooses it when the forward compiles).
        """
        n_in = len(C.jaxpr_of(partition.forward).invars)
        in_names = leaf_paths_or_positions(joint.in_tree if joint is not None else None, "input", n_in)
        out_names = leaf_paths_or_positions(joint.out_tree if joint is not None else None, "output",
                                            partition.num_outputs)
        rows = []
        for r in partition.residuals:
            if r.source == "input":
                label = in_names[r.index]
            elif r.source == "output":
                label = out_names[r.index]
            else:
                label = f"temporary[{r.index - partition.num_outputs}]"
            spec, device_nbytes = _on_devices(r, None if shardings is None else shardings[len(rows)])
            rows.append(ResidualRow(label, r.source, tuple(r.aval.shape), dtype_name(r.aval.dtype), r.nbytes,
                                    r.producer, r.source_line, spec, device_nbytes, r.offloaded))
        return cls(rows, tuple(partition.recomputed), partition.offload_note, partition.cost_note)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        return self._rows[i]

    def __iter__(self) -> Iterator[ResidualRow]:
        return iter(self._rows)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._rows)

    @property
    def device_nbytes(self) -> int | None:
        """Bytes one device holds (on a mesh, once every residual's sharding is known), else None."""
        if any(r.device_nbytes is None for r in self._rows) or not self._rows:
            return None
        return sum(r.device_nbytes for r in self._rows)

    @property
    def input_bytes(self) -> int:
        return sum(r.nbytes for r in self._rows if r.kind == "input")

    @property
    def added_bytes(self) -> int:
        return self.nbytes - self.input_bytes

    @property
    def offloaded_bytes(self) -> int:
        """Bytes of the values offloaded to host memory."""
        return sum(r.nbytes for r in self._rows if r.offloaded)

    @property
    def device_bytes(self) -> int:
        """Bytes of the saved values that stay in device memory (``Partition.device_saved_bytes``)."""
        return self.nbytes - self.offloaded_bytes

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per row (``label``, ``kind``, ``shape``, ``dtype``, ``nbytes``, ``producer``, ``source_line``)."""
        return [r.as_dict() for r in self._rows]

    def _rows_text(self, indices: Sequence[int]) -> list[str]:
        """The header and the rows at ``indices`` (numbered as in the whole table), columns aligned."""
        sharded = any(r.sharding for r in self._rows)
        offloaded = self.offloaded_bytes > 0 or any(r.offloaded for r in self._rows)
        header = ("#", "value", "shape", "dtype", "bytes") + (("sharding", "per device") if sharded else ()) + (
            ("where",) if offloaded else ()) + ("producer", "line")
        cells = [header] + [
            (str(i), r.label, str(list(r.shape)), r.dtype, str(r.nbytes))
            + ((r.sharding or "at compile()", "?" if r.device_nbytes is None else str(r.device_nbytes))
               if sharded else ())
            + ((r.placement,) if offloaded else ())
            + (r.producer, r.source_line)
            for i, r in ((i, self._rows[i]) for i in indices)]
        widths = [max(len(row[c]) for row in cells) for c in range(len(header))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells]

    def notes(self) -> list[str]:
        """The partitioner's notes: why nothing was offloaded, what priced recomputation."""
        return [note for note in (self.offload_note, self.cost_note) if note]

    def largest(self, top: int = 5) -> list[str]:
        """The header and the ``top`` largest rows, those the forward adds first (inputs are alive anyway),
        in table order; empty for an empty table."""
        order = sorted(range(len(self._rows)), key=lambda i: (self._rows[i].kind == "input", -self._rows[i].nbytes, i))
        return self._rows_text(sorted(order[:top])) if self._rows else []

    def __str__(self) -> str:
        lines = self._rows_text(range(len(self._rows)))
        lines.append(f"{self.nbytes} bytes saved: {self.input_bytes} of inputs (alive anyway), "
                     f"{self.added_bytes} added by the forward")
        if any(r.sharding for r in self._rows) and self.device_nbytes is not None:
            lines.append(f"{self.device_nbytes} bytes per device")
        if self.offloaded_bytes > 0 or any(r.offloaded for r in self._rows):
            lines.append(f"{self.offloaded_bytes} bytes offloaded to host memory, {self.device_bytes} in device memory")
        return "\n".join(lines + self.notes())

    def __repr__(self) -> str:
        return f"ResidualTable({len(self)} values, {self.added_bytes} bytes added, {self.input_bytes} of inputs)"

    def _repr_html_(self) -> str | None:
        """Jupyter's view: the table as HTML, drawn by the renderer :mod:`jaxaot._src.viz` registers
        (:func:`jaxaot._src.viz.residual_table_html`; see :mod:`jaxaot._src.display`)."""
        return _display.render(_display.RESIDUAL_TABLE, self)


def _on_devices(residual: Any, sharding: Any) -> tuple[str, int | None]:
    """``(spec, bytes per device)`` of a residual with ``sharding`` (``("", None)`` when unknown)."""
    if sharding is None:
        return "", None
    shape = tuple(residual.aval.shape)
    local = sharding.shard_shape(shape)
    per_device = residual.nbytes // max(1, math.prod(shape)) * math.prod(local) if shape else residual.nbytes
    spec = getattr(sharding, "spec", None)
    return (str(spec) if spec is not None else str(sharding)), int(per_device)
