"""What the pictures read from a lowered function: its partition, value names, recomputed eqns.

Accepts an :class:`jaxaot.AOTLowered`, anything holding one as ``.lowered``
(``aot_module``'s ``ModuleLowered``), or a bare :class:`jaxaot.partition.Partition`
(whose values then have positional names).

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum()).lower(jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> input_names(*unwrap(low)), input_names(low.partition, None)
    (['arg[0]', 'arg[1]'], ['input[0]', 'input[1]'])
"""

from __future__ import annotations

from typing import Any

from jaxaot._src import compat as C
from jaxaot._src.partition import Partition
from jaxaot._src.pytrees import leaf_paths_or_positions
from jaxaot._src.viz.argument_checks import describe, hint
from jaxaot.errors import InvalidInputError


def unwrap(lowered: Any, where: str = "") -> tuple[Any, Any]:
    """``(partition, joint or None)`` of an AOTLowered (or its AOTCompiled), a ModuleLowered or a bare Partition.

    Anything else is an :class:`~jaxaot.errors.InvalidInputError` naming what was passed (``where``: the
    public function that was given it), checked on the partition's type, so a ``str`` (whose ``partition``
    is a method) or an array fails here rather than deep in the drawing.
    """
    if isinstance(lowered, Partition):
        return lowered, None
    holder = lowered
    if not _partition_of(holder) and not isinstance(holder, (str, bytes)) and hasattr(holder, "lowered"):
        holder = holder.lowered  # aot_module's ModuleLowered
    if _partition_of(holder):
        return holder.partition, getattr(holder, "joint", None)
    raise InvalidInputError(
        f"{where + ': ' if where else ''}expected the AOTLowered of aot_fn.lower(...) (or its AOTCompiled, a "
        f"ModuleLowered or a Partition), got {describe(lowered)}{hint(lowered)}")


def _partition_of(value: Any) -> bool:
    return not isinstance(value, (str, bytes)) and isinstance(getattr(value, "partition", None), Partition)


def input_names(part: Any, joint: Any) -> list[str]:
    """Printable names of the primal inputs: ``arg[0]['w']``, or ``input[0]`` without a joint."""
    return leaf_paths_or_positions(joint.in_tree if joint is not None else None, "input",
                                   len(C.jaxpr_of(part.forward).invars))


def output_names(part: Any, joint: Any) -> list[str]:
    """Printable names of the primal outputs: ``output``, ``output[1]``, ..."""
    return leaf_paths_or_positions(joint.out_tree if joint is not None else None, "output", part.num_outputs)


def backward_is_cotangent_dependent(backward: Any, num_cotangents: int) -> list[bool]:
    """Per eqn of the backward program: does it depend on a cotangent?

    Those that do not are forward work the backward repeats (recomputation).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> part = jaxaot.partition.min_cut_rematerialization_partition(
        ...     jaxaot.partition.trace_joint(lambda x: jnp.sin(jnp.sin(x)).sum(), jnp.ones(3)))
        >>> backward_is_cotangent_dependent(part.backward, 1)
        [False, False, False, True, True, True]
    """
    jaxpr = C.jaxpr_of(backward)
    tainted = set(jaxpr.invars[:num_cotangents])
    out = []
    for eqn in jaxpr.eqns:
        dep = any(not C.is_literal(v) and v in tainted for v in eqn.invars)
        if dep:
            tainted.update(eqn.outvars)
        out.append(dep)
    return out
