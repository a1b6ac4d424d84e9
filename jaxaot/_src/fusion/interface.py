"""What the fused step reads of the runtime's programs: two protocols, so that ``fusion`` needs no ``runtime``.

The runtime's :class:`~jaxaot._src.runtime.SignaturePrograms` (one input signature)
and :class:`~jaxaot._src.runtime.TrainingPrograms` (one gradient mask of it) satisfy
these structurally; fusion sits below the runtime and never imports it. The
fused step reads the partition and the joint graph's output avals to build its
program, and compiles it through the signature's :meth:`ProgramsLike.compile`,
so the executable is cached and timed with the split ones.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from jaxaot._src.compile import Compiler
from jaxaot._src.partition import Partition


class ProgramsLike(Protocol):
    """One input signature's programs (the runtime's :class:`~jaxaot._src.runtime.SignaturePrograms`).

    Attributes:
      in_avals: the input leaves' ``ShapeDtypeStruct`` (shardings kept).
      computed_outputs: positions of the outputs the executables compute (the others are inputs).
      output_is_input: per output, the input leaf it returns unchanged, or None.
      executables: the compiled executables by name; the fused step stores its kept one here.
      fused_choices: per fused step's name, its :class:`~jaxaot._src.fusion.FusedChoice` (fused or split, and why).
      tunings: per fused step's name whose choice the calls that follow its first make, its
        :class:`~jaxaot._src.fusion.Tuning`.
    """

    in_avals: Sequence[Any]
    computed_outputs: Sequence[int]
    output_is_input: Sequence[int | None]
    executables: dict[str, Any]
    fused_choices: dict[str, Any]
    tunings: dict[str, Any]

    def compile(self, name: str, compiler: Compiler, closed: Any, avals: Sequence[Any],
                aliased: set = frozenset(), pending: Any = None) -> Any:
        """The executable ``name`` of ``closed``, compiled on first use (inputs in ``aliased`` not donated);
        ``pending``: that compile, begun by :meth:`start_compile` of the same arguments."""
        ...

    def start_compile(self, compiler: Compiler, closed: Any, avals: Sequence[Any],
                      aliased: set = frozenset()) -> Any:
        """A future of ``closed``'s compile, begun on a worker, or None where :meth:`compile` compiles it."""
        ...

    def splice(self, leaves: Sequence[Any], computed: Sequence[Any]) -> list:
        """The full outputs from the computed ones and the input ``leaves``."""
        ...


class StepOptions(Protocol):
    """The options the fused step reads: the partitioner (its default barrier) and the forward's compiler."""

    partition_fn: Callable[..., Partition]
    fw_compiler: Compiler


class GradPins(Protocol):
    """Where the gradients go: per differentiated input, the sharding it is pinned to (None: free)."""

    def grad_pins(self) -> list: ...


class TrainingLike(Protocol):
    """One gradient mask's programs (the runtime's :class:`~jaxaot._src.runtime.TrainingPrograms`).

    Attributes:
      programs: the signature's :class:`ProgramsLike`.
      options: :class:`StepOptions`.
      placement: :class:`GradPins`.
      name_suffix: what the mask adds to executable names (``""`` for the full mask).
      partition: the partition, built on first read.
      out_avals: the joint graph's outputs (read off the graph the partition was split from).
    """

    programs: ProgramsLike
    options: StepOptions
    placement: GradPins
    name_suffix: str

    @property
    def out_avals(self) -> tuple: ...

    @property
    def partition(self) -> Partition: ...
