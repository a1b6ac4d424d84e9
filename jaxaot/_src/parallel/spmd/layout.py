"""Records: every stage's leaves in buffers of one shape on every device, sized by the largest stage.

Inside ``shard_map`` a buffer must have one shape on all devices although stages
differ. A :class:`Layout` packs each stage's leaves into entries: flat entries, one
per dtype, where every stage starts at cell 0 (a record is as large as the largest
stage, not the sum), and stacked entries of whole leaves for parameters sharded
over automatic axes. A pass reads and writes just its own leaves in place
(:meth:`Layout.read`, :meth:`Layout.write`): no whole record is copied. A PRNG key
leaf's cells hold its key data (``jax.random.key_data``), wrapped back as it is read.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

#: Where a flat entry's leaves start: a multiple of this many bytes (aligned, vectorised slices).
ALIGN_BYTES = 128


class Place(NamedTuple):
    """A leaf's cells: ``count`` cells of entry ``entry`` from ``start``; ``shape``: what the cells hold (the
    leaf's own shape; a key's data's). ``key``: a PRNG key leaf's dtype (None otherwise); ``weak``: the leaf's
    weak type."""

    entry: int
    start: int
    count: int
    shape: tuple
    key: Any = None
    weak: bool = False

    def cells(self, x: Any) -> Any:
        """The leaf ``x`` as its cells hold it (a key's data)."""
        return x if self.key is None else jax.random.key_data(x)

    def leaf(self, data: Any) -> Any:
        """The leaf from what its cells hold (``data`` of ``shape``)."""
        return data if self.key is None else jax.random.wrap_key_data(data, impl=key_impl(self.key))

    def aval(self, dtype: Any) -> jax.ShapeDtypeStruct:
        """The leaf's type, its cells being of ``dtype``."""
        if self.key is not None:
            return jax.eval_shape(self.leaf, jax.ShapeDtypeStruct(self.shape, dtype))
        return jax.ShapeDtypeStruct(self.shape, dtype, weak_type=self.weak)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stage's leaves live in a record.

    Attributes:
      entries: ``(cell shape, dtype)`` of each entry (a flat entry's cell shape is ``()``).
      widths: the number of cells each entry's record holds.
      places: per stage, per leaf, its :class:`Place`.
      specs: per entry, how its cells are sharded over the mesh's automatic axes (a ``PartitionSpec`` of
        the cell's dimensions; ``None``: replicated). Only stacked entries are sharded.
    """

    entries: tuple
    widths: tuple[int, ...]
    places: tuple[tuple[Place, ...], ...]
    specs: tuple = ()

    @property
    def nbytes(self) -> int:
        """Bytes of one record."""
        return sum(w * _size(shape) * np.dtype(dtype).itemsize for (shape, dtype), w in zip(self.entries, self.widths))

    def stage_nbytes(self, stage: int) -> int:
        """Bytes of ``stage``'s own leaves."""
        return sum(_size(p.shape) * np.dtype(self.entries[p.entry][1]).itemsize for p in self.places[stage])

    def leaf_avals(self, stage: int) -> list[jax.ShapeDtypeStruct]:
        return [p.aval(self.entries[p.entry][1]) for p in self.places[stage]]

    def record_avals(self, slots: int | None = None) -> list[jax.ShapeDtypeStruct]:
        """The record's arrays (``slots`` given: a buffer of that many records)."""
        lead = () if slots is None else (slots,)
        return [jax.ShapeDtypeStruct(lead + (w,) + tuple(shape), dtype)
                for (shape, dtype), w in zip(self.entries, self.widths)]

    def zeros(self, slots: int | None = None) -> list[jax.Array]:
        return [jnp.zeros(a.shape, a.dtype) for a in self.record_avals(slots)]

    def empty(self, slots: int | None = None) -> list[jax.Array]:
        """Buffers whose contents are never read before they are written: ``jax.lax.empty`` leaves them
        uninitialized where the backend can (GPU, TPU; zeros on the CPU), so a step does not fill them."""
        empty = getattr(jax.lax, "empty", jnp.zeros)
        return [empty(a.shape, a.dtype) for a in self.record_avals(slots)]

    # -- leaves in records and buffers; ``slot`` None: ``buffers`` is one record. ``pin(cells, spec) -> cells``
    # places a leaf's cells as its entry's spec says (None: replicated) as they leave or enter a record.
    def read(self, stage: int, buffers: Sequence[jax.Array], slot: Any = None, pin: Any = None) -> list[jax.Array]:
        """Stage ``stage``'s leaves from the record at ``slot`` of ``buffers``."""
        return [self._read(buffers[p.entry], p, slot, pin) for p in self.places[stage]]

    def write(self, stage: int, buffers: Sequence[jax.Array], leaves: Sequence[Any], slot: Any = None,
              only: Sequence[bool] | None = None, pin: Any = None) -> list[jax.Array]:
        """``buffers`` with stage ``stage``'s ``leaves`` written into the record at ``slot`` (a leaf that is
        None, or not in ``only``, is left as it is)."""
        out = list(buffers)
        for i, (p, x) in enumerate(zip(self.places[stage], leaves)):
            if x is not None and (only is None or only[i]):
                out[p.entry] = self._write(out[p.entry], p, slot, x, pin)
        return out

    def add(self, stage: int, buffers: Sequence[jax.Array], leaves: Sequence[Any], pin: Any = None) -> list[jax.Array]:
        """``buffers`` (one record) with stage ``stage``'s ``leaves`` added to its own (None: nothing added)."""
        out = list(buffers)
        for p, x in zip(self.places[stage], leaves):
            if x is not None:
                out[p.entry] = self._write(out[p.entry], p, None, self._read(out[p.entry], p, None, pin) + x, pin)
        return out

    def _spec(self, p: Place) -> Any:
        return self.specs[p.entry] if self.specs else None

    def _read(self, buf: jax.Array, p: Place, slot: Any, pin: Any = None) -> jax.Array:
        if slot is None:
            cells = jax.lax.slice_in_dim(buf, p.start, p.start + p.count, axis=0).reshape(p.shape)
        else:
            cell = buf.shape[2:]
            piece = jax.lax.dynamic_slice(buf, _indices(slot, p.start, len(cell)), (1, p.count) + cell)
            cells = piece.reshape(p.shape)
        return p.leaf(cells if pin is None else pin(cells, self._spec(p)))

    def _write(self, buf: jax.Array, p: Place, slot: Any, x: Any, pin: Any = None) -> jax.Array:
        cell = buf.shape[2:] if slot is not None else buf.shape[1:]
        x = jnp.asarray(p.cells(x), buf.dtype)
        x = (x if pin is None else pin(x, self._spec(p))).reshape((p.count,) + cell)
        if slot is None:
            return jax.lax.dynamic_update_slice(buf, x, (p.start,) + (0,) * len(cell))
        return jax.lax.dynamic_update_slice(buf, x[None], _indices(slot, p.start, len(cell)))


def _indices(slot: Any, start: int, rest: int) -> tuple:
    """``(slot, start, 0, ...)`` as int32 scalars: one integer type for ``dynamic_slice``, with or without
    ``jax_enable_x64`` (the tick table's slots are int32, Python ints follow the x64 flag)."""
    return tuple(jax.lax.convert_element_type(i, np.int32) for i in (slot, start) + (0,) * rest)


def is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a PRNG key's (``jax.random.key``)."""
    return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))


@functools.lru_cache(maxsize=None)
def key_impl(dtype: Any) -> Any:
    """The PRNG implementation of key dtype ``dtype`` (for ``jax.random.wrap_key_data``)."""
    found: list = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), jax.ShapeDtypeStruct((), dtype))
    return found[0]


def build(per_stage: Sequence[Sequence[Any]], groups: Sequence[Sequence[int]] | None = None,
          specs: Sequence[Sequence[Any]] | None = None) -> Layout:
    """The layout of ``per_stage`` leaf types (anything with ``shape`` and ``dtype``).

    ``groups`` lists the stages that share one record (their leaves take consecutive cells, in stage
    order); by default every stage has its own. ``specs`` gives, per stage and leaf, its sharding over
    the automatic mesh axes (None: replicated): a sharded leaf takes a stacked entry, the rest flat ones.
    """
    groups = [[s] for s in range(len(per_stage))] if groups is None else groups
    index: dict[Any, int] = {}
    keys: list[tuple] = []
    widths: list[int] = []
    places: list[list[Place | None]] = [[None] * len(leaves) for leaves in per_stage]
    for group in groups:
        used: dict[int, int] = {}
        for s in group:
            for i, leaf in enumerate(per_stage[s]):
                spec = None if specs is None else _canonical(specs[s][i])
                key_dtype = leaf.dtype if is_key(leaf.dtype) else None
                cells = leaf if key_dtype is None else jax.eval_shape(jax.random.key_data, leaf)
                dtype, shape = np.dtype(cells.dtype), tuple(cells.shape)
                key = (dtype, None) if spec is None else (dtype, (shape, spec))
                e = index.setdefault(key, len(index))
                if e == len(widths):
                    keys.append(key)
                    widths.append(0)
                if spec is None:
                    start, count = _aligned(used.get(e, 0), dtype), _size(shape)
                else:
                    start, count = used.get(e, 0), 1
                used[e] = start + count
                widths[e] = max(widths[e], used[e])
                places[s][i] = Place(e, start, count, shape, key_dtype, bool(getattr(leaf, "weak_type", False)))
    entries = tuple(((), dtype) if rest is None else (rest[0], dtype) for dtype, rest in keys)
    widths = [_aligned(w, dtype) if rest is None else w for w, (dtype, rest) in zip(widths, keys)]
    return Layout(entries, tuple(widths), tuple(tuple(p) for p in places),
                  tuple(None if rest is None else rest[1] for _, rest in keys))


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _aligned(n: int, dtype: Any) -> int:
    step = max(1, ALIGN_BYTES // np.dtype(dtype).itemsize)
    return -(-n // step) * step


def _canonical(spec: Any) -> Any:
    """A ``PartitionSpec`` without trailing Nones, or None when it shards nothing."""
    if spec is None:
        return None
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return jax.sharding.PartitionSpec(*parts) if parts else None
