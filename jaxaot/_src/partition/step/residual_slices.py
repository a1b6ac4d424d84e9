"""Residuals the backward reads only through static slices pass the fused step's barrier as those slices.

An attention block's fused QKV projection is saved whole and split again in the
backward; inside one program the split fuses into its readers, so the whole buffer
stays alive until the last of them has run. :func:`slice_residual_reads` moves such
slicing eqns to the end of the forward, so each slice is a residual of its own,
freed after its last reader (``docs/concepts/fused_step.md``, "Sliced residuals").
The bytes saved are the same; the forward copies the slices once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxaot._src import compat as C

#: Primitives that cut static pieces out of one operand.
SLICING = frozenset({"split", "slice"})


@dataclasses.dataclass(frozen=True)
class SlicedBackward:
    """A backward whose sliced residuals are replaced by their slices.

    Attributes:
      backward: the closed jaxpr ``(cotangents..., residuals'...) -> grads``.
      slicers: for each original residual position, the slicing eqns that read it (empty when it
        passes whole); the residuals' of ``backward`` are, in order, each position's own value or
        the outputs of its slicers that the backward reads (an unread slice is not passed at all).
      read: for each position, whether the backward reads each output of its slicers.
    """

    backward: Any
    slicers: tuple[tuple[Any, ...], ...]
    read: tuple[tuple[bool, ...], ...]

    def expand(self, residuals: list) -> tuple[list, list[int]]:
        """``(residuals', owner)``: the residuals for :attr:`backward` and, for each, the position of
        the original residual it came from."""
        out: list = []
        owner: list[int] = []
        for i, (r, eqns, read) in enumerate(zip(residuals, self.slicers, self.read)):
            values = [x for e in eqns for x in C.bind_eqn(e, [r])]
            pieces = [x for x, keep in zip(values, read) if keep] if eqns else [r]
            out.extend(pieces)
            owner.extend([i] * len(pieces))
        return out, owner


def residual_readers(backward: Any, num_cotangents: int) -> list[list]:
    """Per residual input of ``backward`` (after the ``num_cotangents`` cotangents), the top-level
    eqns that read it, in order, and ``None`` where the backward also returns it."""
    jaxpr = C.jaxpr_of(backward)
    residuals = jaxpr.invars[num_cotangents:]
    readers: dict[int, list] = {id(v): [] for v in residuals}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not C.is_literal(v) and id(v) in readers:
                readers[id(v)].append(eqn)
    for v in jaxpr.outvars:
        if not C.is_literal(v) and id(v) in readers:
            readers[id(v)].append(None)
    return [readers[id(v)] for v in residuals]


def slice_residual_reads(backward: Any, num_cotangents: int, positions: set[int] | None = None) -> SlicedBackward:
    """``backward`` with every residual that only :data:`SLICING` eqns read (among ``positions``,
    default all) taken as those eqns' outputs instead (see the module docstring).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.partition.step import slice_residual_reads
        >>> def bwd(g, qkv):
        ...     q, k, v = jnp.split(qkv, 3, axis=-1)
        ...     return g * q + k, g * v
        >>> closed = jax.make_jaxpr(bwd)(jnp.ones((2, 4)), jnp.ones((2, 12)))
        >>> sliced = slice_residual_reads(closed, 1)
        >>> [v.aval.shape for v in sliced.backward.jaxpr.invars]
        [(2, 4), (2, 4), (2, 4), (2, 4)]
        >>> args, owner = sliced.expand([jnp.arange(24.0).reshape(2, 12)])
        >>> owner, [float(a[0, 0]) for a in args]
        ([0, 0, 0], [0.0, 4.0, 8.0])
    """
    jaxpr = C.jaxpr_of(backward)
    residuals = jaxpr.invars[num_cotangents:]
    outputs = {id(v) for v in jaxpr.outvars if not C.is_literal(v)}
    slicers: list[tuple] = []
    for i, eqns in enumerate(residual_readers(backward, num_cotangents)):
        ok = (positions is None or i in positions) and eqns and all(
            e is not None and e.primitive.name in SLICING and len(e.invars) == 1 for e in eqns)
        slicers.append(tuple(eqns) if ok else ())
    used = {id(v) for e in jaxpr.eqns for v in e.invars} | outputs
    read = tuple(tuple(id(o) in used and not C.is_drop_var(o) for e in eqns for o in e.outvars) for eqns in slicers)
    moved = {id(e) for eqns in slicers for e in eqns}
    if not moved:
        return SlicedBackward(backward, tuple(slicers), read)
    invars = list(jaxpr.invars[:num_cotangents])
    for v, eqns, keep in zip(residuals, slicers, read):
        invars.extend([o for o, k in zip((o for e in eqns for o in e.outvars), keep) if k] if eqns else [v])
    closed = C.make_closed_jaxpr(jaxpr.constvars, invars, jaxpr.outvars,
                                 [e for e in jaxpr.eqns if id(e) not in moved], C.consts_of(backward))
    return SlicedBackward(closed, tuple(slicers), read)
