"""What the min-cut's plans of one joint graph at several fractions share, built once.

A byte budget's search (:mod:`jaxaot._src.partition.budget.search`) plans one joint
graph at a dozen fractions. Most of a plan's work does not depend on the
fraction: the flow network of the joint graph's forward (and of each scan
body's), the joint graph of each ``lax.scan`` body, and the joint graph
replayed with a scan plan that several fractions share. A :class:`PlanMemo`
keeps them for the search: each entry is keyed by the object it was made from
(held, so its ``id`` stays its own) and a hashable detail (a family, a plan's
JSON). Without a memo every call builds afresh (a single fraction's plan).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")


class PlanMemo:
    """``get(kind, owner, detail, make)``: ``make()`` once per ``(kind, owner, detail)``."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, Any]] = {}

    def get(self, kind: str, owner: Any, detail: Hashable, make: Callable[[], T]) -> T:
        key = (kind, id(owner), detail)
        hit = self._entries.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        value = make()
        self._entries[key] = (owner, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)


def memoized(memo: PlanMemo | None, kind: str, owner: Any, detail: Hashable, make: Callable[[], T]) -> T:
    """``memo.get(...)``, or ``make()`` without a memo."""
    return make() if memo is None else memo.get(kind, owner, detail, make)
