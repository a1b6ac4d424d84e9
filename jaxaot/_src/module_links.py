"""The Variables and submodules of a module argument that a loss returns in its auxiliary output.

``nnx.value_and_grad`` runs the loss on the caller's module, so a Variable or submodule
the loss returns in ``aux`` is the caller's own object. Where jaxaot runs the loss on a
module merged anew (a recorded forward, a compiled loss program), :func:`links` notes
where in the merged module each such object sits, and :func:`relink` puts the caller's
own object from that place in its stead, once the state is written back.
Flax is imported only where a module was given.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import jax


def _is_node(x: Any) -> bool:
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, (nnx.Variable, nnx.Module))


def links(aux: Any, merged: Mapping[Any, Any]) -> tuple:
    """Per Variable or module among the pytree leaves of ``aux`` (taken as leaves), ``(key, path)`` where it is
    part of the module ``merged[key]`` (the module itself at path ``()``), else None; () when none is."""
    nodes = [x for x in jax.tree_util.tree_leaves(aux, is_leaf=_is_node) if _is_node(x)]
    if not nodes:
        return ()
    nnx = sys.modules["flax.nnx"]
    found = {id(node): (key, path) for key, m in merged.items() for path, node in nnx.iter_graph(m) if _is_node(node)}
    out = tuple(found.get(id(node)) for node in nodes)
    return out if any(out) else ()


def relink(aux: Any, at: tuple, live: Mapping[Any, Any]) -> Any:
    """``aux`` with each Variable or module that :func:`links` placed (``at``) replaced by the object at that path
    of the caller's module ``live[key]`` (written back already)."""
    if not at:
        return aux
    nnx = sys.modules["flax.nnx"]
    found = {key: {path: node for path, node in nnx.iter_graph(m) if _is_node(node)} for key, m in live.items()}
    leaves, tree = jax.tree_util.tree_flatten(aux, is_leaf=_is_node)
    it = iter(at)
    out = []
    for leaf in leaves:
        place = next(it) if _is_node(leaf) else None
        out.append(found[place[0]].get(place[1], leaf) if place is not None else leaf)
    return jax.tree_util.tree_unflatten(tree, out)


__all__ = ["links", "relink"]
