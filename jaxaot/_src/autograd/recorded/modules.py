"""Flax nnx modules as arguments of :func:`~jaxaot.compiled_grad`, the way ``nnx.grad`` treats them.

Each module argument is split into its ``nnx.Param`` state (differentiated) and
the rest; the forward runs on a module merged back, and the rest it leaves
(batch statistics, RNG counters) comes back from the compiled step as concrete
arrays and is written into the caller's module. Flax is imported only once an
argument is seen to be an nnx module.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

import jax


def is_nnx_module(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.Module`` (without importing flax)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, nnx.Module)


@dataclasses.dataclass
class ModuleArg:
    """One module argument, split: ``graphdef``, the state differentiated (or None) and the rest."""

    module: Any
    graphdef: Any
    params: Any
    rest: Any

    def merge(self, params: Any) -> Any:
        """A fresh module built from the parts (``params`` replaces the differentiated state)."""
        from flax import nnx  # optional dependency, present whenever a module was passed

        # Rebuilt leaf by leaf so the Variables belong to the current (recording or vjp) trace: nnx refuses
        # to mutate a Variable created under another trace (batch statistics are mutated).
        parts = (self.rest,) if self.params is None else (params, self.rest)
        return nnx.merge(self.graphdef, *(jax.tree_util.tree_map(lambda x: x, p) for p in parts))

    def state_after(self, merged: Any) -> Any:
        """The non-differentiated state of ``merged`` after the forward ran."""
        from flax import nnx  # optional dependency

        if self.params is None:
            return nnx.state(merged)
        return nnx.state(merged, nnx.Not(nnx.Param))

    def write_back(self, rest: Any) -> None:
        """Update the caller's module with the state the forward left behind."""
        from flax import nnx  # optional dependency

        nnx.update(self.module, rest)


def split(module: Any, differentiated: bool) -> ModuleArg:
    """Split ``module`` as ``nnx.grad`` does: its ``nnx.Param`` state apart when ``differentiated``."""
    from flax import nnx  # optional dependency

    if differentiated:
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        return ModuleArg(module, graphdef, params, rest)
    graphdef, rest = nnx.split(module)
    return ModuleArg(module, graphdef, None, rest)


def split_args(args: Sequence[Any], nums: Sequence[int]) -> dict[int, ModuleArg]:
    """The module arguments among ``args``, by position (only positions holding a module)."""
    return {i: split(a, i in nums) for i, a in enumerate(args) if is_nnx_module(a)}
