"""Module state in transit: frozen state leaves, the write-back delta, dotted names.

:class:`FrozenState` carries the non-differentiable state in (floating leaves bitcast
to unsigned integers when traced, so they get no cotangents); :class:`StateDelta`
carries the changed state out (a leaf that is another input is taken back from it).
:func:`fqn` names a leaf by its dotted key path (``bn.mean``).

Example:
    >>> import jax.numpy as jnp
    >>> frozen = FrozenState.of({"mean": jnp.zeros(2)}, freeze=True)
    >>> frozen.leaves[0].dtype, frozen.thaw()["mean"].dtype
    (dtype('uint32'), dtype('float32'))
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C

_UINT_OF_WIDTH = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


# --------------------------------------------------------------------------- names
def fqn(path: Sequence[Any]) -> str:
    """A dotted name for a state leaf's key path: ``('lin', 'kernel', .value)`` -> ``lin.kernel``.

    Example:
        >>> from jax.tree_util import DictKey, GetAttrKey
        >>> fqn((DictKey('bn'), DictKey('mean'), GetAttrKey('value')))
        'bn.mean'
    """
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value":
            continue  # the Variable's own value slot, not part of the name
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


def leaf_fqns(tree: Any) -> list[str]:
    """:func:`fqn` of every leaf of a state tree, in flat order."""
    return [fqn(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def flat_inputs(state: tuple, args: tuple, kwargs: dict) -> list:
    """The flat program inputs a :class:`StateDelta` indexes: the state pair's leaves, then the user's.

    ``state`` is ``(params, other state)``; ``args`` are the positional
    arguments after it (linen's ``rngs`` first).
    """
    return jax.tree.leaves(state) + jax.tree.leaves((args, kwargs))


# --------------------------------------------------------------------------- frozen state
def _freezable(x: Any) -> bool:
    # Complex state has no unsigned twin of its width: it stays inexact and is
    # cut from differentiation with stop_gradient instead (see _thaw_leaf).
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _is_inexact(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and C.is_inexact(dtype)


def _thaw_leaf(x: Any, dtype: Any, frozen: bool) -> Any:
    if dtype is not None:
        return jax.lax.bitcast_convert_type(x, dtype)
    return jax.lax.stop_gradient(x) if frozen and _is_inexact(x) else x


_NONES: dict[int, tuple] = {}


def _nones(n: int) -> tuple:
    """``(None,) * n``, one object per length (it is compared in every compile-cache look-up)."""
    t = _NONES.get(n)
    if t is None:
        t = _NONES.setdefault(n, (None,) * n)
    return t


@jax.tree_util.register_pytree_node_class
class FrozenState:
    """A state pytree in transit.

    With ``frozen``, floating leaves travel bitcast to unsigned ints of their
    width (``dtypes[i]`` is the original dtype, else None), so the runtime
    neither differentiates them nor gives them cotangents. The structure and
    the dtypes are static: they key the compile cache.
    """

    def __init__(self, treedef: Any, dtypes: tuple, frozen: bool, leaves: Sequence[Any]):
        self.treedef = treedef
        self.dtypes = dtypes
        self.frozen = frozen
        self.leaves = list(leaves)

    def tree_flatten(self):
        return self.leaves, (self.treedef, self.dtypes, self.frozen)

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        return cls(*aux, leaves)

    @classmethod
    def of(cls, tree: Any, freeze: bool) -> "FrozenState":
        """``tree`` for transit; with ``freeze``, its floating leaves bitcast to unsigned ints."""
        leaves, treedef = jax.tree.flatten(tree)
        return cls.of_leaves(treedef, leaves, freeze)

    @classmethod
    def of_leaves(cls, treedef: Any, leaves: Sequence[Any], freeze: bool) -> "FrozenState":
        """:meth:`of` for a tree given as its structure and leaves."""
        if not freeze:
            return cls(treedef, _nones(len(leaves)), False, leaves)
        dtypes = tuple(np.dtype(x.dtype) if _freezable(x) else None for x in leaves)
        encoded = [x if d is None else jax.lax.bitcast_convert_type(x, _UINT_OF_WIDTH[d.itemsize])
                   for x, d in zip(leaves, dtypes)]
        return cls(treedef, dtypes, freeze, encoded)

    def thaw(self) -> Any:
        """The original tree (frozen inexact leaves behind ``stop_gradient``)."""
        leaves = [_thaw_leaf(x, d, self.frozen) for x, d in zip(self.leaves, self.dtypes)]
        return jax.tree.unflatten(self.treedef, leaves)


# --------------------------------------------------------------------------- state delta
@jax.tree_util.register_pytree_node_class
class StateDelta:
    """The state a call leaves behind, as the compiled program returns it.

    ``treedef`` is the structure of the new state; per leaf, ``sources[i]`` is the
    flat program input it literally is (no output needed), else None and the
    value is among ``computed`` (in order). ``targets[i]`` is the flat program
    input the leaf overwrites (None for state the call created).
    """

    def __init__(self, treedef: Any, sources: tuple, targets: tuple, computed: FrozenState):
        self.treedef = treedef
        self.sources = sources
        self.targets = targets
        self.computed = computed

    def tree_flatten(self):
        return (self.computed,), (self.treedef, self.sources, self.targets)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*aux, children[0])

    @classmethod
    def capture(cls, new_state: Any, old_state: Any, inputs: Sequence[Any], freeze: bool) -> "StateDelta":
        """Describe ``new_state`` against the traced ``inputs`` (whose first leaves are ``old_state``'s)."""
        position = {id(x): i for i, x in enumerate(inputs)}
        old_paths = {_path_key(p): i for i, (p, _) in enumerate(jax.tree_util.tree_flatten_with_path(old_state)[0])}
        with_paths, treedef = jax.tree_util.tree_flatten_with_path(new_state)
        sources = tuple(position.get(id(x)) for _, x in with_paths)
        targets = tuple(old_paths.get(_path_key(p)) for p, _ in with_paths)
        computed = [x for (_, x), s in zip(with_paths, sources) if s is None]
        return cls(treedef, sources, targets, FrozenState.of(computed, freeze))

    def rebuild(self, inputs: Sequence[Any]) -> Any:
        """The new state, taking unchanged or aliased leaves from ``inputs``."""
        return jax.tree.unflatten(self.treedef, self._leaves(self.computed.thaw(), inputs))

    @property
    def mutated_inputs(self) -> frozenset[int]:
        """The flat inputs the call writes a new value to."""
        return frozenset(t for t, s in zip(self.targets, self.sources) if t is not None and s != t)

    def output_targets(self) -> list[int | None]:
        """Per computed leaf (a program output), the input it overwrites."""
        return [t for t, s in zip(self.targets, self.sources) if s is None]

    def output_names(self) -> list[str]:
        """Per computed leaf (a program output), its dotted name."""
        return [n for n, s in zip(self.names(), self.sources) if s is None]

    def changed_leaves(self, inputs: Sequence[Any]) -> list[tuple[str, Any]]:
        """``(name, leaf as it travels)`` per new-state leaf other than its own input unchanged.

        Aliased leaves come from ``inputs``: this is the state an exported program returns.
        """
        leaves = self._leaves(self.computed.leaves, inputs)
        return [(n, x) for n, x, t, s in zip(self.names(), leaves, self.targets, self.sources) if t is None or s != t]

    def names(self) -> list[str]:
        """Dotted names of the new-state leaves (the state pair's index dropped)."""
        dummy = jax.tree.unflatten(self.treedef, list(range(self.treedef.num_leaves)))
        return [fqn(p[1:]) for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]

    def _leaves(self, computed: Sequence[Any], inputs: Sequence[Any]) -> list:
        it = iter(computed)
        return [next(it) if s is None else inputs[s] for s in self.sources]


def _path_key(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path))
