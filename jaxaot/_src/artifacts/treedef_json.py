"""Pytree structures as JSON, never pickles: how an artifact describes its inputs and outputs.

A node is ``{"kind": K, ...}`` for leaves, ``None``, tuples, lists, dicts,
ordered dicts and namedtuples (reloaded as a new class of that name and fields:
no code is imported). Other custom nodes (``flax.nnx.State``, dataclasses) raise
:class:`~jaxaot.errors.NotExportableError`: pass plain containers instead, e.g.
``nnx.to_pure_dict(state)``. Reading refuses structures deeper than
:data:`MAX_DEPTH` or larger than :data:`MAX_NODES`.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Mapping

import jax

from jaxaot.errors import ArtifactError, NotExportableError


class _LeafMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


_LEAF = _LeafMarker()
#: The deepest pytree structure an artifact may describe.
MAX_DEPTH = 200
#: The most nodes an artifact's pytree structure may have.
MAX_NODES = 1_000_000


def treedef_to_json(treedef: Any, prefix: str = "arg") -> dict:
    """A JSON description of a pytree structure (see the module docstring).

    Raises :class:`NotExportableError` naming the first node it cannot describe.

    Example:
        >>> import jax
        >>> from jaxaot._src.artifacts.treedef_json import treedef_to_json
        >>> treedef_to_json(jax.tree_util.tree_structure({"w": 1, "b": None}))
        {'kind': 'dict', 'keys': ['b', 'w'], 'children': [{'kind': 'none'}, {'kind': 'leaf'}]}
    """
    try:
        skeleton = jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves)
    except Exception as err:
        raise NotExportableError(f"cannot describe the pytree structure {treedef}: {err}") from err
    return _encode_node(skeleton, prefix)


def _encode_node(obj: Any, path: str) -> dict:
    if obj is _LEAF:
        return {"kind": "leaf"}
    if obj is None:
        return {"kind": "none"}
    t = type(obj)
    if t is tuple or t is list:
        return {"kind": t.__name__, "children": [_encode_node(c, f"{path}[{i}]") for i, c in enumerate(obj)]}
    if t is dict or t is collections.OrderedDict:
        keys = list(obj)
        for k in keys:
            if not isinstance(k, (str, int)):
                raise NotExportableError(
                    f"{path} is a dict with a {type(k).__name__} key ({k!r}); the manifest stores str and int "
                    "keys only: use str keys."
                )
        return {
            "kind": "dict" if t is dict else "ordered_dict",
            "keys": keys,
            "children": [_encode_node(obj[k], f"{path}[{k!r}]") for k in keys],
        }
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return {
            "kind": "namedtuple",
            "module": t.__module__,
            "qualname": t.__qualname__,
            "fields": list(t._fields),
            "children": [_encode_node(c, f"{path}.{f}") for f, c in zip(t._fields, obj)],
        }
    raise NotExportableError(
        f"{path} is a {t.__module__}.{t.__qualname__} pytree node, which the manifest cannot describe "
        "(it stores tuples, lists, dicts, OrderedDicts, namedtuples and None). Pass plain containers "
        "instead: for flax.nnx state, nnx.to_pure_dict(state); for dataclasses, dataclasses.asdict."
    )


def treedef_from_json(node: Mapping[str, Any]) -> Any:
    """The ``PyTreeDef`` that :func:`treedef_to_json` described.

    Example:
        >>> import jax
        >>> from jaxaot._src.artifacts.treedef_json import treedef_from_json, treedef_to_json
        >>> td = jax.tree_util.tree_structure(([1, 2], {"a": 3}))
        >>> treedef_from_json(treedef_to_json(td)) == td
        True
    """
    return jax.tree_util.tree_structure(_decode_node(node, 0, [0]))


def _decode_node(node: Mapping[str, Any], depth: int, seen: list) -> Any:
    if depth > MAX_DEPTH:
        raise ArtifactError(f"the manifest's pytree structure is nested deeper than {MAX_DEPTH} levels: refused.")
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise ArtifactError(f"the manifest's pytree structure has more than {MAX_NODES} nodes: refused.")
    if not isinstance(node, Mapping):
        raise ArtifactError(f"a pytree node in the manifest is a {type(node).__name__}, not an object.")
    kind = node.get("kind")
    if kind == "leaf":
        return _LEAF
    if kind == "none":
        return None
    children = [_decode_node(c, depth + 1, seen) for c in node.get("children", ())]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "dict":
        return dict(zip(node["keys"], children))
    if kind == "ordered_dict":
        return collections.OrderedDict(zip(node["keys"], children))
    if kind == "namedtuple":
        return _namedtuple_class(node["module"], node["qualname"], tuple(node["fields"]))(*children)
    raise ArtifactError(f"unknown pytree node kind {kind!r} in the manifest")


@functools.lru_cache(maxsize=None)
def _namedtuple_class(module: str, qualname: str, fields: tuple[str, ...]) -> type:
    # A stand-in class of the same name and fields: loading must not import user code.
    return collections.namedtuple(qualname.rsplit(".", 1)[-1], fields, module=module)
