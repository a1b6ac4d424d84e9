"""Records: the leaves of every stage's values in buffers of one shape on every device.

Inside ``shard_map`` every device runs the same program, so a buffer that
holds "this device's stage's residuals" must have one shape on all devices,
although stages differ (an embedding first, a head last). A :class:`Layout`
is the union of the stages' leaves, grouped by ``(shape, dtype)``:

* an **entry** per distinct ``(shape, dtype)``, with a **width**: the most
  leaves of that type one record holds;
* per stage, each leaf's **place** ``(entry, index)`` in the record.

A record is then a tuple of arrays, one per entry, of shape
``(width, *shape)``; a buffer of ``n`` records is one array per entry of shape
``(n, width, *shape)``, written and read at a run-time slot with
``dynamic_update_slice`` / ``dynamic_slice`` (in place inside the loop).

Stages that share a record (the stages one device hosts, for its parameters)
take consecutive indices in an entry (``group`` below); stages whose records
are separate (one microbatch's residuals) start at index 0 each. Identical
stages cost nothing extra; a leaf type only one stage has is still allocated
on every device (the price of one program for all).

Costs: building a layout is ``O(leaves)`` on the host; reading or writing a
record is one slice per leaf.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Key = tuple[tuple[int, ...], Any]  # (shape, dtype)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stage's leaves live in a record.

    Attributes:
      entries: ``(shape, dtype)`` of each entry, in first-seen order.
      widths: the number of leaves each entry's record holds.
      places: per stage, per leaf, its ``(entry, index)``.
      specs: per entry, how its leaves are sharded over the mesh's automatic axes (a
        ``PartitionSpec`` of the leaf's own dimensions; ``None``: replicated). Leaves that
        differ only in this take different entries.
    """

    entries: tuple[Key, ...]
    widths: tuple[int, ...]
    places: tuple[tuple[tuple[int, int], ...], ...]
    specs: tuple = ()

    @property
    def nbytes(self) -> int:
        """Bytes of one record."""
        return sum(w * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                   for (shape, dtype), w in zip(self.entries, self.widths))

    def record_avals(self, slots: int | None = None) -> list[jax.ShapeDtypeStruct]:
        """The record's arrays (``slots`` given: a buffer of that many records)."""
        lead = () if slots is None else (slots,)
        return [jax.ShapeDtypeStruct(lead + (w,) + shape, dtype) for (shape, dtype), w in zip(self.entries, self.widths)]

    def zeros(self, slots: int | None = None) -> list[jax.Array]:
        return [jnp.zeros(a.shape, a.dtype) for a in self.record_avals(slots)]

    # -- records
    def pack(self, stage: int, leaves: Sequence[Any]) -> list[jax.Array]:
        """A record holding ``leaves`` (stage ``stage``'s), zeros elsewhere."""
        cells: list[list[Any]] = [[None] * w for w in self.widths]
        for (e, j), x in zip(self.places[stage], leaves):
            cells[e][j] = x
        out = []
        for (shape, dtype), row in zip(self.entries, cells):
            row = [jnp.zeros(shape, dtype) if x is None else jnp.asarray(x, dtype) for x in row]
            out.append(jnp.stack(row) if row else jnp.zeros((0,) + shape, dtype))
        return out

    def unpack(self, stage: int, record: Sequence[jax.Array]) -> list[jax.Array]:
        """Stage ``stage``'s leaves from a record."""
        return [record[e][j] for e, j in self.places[stage]]

    # -- buffers of records
    def read(self, stage: int, buffers: Sequence[jax.Array], slot: Any) -> list[jax.Array]:
        """Stage ``stage``'s leaves from the record at ``slot`` of ``buffers``."""
        return [jax.lax.dynamic_index_in_dim(buffers[e], slot, 0, keepdims=False)[j] for e, j in self.places[stage]]

    def write(self, stage: int, buffers: Sequence[jax.Array], slot: Any, leaves: Sequence[Any]) -> list[jax.Array]:
        """``buffers`` with stage ``stage``'s ``leaves`` written into the record at ``slot``."""
        out = list(buffers)
        for (e, j), x in zip(self.places[stage], leaves):
            out[e] = out[e].at[slot, j].set(jnp.asarray(x, out[e].dtype))
        return out

    def store(self, buffers: Sequence[jax.Array], slot: Any, record: Sequence[jax.Array]) -> list[jax.Array]:
        """``buffers`` with a whole record written at ``slot``."""
        return [jax.lax.dynamic_update_index_in_dim(b, r, slot, 0) for b, r in zip(buffers, record)]

    def fetch(self, buffers: Sequence[jax.Array], slot: Any) -> list[jax.Array]:
        """The whole record at ``slot``."""
        return [jax.lax.dynamic_index_in_dim(b, slot, 0, keepdims=False) for b in buffers]


def union(per_stage: Sequence[Sequence[Any]], groups: Sequence[Sequence[int]] | None = None,
          specs: Sequence[Sequence[Any]] | None = None) -> Layout:
    """The layout of ``per_stage`` leaf types (anything with ``shape`` and ``dtype``).

    ``groups`` lists the stages that share one record (their leaves take
    consecutive indices, in stage order); by default every stage has its own.
    ``specs`` gives, per stage and leaf, its sharding over the automatic mesh axes (None: replicated).
    """
    groups = [[s] for s in range(len(per_stage))] if groups is None else groups
    index: dict[Any, int] = {}
    widths: list[int] = []
    places: list[list[tuple[int, int]]] = [[] for _ in per_stage]
    for group in groups:
        used: dict[int, int] = {}
        for s in group:
            for i, leaf in enumerate(per_stage[s]):
                spec = None if specs is None else _canonical(specs[s][i])
                key = (tuple(leaf.shape), np.dtype(leaf.dtype), spec)
                e = index.setdefault(key, len(index))
                if e == len(widths):
                    widths.append(0)
                j = used.get(e, 0)
                used[e] = j + 1
                widths[e] = max(widths[e], j + 1)
                places[s].append((e, j))
    keys = list(index)
    return Layout(tuple(k[:2] for k in keys), tuple(widths), tuple(tuple(p) for p in places),
                  tuple(k[2] for k in keys))


def _canonical(spec: Any) -> Any:
    """A ``PartitionSpec`` without trailing Nones, or None when it shards nothing."""
    if spec is None:
        return None
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return jax.sharding.PartitionSpec(*parts) if parts else None
