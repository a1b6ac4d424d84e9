"""One call's arguments, split once: differentiated leaves, other arrays, static values, and their key.

A compiled step needs its arguments in several forms (its inputs, the replay key,
the inputs named for a recompile reason); :class:`Call` flattens them once and
derives each form on demand. A ``jax.Array`` or a NumPy array (of any shape: it
is mutable) is an input of the step; anything else is static: scalars are literals
keyed by value, other objects are keyed by identity. A replayed call needs less:
:func:`quick_key` keys it from one flatten, and :func:`leaf_positions` says once
per key where its differentiated leaves and arrays are among the flattened ones.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded.step_reasons import CallInputs, python_values
from jaxaot._src.autograd.recorded.structure import literal_value_key
from jaxaot._src.runtime import ArgNames, default_device, leaf_key, sharding_key

_ArrayImpl = C.ArrayImpl


def is_array(x: Any) -> bool:
    """Whether a leaf is an input array of the step (else a static value)."""
    return type(x) is _ArrayImpl or isinstance(x, (jax.Array, np.ndarray))


def static_key(x: Any) -> Any:
    """A static leaf's part of a key: a scalar by its exact value, a string or ``None`` by value, any other
    object by identity (``C.ById``: the object is kept alive with the key)."""
    lit = literal_value_key(x)
    if lit is not None:
        return lit
    if type(x) in (str, type(None)):
        return (type(x), x)
    return C.ById(x)


def _types(leaves: Sequence[Any]) -> tuple[tuple, bool, tuple]:
    """Each array's type, whether any is a tracer, and the placement of the arrays: a ``jax.Array``'s aval, else
    :func:`jaxaot._src.runtime.signature.leaf_key`; the placement as :func:`placement`'s."""
    types, traced = [], False
    for x in leaves:
        if type(x) is _ArrayImpl:
            types.append(x.aval)
            continue
        if isinstance(x, C.Tracer):
            traced = True
        types.append(leaf_key(x))
    return tuple(types), traced, placement(leaves)


def place_of(x: Any) -> Any:
    """Where ``x`` lives, as a key: a committed device array off the default device, its sharding; else None."""
    return sharding_key(x.sharding) if type(x) is _ArrayImpl and x.committed else None


def placement(leaves: Sequence[Any]) -> tuple:
    """Where the committed device arrays among ``leaves`` live, off the default device: ``(index, sharding)`` each
    (empty where all are uncommitted or on the default device, as most are), and the default device where
    ``jax.default_device`` chose one. A step's executables are compiled for
    their inputs' placement, so a call on another device records and compiles its own, as ``jit`` does."""
    placed = ()
    for i, x in enumerate(leaves):
        sk = place_of(x)
        if sk is not None:
            placed += ((i, sk),)
    if jax.config.jax_default_device is not None:  # uncommitted arrays run where jax.default_device says
        placed += (("default device", default_device()),)
    mesh = C.device_context()
    if mesh is not None:  # jax.set_mesh's devices: two meshes of one shape on other devices share an abstract mesh
        placed += (("mesh", mesh),)
    return placed


class Call:
    """A call's arguments, flattened: ``diff`` leaves (of ``diff_tree``, one subtree per differentiated
    position), the ``others`` (the other positional arguments, then the keywords; ``other_tree``), which
    of those are :func:`is_array` (``array_at``), and every array's type (``types``: differentiated leaves
    first: an aval)."""

    __slots__ = ("positions", "diff", "diff_tree", "other_at", "kw_names", "others", "other_tree", "array_at",
                 "types", "traced", "placement", "values")

    def __init__(self, args: tuple, kwargs: dict, positions: tuple, diff_values: tuple, skip: Any) -> None:
        self.positions = positions
        self.diff, self.diff_tree = jax.tree_util.tree_flatten(diff_values)
        self.other_at = tuple(i for i in range(len(args)) if i not in skip)
        self.kw_names = tuple(sorted(kwargs))  # keywords in either order are one call, as a dict flattens
        self.others, self.other_tree = jax.tree_util.tree_flatten(
            (*(args[i] for i in self.other_at), *(kwargs[k] for k in self.kw_names)))
        self.array_at = tuple(i for i, x in enumerate(self.others) if is_array(x))
        others = self.others
        types, traced, placed = _types([*self.diff, *(others[i] for i in self.array_at)])
        self.types, self.traced = types, traced  #: ``traced``: some leaf is a tracer (the call is being traced)
        self.placement = placed  #: :func:`placement` of the differentiated leaves, then the other arrays
        self.values: tuple | None = None

    def release(self) -> "Call":
        """Let the arguments go (keeping what :meth:`inputs` needs): a function keeps its last call."""
        self.values = python_values(self.others)
        self.diff = self.others = None
        return self

    @property
    def arrays(self) -> list:
        """The other arguments' arrays, in order."""
        others = self.others
        return [others[i] for i in self.array_at]

    def key(self, context: Any) -> tuple:
        """What a replay is looked up by: the trees, every array's aval, every static value (by
        :func:`static_key`), JAX's configuration ``context`` and the arrays' :func:`placement`."""
        arrays = set(self.array_at)
        statics = tuple([static_key(x) for i, x in enumerate(self.others) if i not in arrays])
        return (self.positions, self.diff_tree, self.other_tree, self.kw_names, self.array_at, self.types, statics,
                context, self.placement)

    def rebuild(self, args: tuple, kwargs: dict, arrays: Sequence[Any]) -> tuple[list, dict]:
        """``args`` and ``kwargs`` with the other arguments' arrays replaced by ``arrays`` (in order)."""
        leaves = list(self.others)
        for i, x in zip(self.array_at, arrays):
            leaves[i] = x
        rebuilt = jax.tree_util.tree_unflatten(self.other_tree, leaves)
        call_args = list(args)
        for i, value in zip(self.other_at, rebuilt):
            call_args[i] = value
        return call_args, dict(zip(self.kw_names, rebuilt[len(self.other_at):]))

    def inputs(self, names: ArgNames) -> CallInputs:
        """The call's inputs named as a compile reason names them (:class:`CallInputs`; no array is kept)."""
        avals = tuple((tuple(a.shape), a.dtype) for a in (t[0] if type(t) is tuple else t for t in self.types))
        keep = [False] * self.other_tree.num_leaves
        for i in self.array_at:
            keep[i] = True
        other_names = (*(names(i) for i in self.other_at), *self.kw_names)
        values = self.values if self.others is None else python_values(self.others)
        return CallInputs(self.positions, self.diff_tree, other_names, self.other_tree, tuple(keep), avals, values)


def quick_key(args: tuple, kwargs: dict, context: Any) -> tuple[tuple, list] | None:
    """``(key, leaves)`` of a call from one flatten of its arguments: their tree, the keywords' order,
    each leaf's aval (a device array) or :func:`static_key`, ``context`` and the :func:`placement`;
    None when some leaf is another kind of array or a tracer. Equal keys mean equal :meth:`Call.key` (the
    converse may fail)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs) if kwargs else args)
    if set(map(type, leaves)) <= _ONLY_ARRAYS:  # the common case: device arrays alone
        return (tree, tuple(kwargs), tuple([x.aval for x in leaves]), context, placement(leaves)), leaves
    parts = []
    for x in leaves:
        if type(x) is _ArrayImpl:
            parts.append(x.aval)
        elif isinstance(x, (C.Tracer, jax.Array, np.ndarray)):
            return None
        else:
            parts.append(static_key(x))
    return (tree, tuple(kwargs), tuple(parts), context, placement(leaves)), leaves


_ONLY_ARRAYS = frozenset({_ArrayImpl})


def leaf_positions(args: tuple, kwargs: dict, call: Call) -> tuple[tuple, tuple] | None:
    """Where ``call``'s differentiated leaves and other arrays are among the leaves :func:`quick_key`
    flattens (the same for every call of that key), or None when a pytree node cannot hold indices."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs) if kwargs else args)
    try:
        at = jax.tree_util.tree_unflatten(tree, list(range(len(leaves))))
    except Exception:  # noqa: BLE001 - a node that checks its children's types: no quick replay
        return None
    at_args, at_kwargs = at if kwargs else (at, {})
    diff = jax.tree_util.tree_leaves(tuple(at_args[n] for n in call.positions))
    others = jax.tree_util.tree_leaves((*(at_args[i] for i in call.other_at), *(at_kwargs[k] for k in kwargs)))
    arrays = tuple(others[i] for i in call.array_at)
    if len(diff) != len(call.diff) or any(leaves[i] is not x for i, x in zip((*diff, *arrays),
                                                                             (*call.diff, *call.arrays))):
        return None
    return tuple(diff), arrays
