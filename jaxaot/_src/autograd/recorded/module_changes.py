"""What a recorded forward changed in a Flax module argument beyond its Variables' values (imports Flax).

Loaded by :mod:`.modules` once a module argument is seen: the check is the Flax front-end's
(:func:`~jaxaot._src.nn.check_unchanged`), refusing what the write-back would drop.
"""

from __future__ import annotations

from typing import Any

from jaxaot._src.nn import check_unchanged, layout

__all__ = ["check_unchanged", "layout"]


def check(merged: Any, before: dict, name: str) -> None:
    """Raise where the forward ``name`` changed ``merged`` beyond what its :func:`layout` ``before`` allows."""
    check_unchanged(merged, before, loss=name, writer="compiled_value_and_grad")
