"""An ``aot_function``'s traced stage, as ``jax.jit(f).trace(...)`` gives one: the function's jaxpr for one
signature, before the joint is built and partitioned; :meth:`AOTTraced.lower` partitions it."""

from __future__ import annotations

from typing import Any, Callable

from jaxaot._src.runtime import stage_types
from jaxaot._src.runtime.lowered import AOTLowered


class AOTTraced:
    """One signature of an ``aot_function``, traced (from ``aot_fn.trace``): nothing partitioned or compiled.

    Attributes:
      jaxpr: the function's closed jaxpr, of the flat dynamic inputs (as ``jax.jit(f).trace(...).jaxpr``).
      fun_name: the function's name.
      in_tree / args_info / out_info / out_tree: as :class:`~jaxaot.AOTLowered`'s (and ``jax.stages.Traced``'s).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> traced = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).trace(jnp.ones(3))
        >>> [str(e.primitive) for e in traced.jaxpr.eqns]
        ['sin', 'reduce_sum']
        >>> traced.lower().saved_bytes
        12
    """

    def __init__(self, programs: Any, lowered: Callable[[Any], AOTLowered], fun_name: str) -> None:
        self._programs = programs
        self._lowered = lowered  # the AOTLowered of a partitioned signature (AOTFunction.lowered)
        self.fun_name = fun_name

    @property
    def jaxpr(self) -> Any:
        return self._programs.primal

    @property
    def in_tree(self) -> Any:
        return self._programs.signature.treedef

    @property
    def args_info(self) -> Any:
        return stage_types.args_info(self._programs)

    @property
    def out_info(self) -> Any:
        return stage_types.out_info(self._programs, None)

    @property
    def out_tree(self) -> Any:
        return self._programs.out_tree

    def lower(self) -> AOTLowered:
        """Build the joint and partition it (nothing compiles), as ``aot_fn.lower`` does for these arguments."""
        return self._lowered(self._programs.staged_training())

    def __repr__(self) -> str:
        return f"<AOTTraced {self.fun_name}: {len(self.jaxpr.eqns)} equations>"
