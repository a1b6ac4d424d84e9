"""A fused step's choice recalled from the persistent cache, and kept there once made.

Where the runtime weighs variants or times fused against split
(:func:`~jaxaot._src.partition.layout_choice_platforms`,
:data:`~jaxaot._src.fusion.step_choice.TIME_CHOICE_PLATFORMS`), a process with
``jaxaot.config.cache_dir`` keeps what its first call chose: the variant kept and
whether the fused or the split step runs. A later process of the same program on the
same kind of machine (both in the key, :func:`~jaxaot._src.compile.recall_choice`)
compiles, or loads, that variant alone and runs what the first process ran, without
weighing or timing again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxaot._src.compile import keeps_choices, recall_choice, remember_choice
from jaxaot._src.fusion.interface import TrainingLike
from jaxaot._src.fusion.prefetch import Variant
from jaxaot._src.fusion.variants import base_variant, fused_name, variant_program
from jaxaot._src.partition import program_platform
from jaxaot._src.partition.step import BARRIERS, LAYOUTS, ORDERS

_RUNS = ("fused", "split")


class Recalled(NamedTuple):
    """A choice a process made: the variant it kept, and which step runs and why."""

    variant: Variant
    runs: str
    why: str


def _keyed(training: TrainingLike, value_leaf: int, platforms: frozenset) -> Any:
    """The step's base program (the key's), where choices are made on its platform and a cache is set; else None."""
    p = training.programs
    if not keeps_choices() or program_platform(p.in_avals) not in platforms:
        return None
    return variant_program(training, value_leaf, base_variant(training))


def recall(training: TrainingLike, value_leaf: int, platforms: frozenset) -> tuple[Recalled | None, Any]:
    """``(the choice kept for this step, its base program)``: each None where there is none (no cache, a platform
    that makes no choice, no record, or one this version does not read)."""
    program = _keyed(training, value_leaf, platforms)
    if program is None:
        return None, None
    record = recall_choice(training.options.fw_compiler, program, training.programs.in_avals,
                           fused_name(training, value_leaf))
    recalled = _parsed(record)
    if recalled is not None and not all(0 <= k < len(training.partition.residuals) for k in recalled.variant.rederived):
        recalled = None  # names residuals this plan does not have
    return recalled, program


def remember(training: TrainingLike, value_leaf: int, program: Any, exe: Any, runs: str, why: str) -> None:
    """Keep the choice made for this step (``exe``: the fused executable kept, whose ``variant`` it names)."""
    v = getattr(exe, "variant", None)
    if program is None or v is None or runs not in _RUNS:
        return
    record = {"variant": {"barrier": v.barrier, "layouts": v.layouts, "order": v.order,
                          "rederived": list(v.rederived), "slices": v.slices}, "runs": runs, "why": why}
    remember_choice(training.options.fw_compiler, program, training.programs.in_avals,
                    fused_name(training, value_leaf), record)


def _parsed(record: dict | None) -> Recalled | None:
    """The record as a :class:`Recalled`, or None where a field is missing or of another kind."""
    try:
        v, runs, why = record["variant"], record["runs"], record["why"]
        variant = Variant(v["barrier"], v["layouts"], v["order"], tuple(int(k) for k in v["rederived"]),
                          bool(v["slices"]))
    except (TypeError, KeyError, ValueError):
        return None
    ok = (variant.barrier in BARRIERS and variant.layouts in LAYOUTS and variant.order in ORDERS
          and runs in _RUNS and isinstance(why, str))
    return Recalled(variant, runs, why) if ok else None
