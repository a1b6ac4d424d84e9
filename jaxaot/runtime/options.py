"""What an :class:`~jaxaot.AOTFunction` was built with (:class:`Options`), and a program-pruning helper."""

from __future__ import annotations

from typing import Any, Sequence

from jaxaot import _compat as C
from jaxaot.compile import Compiler
from jaxaot.partition import Partitioner
from jaxaot.runtime import shardings as S
from jaxaot.tracing import Decompositions


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


def prune_outputs(closed: Any, keep: Sequence[int]) -> Any:
    """``closed`` returning only the outputs at ``keep``."""
    j = C.jaxpr_of(closed)
    return C.make_closed_jaxpr(j.constvars, j.invars, [j.outvars[i] for i in keep], j.eqns, C.consts_of(closed))
