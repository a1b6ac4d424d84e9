"""Flax nnx modules as arguments of :func:`~jaxaot.compiled_grad`, the way ``nnx.grad`` treats them.

Each module argument (or ``nnx.Rngs``, ``nnx.Variable``, or a list, tuple or dict of them) is split into its
``nnx.Param`` state (differentiated) and the rest; the forward runs on a module merged back, and the rest it
leaves (batch statistics, RNG counters), with the Params it wrote, comes back from the compiled step as concrete
arrays and is written into the caller's module. The gradients are those of the Params' values at entry, as under
``nnx.grad``. A Param the forward did not write still holds the very value it was given, so it is told apart by
identity and the step returns no copy of it. A Variable or module of an argument returned in the auxiliary output
is the caller's own (:mod:`jaxaot._src.module_links`). An attribute the forward changes otherwise
(``self.calls += 1``) would not come back: it is refused. Flax is imported only for a module argument.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src.compat import ArrayImpl as _ArrayImpl
from jaxaot._src.python_reads import flax_objects
from jaxaot.errors import InvalidInputError


def is_nnx_module(x: Any) -> bool:
    """Whether ``x`` is an ``nnx.Module`` (without importing flax)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, nnx.Module)


def holds_nnx_state(x: Any) -> bool:
    """Whether ``x`` is Flax nnx state the forward may change: a module or other ``nnx.Pytree`` (``nnx.Rngs``), an
    ``nnx.Variable``, or a list, tuple or dict holding one (``nnx.split`` takes them all, as ``nnx.grad`` does).
    Every call asks it of every argument: an array is answered by its type alone."""
    if type(x) in _PLAIN or "flax.nnx" not in sys.modules:
        return False
    return _holds(x, flax_objects())


def _holds(x: Any, kinds: tuple) -> bool:
    t = type(x)
    if t in _PLAIN:
        return False
    if t is list or t is tuple:
        return any(_holds(y, kinds) for y in x)
    if t is dict:
        return any(_holds(y, kinds) for y in x.values())
    return isinstance(x, kinds)


#: Types that are never Flax state (what most arguments are).
_PLAIN = frozenset({_ArrayImpl, int, float, bool, str, type(None)})


@dataclasses.dataclass
class ModuleArg:
    """One module argument, split: ``graphdef``, the state differentiated (or None) and the rest."""

    module: Any
    graphdef: Any
    params: Any
    rest: Any

    def merge(self, params: Any) -> Any:
        """A fresh module built from the parts (``params`` replaces the differentiated state)."""
        from flax import nnx  # optional dependency, present whenever a module was passed

        # Rebuilt leaf by leaf so the Variables belong to the current (recording or vjp) trace: nnx refuses
        # to mutate a Variable created under another trace (batch statistics are mutated).
        parts = (self.rest,) if self.params is None else (params, self.rest)
        return nnx.merge(self.graphdef, *(jax.tree_util.tree_map(lambda x: x, p) for p in parts))

    def check_unchanged(self, merged: Any, before: dict, name: str) -> None:
        """Raise where the forward (``name``) changed ``merged`` beyond its Variables' values (``before``: its
        :func:`~jaxaot._src.nn.graph_changes.layout` as merged): only those come back to the caller's module."""
        from jaxaot._src.autograd.recorded import module_changes  # imports flax

        module_changes.check(merged, before, name)

    def state_after(self, merged: Any, params: Any) -> tuple[Any, Any]:
        """What the forward left in ``merged``: ``(its state but the differentiated Params, the Params it wrote
        or None)``; ``params``: the differentiated state ``merged`` was built from (None when not differentiated)."""
        from flax import nnx  # optional dependency

        if self.params is None:
            return nnx.state(merged), None
        after, rest = nnx.state(merged, nnx.Param, ...)
        return rest, _written(after, params)

    def write_back(self, states: tuple[Any, Any]) -> None:
        """Update the caller's module with the state the forward left behind (:meth:`state_after`'s pair)."""
        from flax import nnx  # optional dependency

        rest, written = states
        nnx.update(self.module, rest)
        if written is not None:
            nnx.update(self.module, written)


def _written(after: Any, entry: Any) -> Any:
    """The Variables of ``after`` that do not hold ``entry``'s objects at their path (new ones included), as an
    ``nnx.State``, or None when there are none: the Params the forward wrote."""
    now, given = jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(entry)
    if len(now) == len(given) and all(map(operator.is_, now, given)):  # nothing written: one pass, no copy
        return None
    from flax import nnx  # optional dependency

    before = {path: jax.tree_util.tree_leaves(v) for path, v in nnx.to_flat_state(entry)}
    wrote = [(path, v) for path, v in nnx.to_flat_state(after)
             if path not in before or not _same(jax.tree_util.tree_leaves(v), before[path])]
    return nnx.from_flat_state(wrote) if wrote else None


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def split(module: Any, differentiated: bool) -> ModuleArg:
    """Split ``module`` as ``nnx.grad`` does: its ``nnx.Param`` state apart when ``differentiated``."""
    from flax import nnx  # optional dependency

    if differentiated:
        loose = next(_loose_arrays(module, "", nnx), None)
        if loose is not None:  # nnx.grad differentiates them too: refused, never a gradient left out
            raise InvalidInputError(
                f"a differentiated argument holds nnx modules and, beside them, the array {loose}; compiled "
                "autograd differentiates the modules' nnx.Params there, not such arrays. Pass the array as an "
                "argument of its own (in argnums), or hold it in an nnx.Param of a module.")
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        return ModuleArg(module, graphdef, params, rest)
    graphdef, rest = nnx.split(module)
    return ModuleArg(module, graphdef, None, rest)


def as_flax_grads(module: Any, state: Any) -> Any:
    """``state``, the gradient of a differentiated module argument (one ``nnx.State`` of its Params), in the form
    ``nnx.grad`` gives it: for a list, tuple or dict of modules, that container of each one's state (an empty one
    where the module is one an earlier entry holds); a module's own, or anything else, as it is."""
    from flax import nnx  # optional dependency

    def graph_nodes(x: Any) -> bool:
        t = type(x)
        if t in (list, tuple):
            return all(map(graph_nodes, x))
        return all(map(graph_nodes, x.values())) if t is dict else isinstance(x, nnx.Pytree)

    def shaped(x: Any, sub: Any) -> Any:
        t = type(x)
        if t in (list, tuple):
            return t(shaped(m, _entry(sub, i)) for i, m in enumerate(x))
        return {k: shaped(m, _entry(sub, k)) for k, m in x.items()} if t is dict else sub

    return shaped(module, state) if type(module) in (list, tuple, dict) and graph_nodes(module) else state


def _entry(state: Any, key: Any) -> Any:
    from flax import nnx  # optional dependency

    try:
        return state[key]
    except (KeyError, IndexError, TypeError):  # a module shared with an earlier entry: held there, as nnx.grad's
        return nnx.State({})


def _loose_arrays(x: Any, path: str, nnx: Any) -> Iterator[str]:
    """The paths (``['scale']``) of inexact arrays in the lists, tuples and dicts of ``x``, outside its modules."""
    t = type(x)
    if t in (list, tuple):
        for i, y in enumerate(x):
            yield from _loose_arrays(y, f"{path}[{i}]", nnx)
    elif t is dict:
        for k, y in x.items():
            yield from _loose_arrays(y, f"{path}[{k!r}]", nnx)
    elif isinstance(x, (float, complex)) or (not isinstance(x, (nnx.Pytree, nnx.Variable)) and hasattr(x, "dtype")
                                             and jnp.issubdtype(x.dtype, jnp.inexact)):
        yield f"{path} ({getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))})"


def split_args(args: Sequence[Any], nums: Sequence[int]) -> dict[int, ModuleArg]:
    """The module arguments among ``args``, by position (only positions holding nnx state: :func:`holds_nnx_state`)."""
    return {i: split(a, i in nums) for i, a in enumerate(args) if holds_nnx_state(a)}


def layout(merged: Any) -> dict:
    """:func:`~jaxaot._src.nn.graph_changes.layout` of a merged module argument (imports flax)."""
    from jaxaot._src.autograd.recorded import module_changes  # imports flax

    return module_changes.layout(merged)
