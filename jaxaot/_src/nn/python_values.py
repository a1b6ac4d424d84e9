"""Python values beside a module's arrays: plain attributes in its ``GraphDef``, and a loss's untraced ``aux``.

A module's plain dict or list attribute (a config) is a static value of Flax's ``GraphDef``, which then has no
hash; the compile cache keys on one. :func:`detached_graphdef` copies such values, so that a later change to
the module's own dict cannot reach a key the cache holds, and :func:`graph_hash` hashes them by content.

A loss's ``aux`` may hold values the loss returns without tracing (a step number, a phase name, NumPy values):
:func:`kept_aux` keeps them out of the loss program's outputs, as :class:`Kept` nodes of the output tree that
give the value back whenever the outputs are rebuilt, as ``nnx.value_and_grad`` returns them.

Example:
    >>> import jax, numpy as np
    >>> tree = jax.tree_util.tree_structure({"lr": Kept(0.5), "phase": Kept("train"), "y": 1.0})
    >>> tree.num_leaves, jax.tree_util.tree_unflatten(tree, [np.float32(2.0)])
    (1, {'lr': 0.5, 'phase': 'train', 'y': np.float32(2.0)})
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax
import numpy as np

from jaxaot._src import compat as C

_MAX_DEPTH = 32  #: past this depth :func:`graph_hash` hashes a value by its type (equal values still hash equal)


def hashable(value: Any) -> bool:
    """Whether ``hash(value)`` succeeds."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def detached_graphdef(graphdef: Any) -> Any:
    """``graphdef`` with each unhashable static attribute value (a dict, a list) replaced by a deep copy of it.

    The copy is what the programs traced for this graphdef see, and what the compile cache's key holds: the
    module's own dict, changed in place later, is then never the one a cached key compares with.
    """
    attributes = getattr(graphdef, "attributes", None)
    if attributes is None:
        return graphdef
    detached, changed = [], False
    for key, attr in attributes:
        if dataclasses.is_dataclass(attr) and hasattr(attr, "value") and not hashable(attr.value):
            try:
                attr = dataclasses.replace(attr, value=copy.deepcopy(attr.value))
                changed = True
            except Exception:  # an object that refuses a copy is kept as it is
                pass
        detached.append((key, attr))
    return dataclasses.replace(graphdef, attributes=detached) if changed else graphdef


def graph_hash(value: Any, depth: int = 0) -> int:
    """``hash(value)``, or, for a value holding unhashable parts, a hash of its contents consistent with ``==``:
    dicts, lists and sets by their items, dataclasses (Flax's ``GraphDef`` and its parts) by their compared fields,
    other objects by their type."""
    try:
        return hash(value)
    except TypeError:
        pass
    if depth >= _MAX_DEPTH:
        return hash(type(value))
    depth += 1
    if isinstance(value, dict):
        return hash(("dict", frozenset((graph_hash(k, depth), graph_hash(v, depth)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return hash(("sequence", tuple(graph_hash(v, depth) for v in value)))
    if isinstance(value, (set, frozenset)):
        return hash(("set", frozenset(graph_hash(v, depth) for v in value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return hash((type(value), tuple(graph_hash(getattr(value, f.name), depth)
                                        for f in dataclasses.fields(value) if f.compare)))
    return hash(type(value))


def static_attributes(module: Any) -> dict[str, Any] | None:
    """A module's plain (static) attribute values by path (``cfg``, ``block.rate``, ``layers[0].act``): an nnx
    ``GraphDef``'s static attributes, or a Linen module's fields; None where the module is neither (or its
    ``GraphDef`` is laid out in a way this walk does not read). Flax's own bookkeeping attributes are left out."""
    if dataclasses.is_dataclass(module) and not hasattr(module, "nodes"):  # a Linen module: its fields
        return {f.name: getattr(module, f.name, None) for f in dataclasses.fields(module)
                if f.compare and f.name not in ("parent", "name")}
    nodes, attributes = getattr(module, "nodes", None), getattr(module, "attributes", None)
    if nodes is None or attributes is None:
        return None
    nodes, attributes, out = iter(nodes), iter(attributes), {}

    def visit(node: Any, prefix: str) -> None:  # pre-order: a node attribute's own attributes follow it
        for _ in range(getattr(node, "num_attributes", None) or 0):
            key, attr = next(attributes)
            path = f"{prefix}[{key}]" if isinstance(key, int) else f"{prefix}.{key}" if prefix else str(key)
            if type(attr).__name__ == "NodeAttr":
                visit(next(nodes), path)
            elif hasattr(attr, "value") and not str(key).startswith("_pytree__"):
                out[path] = attr.value

    try:
        visit(next(nodes), "")
    except (StopIteration, TypeError):
        return None
    return out


def attribute_changes(old: Any, new: Any, limit: int = 3) -> str | None:
    """The module attributes that differ between two modules (nnx ``GraphDef``s or Linen modules), as
    ``module attribute `cfg`: {'scale': 2.0} → {'scale': 3.0}``; None where none is found."""
    a, b = static_attributes(old), static_attributes(new)
    if a is None or b is None:
        return None
    changed = [k for k in a.keys() & b.keys() if not same_value(a[k], b[k])]
    changed = sorted(changed, key=list(b).index)
    parts = [f"module attribute `{k}`: {_short(a[k])} → {_short(b[k])}" for k in changed[:limit]]
    parts += [f"module attribute `{k}` is new" for k in b.keys() - a.keys()][: max(limit - len(parts), 0)]
    parts += [f"module attribute `{k}` is gone" for k in a.keys() - b.keys()][: max(limit - len(parts), 0)]
    more = len(changed) + len(a.keys() ^ b.keys()) - len(parts)
    return "; ".join(parts + ([f"{more} more"] if more > 0 else [])) or None


def same_value(a: Any, b: Any) -> bool:
    """``a is b or a == b``, False where ``==`` raises or gives no bool (an array): the values count as different."""
    try:
        return a is b or bool(a == b)
    except Exception:  # an __eq__ that raises or returns an array: the values count as different
        return False


def _short(value: Any, width: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a __repr__ that raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


class Kept:
    """A Python value in a traced function's output tree: a node with no leaves, which gives the value back when
    the tree is rebuilt (a NumPy array as a fresh copy, as a loss returns a new one per call)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def restore(self) -> Any:
        """The value, as the loss returned it."""
        return np.array(self.value, copy=True) if isinstance(self.value, np.ndarray) else self.value

    def __eq__(self, other: Any) -> bool:
        if type(other) is not Kept:
            return NotImplemented
        a, b = self.value, other.value
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, np.ndarray):
            return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
        try:
            return bool(a == b)
        except Exception:  # an object whose == is not a bool
            return False

    def __hash__(self) -> int:
        if isinstance(self.value, np.ndarray):
            return hash((np.ndarray, self.value.dtype, self.value.shape))
        try:
            return hash((type(self.value), self.value))
        except TypeError:
            return hash(type(self.value))

    def __repr__(self) -> str:
        return f"Kept({self.value!r})"


jax.tree_util.register_pytree_node(Kept, lambda kept: ((), kept), lambda kept, _: kept.restore())


def _traced(x: Any) -> bool:
    return isinstance(x, jax.Array) or C.is_tracer(x)


def kept_aux(aux: Any) -> Any:
    """``aux`` with each leaf that is neither traced nor a ``jax.Array`` (a Python number, bool or string, a NumPy
    scalar or array, another object) held in a :class:`Kept`: the value the loss returned when traced, given back
    at each call instead of leaving the program as an array."""
    leaves, tree = jax.tree_util.tree_flatten(aux)
    if all(map(_traced, leaves)):
        return aux
    return jax.tree_util.tree_unflatten(tree, [x if _traced(x) else Kept(x) for x in leaves])


__all__ = ["Kept", "attribute_changes", "detached_graphdef", "graph_hash", "hashable", "kept_aux", "same_value",
           "static_attributes"]
