"""``Residuals``: what ``AOTFunction.forward`` hands to ``AOTFunction.backward``."""

from __future__ import annotations

from typing import Any, Sequence

import jax

from jaxaot._src.partition import Residual


@jax.tree_util.register_pytree_node_class
class Residuals:
    """The saved values of one forward run, in the backward's order.

    A pytree (its leaves are the saved arrays) that remembers which training
    programs produced it, so ``backward`` can refuse residuals of another
    signature, another function, or programs since rebuilt.

    Attributes:
      arrays: the saved arrays.
      residuals: a :class:`~jaxaot.partition.Residual` per array (shape, dtype, bytes, producer).
      nbytes: their total bytes.
    """

    def __init__(self, arrays: Sequence[Any], training: Any, generation: int | None = None,
                 *, checked: bool = False):
        self.arrays = tuple(arrays)
        self.training = training
        self.generation = training.generation if generation is None else generation
        # Made by an eager forward itself: shapes are right and no array is a
        # tracer by construction, so backward skips both checks.
        self.checked = checked

    def tree_flatten(self):
        return self.arrays, (self.training, self.generation)

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        return cls(arrays, *aux)

    @property
    def residuals(self) -> tuple[Residual, ...]:
        return self.training.partition.residuals

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.residuals)

    def __repr__(self) -> str:
        return f"Residuals({len(self.arrays)} arrays, {self.nbytes} bytes)"
