"""``jaxaot.nn.Optimizer``: ``nnx.Optimizer`` whose eager ``update`` is one compiled call.

Eagerly, ``nnx.Optimizer.update`` dispatches the optax transformation one small
operation per parameter at a time, which can cost more than the compiled training
step. :class:`Optimizer` keeps ``nnx.Optimizer``'s constructor, state and results
and runs the arithmetic of ``update`` as one ``jax.jit`` program, compiled once per
transformation and state structure (:meth:`Optimizer.cache_info`). Flax's
write-back stays eager, exactly ``nnx.Optimizer``'s. Under a trace, or with
non-array keyword arguments, it is ``nnx.Optimizer.update`` itself.

Example:
    >>> import jax.numpy as jnp, optax, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> optimizer = jaxaot.nn.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    >>> loss, grads = jaxaot.value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))(model, jnp.ones((4, 3)))
    >>> _ = optimizer.update(model, grads)
    >>> int(optimizer.step[...])
    1
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from jaxaot._src import compat as C
from jaxaot._src.pytrees import leaf_paths
from jaxaot._src.nn.split_cache import same_graph, snapshot
from jaxaot._src.nn.traversal import recall
from jaxaot._src.nn.update_cache import UPDATE_NAME, UpdateCache
from jaxaot._src.runtime import CacheInfo


def _update(tx: optax.GradientTransformation, param_tree: Any, opt_tree: Any, params: list, grads: list,
            opt_state: list, step: Any, kwargs: dict):
    """``tx``'s update, applied: ``(updates, new param leaves, new optimizer state leaves, step + 1)``.

    Leaves go in and out as flat lists (the trees are static), which keeps the call's own
    pytree handling off the eager step's path."""
    params, grads = param_tree.unflatten(params), param_tree.unflatten(grads)
    updates, new_opt_state = tx.update(grads, opt_tree.unflatten(opt_state), params, **kwargs)
    new_params = optax.apply_updates(params, updates)
    return updates, jax.tree_util.tree_leaves(new_params), opt_tree.flatten_up_to(new_opt_state), step + 1


class _Program:
    """One transformation's compiled update (``apply``, a ``jax.jit`` function holding ``tx``), shared by the
    optimizers of that ``tx`` and living as long as one of them does."""

    __slots__ = ("apply", "__weakref__")

    def __init__(self, tx: optax.GradientTransformation) -> None:
        def update(param_tree: Any, opt_tree: Any, params: list, grads: list, opt_state: list, step: Any,
                   kwargs: dict):
            return _update(tx, param_tree, opt_tree, params, grads, opt_state, step, kwargs)

        update.__name__ = update.__qualname__ = UPDATE_NAME  # what the compile events name (.update_cache)
        self.apply = jax.jit(update, static_argnums=(0, 1))


#: Per transformation, its program while an optimizer holds it.
_PROGRAMS: "weakref.WeakValueDictionary[Any, _Program]" = weakref.WeakValueDictionary()
_PROGRAMS_LOCK = threading.Lock()


def _program_of(tx: optax.GradientTransformation) -> _Program:
    """The program of ``tx``: the one other optimizers of an equal ``tx`` hold, else a new one (an unhashable
    ``tx`` gets its own)."""
    try:
        hash(tx)
    except TypeError:
        return _Program(tx)
    with _PROGRAMS_LOCK:
        program = _PROGRAMS.get(tx)
        if program is None:
            program = _PROGRAMS[tx] = _Program(tx)
    return program


def _all_concrete_arrays(tree: Any, numbers: bool = False) -> bool:
    """Whether every leaf is a concrete array (with ``numbers``, or a Python int or float: ``value=loss.item()``,
    traced as a weakly typed scalar, as ``nnx.jit`` traces it)."""
    kinds = (jax.Array, np.ndarray, np.generic, int, float) if numbers else (jax.Array, np.ndarray, np.generic)
    return all(isinstance(x, kinds) and not isinstance(x, bool) and not C.is_tracer(x)
               for x in jax.tree_util.tree_leaves(tree))


class Optimizer(nnx.Optimizer):
    """``nnx.Optimizer`` with a compiled eager :meth:`update`; a drop-in (same arguments, state and results).

    Use it where a training loop runs eagerly (prototyping, or around
    :func:`jaxaot.value_and_grad` of an :func:`~jaxaot.nn.aot_module`); under
    ``nnx.jit`` it is ``nnx.Optimizer``.
    """

    def update(self, model: Any, grads: Any, /, **kwargs: Any) -> Any:
        """``nnx.Optimizer.update(model, grads, **kwargs)``, its arithmetic compiled: returns the updates."""
        graph = {"graph": self.graph} if hasattr(self, "graph") else {}
        split = recall(grads, model) if self.wrt is nnx.Param and graph.get("graph") is None else None
        if split is not None:
            param_vars, param_tree, param_plain = split.param_vars, split.param_var_tree, split.plain
        else:
            param_vars, param_tree = jax.tree_util.tree_flatten(nnx.state(model, self.wrt, **graph),
                                                                is_leaf=_is_variable)
            param_plain = _all_plain(param_vars)
        opt_vars, opt_tree, opt_plain = _flat_opt_state(self)
        grad_leaves, grad_tree = jax.tree_util.tree_flatten(grads, is_leaf=_is_variable)
        if grad_tree != param_tree:  # not exactly the parameters' gradients: filter as Flax does
            grad_leaves, grad_tree = jax.tree_util.tree_flatten(nnx.state(grads, self.wrt, **graph),
                                                                is_leaf=_is_variable)
        if not (param_plain and opt_plain and _plain(self.step) and grad_tree == param_tree):
            return super().update(model, grads, **kwargs)
        params = [v.get_raw_value() for v in param_vars]
        opt_state = [v.get_raw_value() if _is_variable(v) else v for v in opt_vars]  # arrays a user assigned too
        grad_arrays = [_value(v) for v in grad_leaves]
        step = self.step.get_raw_value()
        if not (_concrete(params) and _concrete(opt_state) and _concrete(grad_arrays) and _concrete([step])
                and (not kwargs or _all_concrete_arrays(kwargs, numbers=True))):
            return super().update(model, grads, **kwargs)
        cache = _cache_of(self)
        try:
            (updates, new_params, new_opt_state, new_step), compiled = cache.run(
                cache.program.apply, param_tree, opt_tree, params, grad_arrays, opt_state, step, kwargs)
        except jax.errors.ConcretizationTypeError:  # the transformation's Python reads a number passed: eagerly
            return super().update(model, grads, **kwargs)
        if C.is_tracer(new_step):  # concrete inputs, but under a trace: Flax's own (traced) update
            return super().update(model, grads, **kwargs)
        cache.count(compiled, self.tx, lambda: _named_inputs(param_tree, opt_tree, params, grad_arrays, opt_state,
                                                             step, kwargs))
        # Each leaf of params / opt_state is one Variable's value, in flattening order, and optax
        # returns states structured as its inputs: write each value into its own Variable.
        _set_values(param_vars, new_params)
        if all(map(_is_variable, opt_vars)):
            _set_values(opt_vars, new_opt_state)
        else:  # an array assigned into a container (``opt_state.hyperparams['learning_rate'] = ...``): Flax's write
            nnx.update(self.opt_state, nnx.state(opt_tree.unflatten(new_opt_state), **graph))
        _set_values([self.step], [new_step])
        return updates


    def cache_info(self) -> CacheInfo:
        """What this optimizer's compiled :meth:`update` compiled, as a :class:`jaxaot.CacheInfo`.

        One entry per compile of the update program, its ``signature`` the inputs by name
        (``params[...]``, ``grads[...]``, ``opt_state[...]``, ``step``, ``kwargs[...]``), its
        ``executables`` ``("update",)``, its ``times`` the trace and the XLA compile, its
        ``reason`` ``"first call"`` or what changed (``params['kernel']: shape (3, 2) → (5, 2)``).
        Updates that run ``nnx.Optimizer.update`` itself (under a trace, ...) are not counted;
        one that found an executable another optimizer with the same ``tx`` compiled is a hit.

        Example:
            >>> import jax.numpy as jnp, optax, jaxaot
            >>> from flax import nnx
            >>> model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            >>> optimizer = jaxaot.nn.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            >>> for _ in range(3):
            ...     _ = optimizer.update(model, nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 3)))))(model))
            >>> info = optimizer.cache_info()
            >>> info.hits, info.misses, info.entries[0].reason, info.entries[0].executables
            (2, 1, 'first call', ('update',))
            >>> info.entries[0].signature.split(", ")[:2]
            ["params['bias']: f32[2]", "params['kernel']: f32[3,2]"]
        """
        return _cache_of(self).cache_info()


#: Per optimizer, what its compiled update compiled.
_CACHES: "weakref.WeakKeyDictionary[Any, UpdateCache]" = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def _cache_of(optimizer: nnx.Optimizer) -> UpdateCache:
    cache = _CACHES.get(optimizer)
    if cache is None:
        with _CACHES_LOCK:
            cache = _CACHES.get(optimizer)
            if cache is None:
                cache = _CACHES[optimizer] = UpdateCache()
    if cache.program is None or cache.tx is not optimizer.tx:  # a user may assign another tx
        cache.program, cache.tx = _program_of(optimizer.tx), optimizer.tx
    return cache


def _named_inputs(param_tree: Any, opt_tree: Any, params: list, grads: list, opt_state: list, step: Any,
                  kwargs: dict) -> list[tuple[str, Any]]:
    """The update program's inputs as ``(path, aval)``, named as the optimizer's user knows them."""
    kw_leaves, kw_tree = jax.tree_util.tree_flatten(kwargs)
    groups = ((leaf_paths(param_tree, "params"), params), (leaf_paths(param_tree, "grads"), grads),
              (leaf_paths(opt_tree, "opt_state"), opt_state), (["step"], [step]),
              (leaf_paths(kw_tree, "kwargs"), kw_leaves))
    return [(path, jax.typeof(x)) for paths, values in groups for path, x in zip(paths, values, strict=True)
            if not _leafless(x)]


#: Per optimizer, its optimizer state's Variables and structure, kept while ``opt_state`` is the same object.
_OPT_STATES: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _flat_opt_state(optimizer: nnx.Optimizer) -> tuple[list, Any, bool]:
    """``optimizer.opt_state``'s Variables, structure, and whether they all hold plain arrays,
    flattened once per ``opt_state`` object.

    The update writes new values into these Variables (as ``nnx.update`` does), so the structure
    stays; a new ``opt_state`` object (``nnx.Optimizer.update`` under a trace, a user's
    assignment), or one whose containers hold other values (``opt_state.hyperparams['learning_rate'] = ...``), is
    flattened anew.
    """
    state = optimizer.opt_state
    kept = _OPT_STATES.get(optimizer)
    if kept is None or kept[0] is not state or not same_graph(kept[4]):
        variables, tree = jax.tree_util.tree_flatten(state, is_leaf=_is_variable)
        kept = (state, variables, tree, _plain_state(variables), snapshot(state))
        _OPT_STATES[optimizer] = kept
    return kept[1], kept[2], kept[3]


def _all_plain(variables: list) -> bool:
    return all(_is_variable(v) and _plain(v) for v in variables)


def _plain_state(leaves: list) -> bool:
    """Whether the optimizer state's leaves are Variables holding plain arrays, or concrete arrays (assigned
    into its containers by a user), which the compiled update reads and writes as Flax does."""
    return all(_plain(v) if _is_variable(v) else type(v) is _ARRAY for v in leaves)


def _concrete(arrays: list) -> bool:
    """Whether every entry is a concrete array (the common case, a ``jax.Array``, checked first)."""
    return all(type(x) is _ARRAY for x in arrays) or _all_concrete_arrays(arrays)


_ARRAY = C.ArrayImpl


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _plain(var: nnx.Variable) -> bool:
    """Whether ``var`` holds a plain array (not a ``jax.Ref``), or a value with no arrays at all (the
    ``optax.MaskedNode`` of a masked-out entry in ``optax.masked``'s state)."""
    raw = var.get_raw_value()
    return isinstance(raw, jax.Array) or _leafless(raw)


def _leafless(x: Any) -> bool:
    return not jax.tree_util.tree_leaves(x)


def _read(var: nnx.Variable) -> Any:
    """``var``'s value as ``nnx.as_pure`` reads it (the raw value; no ``on_get_value`` hooks)."""
    return var.get_raw_value() if _plain(var) else nnx.as_pure(var)


def _value(x: Any) -> Any:
    return _read(x) if _is_variable(x) else x


def _set_values(variables: list, new: list) -> None:
    """Write as ``nnx.update`` does (``nnx.Optimizer``'s write-back): the raw value, no hooks and, as
    there, no trace-level check (the values are concrete results of an eager call)."""
    for var, value in zip(variables, new, strict=True):
        if _plain(var):
            var.set_raw_value(value, _unsafe_bypass_check=True)
        else:
            nnx.update(var, value)
