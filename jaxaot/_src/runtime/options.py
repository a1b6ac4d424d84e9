"""What an :class:`~jaxaot.AOTFunction` was built with (:class:`Options`), its checks, and a program-pruning helper.

:func:`check_options` checks every option when it is given, so a wrong one
fails at ``aot_function(...)`` (and at ``aot_module(...)`` and ``pipeline(...)``,
which build them), naming the option, instead of at the first gradient.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot.errors import InvalidInputError
from jaxaot._src.compile import Compiler
from jaxaot._src.partition import Partitioner, as_partitioner
from jaxaot._src.runtime import shardings as S
from jaxaot._src.tracing import Decompositions


class Options:
    """What an :class:`~jaxaot.AOTFunction` was built with: its compilers, partitioner, decompositions."""

    def __init__(self, name: str, fw_compiler: Compiler, bw_compiler: Compiler, inference_compiler: Compiler,
                 partition_fn: Partitioner, decompositions: Decompositions | None,
                 out_shardings: Any = None, residual_sharding: str = "producer"):
        self.name = name
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler
        self.inference_compiler = inference_compiler
        self.partition_fn = partition_fn
        self.decompositions = decompositions
        self.out_shardings = out_shardings
        self.residual_sharding = S.check_policy(residual_sharding)


def check_options(*, fw_compiler: Any = None, bw_compiler: Any = None, inference_compiler: Any = None,
                  partition_fn: Any = None, decompositions: Any = None, out_shardings: Any = None,
                  residual_sharding: Any = "producer") -> Partitioner | None:
    """Raise :class:`~jaxaot.errors.InvalidInputError` (a wrong kind) or
    :class:`~jaxaot.errors.InvalidValueError` (a wrong value) naming the first bad option.

    None means the default for each, as in :func:`jaxaot.aot_function`. Returns ``partition_fn`` as
    :func:`~jaxaot._src.partition.as_partitioner` reads it (a configured min-cut's options, checked here
    once), or None without one.

    Example:
        >>> check_options(partition_fn="min_cut")
        Traceback (most recent call last):
        ...
        jaxaot.errors.InvalidInputError: partition_fn must be callable (a JointGraph -> Partition function), got str 'min_cut'.
    """
    for name, c, what in (("fw_compiler", fw_compiler, "a Compiler"), ("bw_compiler", bw_compiler, "a Compiler"),
                          ("inference_compiler", inference_compiler, "a Compiler"),
                          ("partition_fn", partition_fn, "a JointGraph -> Partition function")):
        if c is not None and not callable(c):
            raise InvalidInputError(f"{name} must be callable ({what}), got {type(c).__name__} {c!r}.")
    partitioner = None if partition_fn is None else as_partitioner(partition_fn)  # a min-cut's budget, now
    if decompositions is not None:
        if not isinstance(decompositions, Mapping):
            raise InvalidInputError(f"decompositions must be a dict {{primitive: python_fn}}, got "
                                    f"{type(decompositions).__name__}.")
        for prim, fn in decompositions.items():
            if not (hasattr(prim, "bind") and hasattr(prim, "name")):
                raise InvalidInputError(f"decompositions keys must be JAX primitives (jax.lax.sin_p, ...), got "
                                        f"{type(prim).__name__} {prim!r}.")
            if not callable(fn):
                raise InvalidInputError(f"decompositions[{prim}] must be a function of the primitive's operands, "
                                        f"got {type(fn).__name__}.")
    if out_shardings is not None:
        is_leaf = lambda x: x is None or isinstance(x, jax.sharding.Sharding)  # noqa: E731
        for leaf in jax.tree_util.tree_leaves(out_shardings, is_leaf=is_leaf):
            if not is_leaf(leaf):
                raise InvalidInputError(f"out_shardings must be a jax.sharding.Sharding or a pytree prefix of the "
                                        f"outputs holding Shardings or None, got a {type(leaf).__name__} in it.")
    if not isinstance(residual_sharding, str):
        raise InvalidInputError(f"residual_sharding must be a string, one of {S.RESIDUAL_SHARDING_POLICIES}, got "
                                f"{type(residual_sharding).__name__}.")
    S.check_policy(residual_sharding)
    return partitioner


def prune_outputs(closed: Any, keep: Sequence[int]) -> Any:
    """``closed`` returning only the outputs at ``keep``."""
    j = C.jaxpr_of(closed)
    return C.make_closed_jaxpr(j.constvars, j.invars, [j.outvars[i] for i in keep], j.eqns, C.consts_of(closed))
