"""A module's split, kept while its structure is unchanged: Flax's graph is walked once, not per call.

``nnx.split`` and hashing its ``GraphDef`` on every eager call can cost more than a
step's arithmetic. :class:`ModuleSplit` keeps the split, with the cache keys built
once, and checks on each use, by the identities of every graph node's attributes,
that it still describes the module (:meth:`ModuleSplit.unchanged`); any assignment,
replaced Variable, or Variable whose pytree value took another structure (a dict's keys, a sown
tuple) rebuilds it (a change inside a Variable's metadata goes unseen).
Values are read from the live Variables on every call, so an update never needs a
new split.

Example:
    >>> from flax import nnx
    >>> lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> split = ModuleSplit(lin)
    >>> [v is lin.bias for v in split.param_vars], split.unchanged()
    ([True, False], True)
    >>> lin.bias = nnx.Param(lin.bias[...])   # a new Variable: the split no longer describes lin
    >>> split.unchanged()
    False
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from jaxaot._src import compat as C
from jaxaot._src.pytrees import is_array_leaf
from jaxaot.errors import InvalidInputError
from jaxaot._src.nn.proxy import ProxyModule
from jaxaot._src.nn.python_values import detached_graphdef

_is_ = operator.is_


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _containers(root: Any) -> list:
    """Every mutable container of ``root``'s graph: modules' attribute dicts, lists and dicts."""
    out, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ProxyModule):
            node = node.proxy_target  # the proxy's own attributes are its programs and caches
        if isinstance(node, nnx.Pytree):
            items = vars(node)
        elif isinstance(node, (dict, list)):
            items = node
        elif isinstance(node, tuple):
            stack.extend(node)
            continue
        else:
            continue
        out.append(items)
        stack.extend(items.values() if isinstance(items, dict) else items)
    return out


def _snapshot(containers: list) -> list[tuple[Any, tuple | None, tuple]]:
    return [(c, tuple(c) if isinstance(c, dict) else None, tuple(c.values() if isinstance(c, dict) else c))
            for c in containers]


def snapshot(root: Any) -> list[tuple[Any, tuple | None, tuple]]:
    """What :func:`same_graph` compares: every container of ``root``'s graph, its keys, its values' identities."""
    return _snapshot(_containers(root))


def same_graph(taken: list[tuple[Any, tuple | None, tuple]]) -> bool:
    """Whether every container :func:`snapshot` saw still holds the same keys and the very same values."""
    for items, keys, values in taken:
        if len(items) != len(values):
            return False
        if keys is None:
            if not all(map(_is_, items, values)):
                return False
        elif not (all(map(_is_, items.values(), values)) and tuple(items) == keys):
            return False
    return True


class ModuleSplit:
    """``nnx.split(module, nnx.Param, ...)`` with the live Variables in the programs' flat order.

    Attributes:
      graphdef, params, rest: what ``nnx.split(module, nnx.Param, ...)`` returned.
      param_vars, rest_vars: the live Variables, in the flat order of the state's leaves.
      param_tree, rest_tree: the JAX tree structures of ``params`` and ``rest``.
      param_var_tree: the structure of ``params`` with its Variables as leaves.
      plain: every Variable holds one concrete array, so :meth:`leaves` reads them straight.
      traced: some Variable held a tracer when split (the module lives in a trace).
      capturing: ``nnx.capture`` is collecting from the module (a module of its graph has ``__captures__``).
    """

    def __init__(self, module: nnx.Module):
        self.graphdef, self.params, self.rest = nnx.split(module, nnx.Param, ...)
        self.graphdef = detached_graphdef(self.graphdef)  # a config dict: the programs' own copy of it
        self.param_vars = jax.tree_util.tree_leaves(self.params, is_leaf=_is_variable)
        self.rest_vars = jax.tree_util.tree_leaves(self.rest, is_leaf=_is_variable)
        self.param_tree = jax.tree_util.tree_structure(self.params)
        self.rest_tree = jax.tree_util.tree_structure(self.rest)
        self.param_var_tree = jax.tree_util.tree_structure(self.params, is_leaf=_is_variable)
        self.n_params = len(self.param_vars)
        values = jax.tree_util.tree_leaves((self.params, self.rest))
        self.traced = any(map(C.is_tracer, values))
        # An array held outside a Variable (``nnx.data``) is a leaf of the split itself: read through the state.
        variables = [v for v in self.param_vars + self.rest_vars if _is_variable(v)]
        self.plain = (not self.traced and len(values) == len(variables) == self.n_params + len(self.rest_vars)
                      and all(isinstance(v.get_raw_value(), (jax.Array, np.ndarray)) for v in variables))
        if not self.plain:
            _check_values(self.params, self.rest)
        containers = _containers(module)
        self.capturing = any(isinstance(c, dict) and "__captures__" in c for c in containers)
        self._snapshot = _snapshot(containers)
        # A Variable holding a pytree (a dict, a sown tuple): the programs read its leaves by that structure.
        self._value_trees = [] if self.plain else [
            (v, jax.tree_util.tree_structure(v.get_raw_value())) for v in variables
            if not isinstance(v.get_raw_value(), (jax.Array, np.ndarray))]
        self._statics: dict[Any, Any] = {}

    def unchanged(self) -> bool:
        """Whether the module's structure is still the one split (see the module docstring)."""
        return same_graph(self._snapshot) and all(
            jax.tree_util.tree_structure(v.get_raw_value()) == tree for v, tree in self._value_trees)

    def leaves(self) -> tuple[list, list]:
        """``(parameter leaves, other state leaves)``, read from the live Variables now."""
        if self.plain:
            return [v.get_raw_value() for v in self.param_vars], [v.get_raw_value() for v in self.rest_vars]
        return jax.tree_util.tree_leaves(self.params), jax.tree_util.tree_leaves(self.rest)

    def variable(self, index: int) -> nnx.Variable | None:
        """The live Variable behind flat state leaf ``index`` (parameters first), when :attr:`plain`."""
        if not self.plain:
            return None
        return self.param_vars[index] if index < self.n_params else self.rest_vars[index - self.n_params]

    def static(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()``, once per ``key`` for this split (the :class:`CallStatic` of a method and its statics)."""
        value = self._statics.get(key)
        if value is None:
            value = self._statics[key] = build()
        return value


def _check_values(*states: nnx.State) -> None:
    """:class:`~jaxaot.errors.InvalidInputError` naming the first Variable that holds something other than arrays and
    numbers (a str in a Param): the programs take the module's Variables as their array inputs."""
    for state in states:
        for path, var in nnx.to_flat_state(state):
            bad = next((x for x in jax.tree_util.tree_leaves(var) if not is_array_leaf(x)), None)
            if bad is not None:
                name = ".".join(map(str, path))
                raise InvalidInputError(
                    f"the module's attribute `{name}` (an nnx.{type(var).__name__}) holds a {type(bad).__name__}, "
                    "not an array: aot_module's programs take the module's Variables as arrays. Hold an array "
                    "(jnp.asarray) in the Variable, or keep a Python value as a plain attribute, part of the "
                    "module's structure.")


def split_of(holder: Any, module: nnx.Module) -> ModuleSplit:
    """``module``'s :class:`ModuleSplit`, kept on ``holder`` (its ``_jaxaot_split``) and rebuilt when stale."""
    split = getattr(holder, "_jaxaot_split", None)
    if split is None or not split.unchanged():
        split = ModuleSplit(module)
        object.__setattr__(holder, "_jaxaot_split", split)
    return split


def write_back(module: nnx.Module, split: ModuleSplit, delta: Any, inputs: Callable[[], list]) -> bool:
    """Write the state a call changed (its :class:`~jaxaot._src.nn.state.StateDelta`) into ``module``.

    Each changed leaf is set into its live Variable, found through ``split``
    (as ``nnx.update`` writes: the raw value, no hooks). State the call created
    (``sow``) has no Variable yet: then the whole change goes through
    ``nnx.update``, which walks the graph and adds it. ``inputs()`` gives the
    flat program inputs, for leaves that are literally one of them. Returns
    whether the structure stayed the same (False: the split is stale).
    """
    computed = iter(delta.computed.thaw())
    writes, flat = [], None
    for source, target in zip(delta.sources, delta.targets):
        if source is None:
            value = next(computed)
        else:
            flat = inputs() if flat is None else flat
            value = flat[source]
        var = None if target is None else split.variable(target)
        if var is None:
            nnx.update(module, *delta.rebuild(inputs() if flat is None else flat))
            return False
        if source != target:  # another input's value: a new array of it, as nnx.jit writes (no two Variables share one)
            writes.append((var, value if source is None else jax.numpy.array(value, copy=True)))
    for var, value in writes:
        var.set_raw_value(value)
    return True


__all__ = ["ModuleSplit", "same_graph", "snapshot", "split_of", "write_back"]
