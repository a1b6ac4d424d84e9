"""A loss function of an ``AOTModule``, prepared as one more call of the module.

``jaxaot.value_and_grad(loss_fn)(aot_model, ...)`` compiles ``loss_fn`` with the
module into one step (``docs/concepts/modules.md``). This is the Flax side:
:class:`LossCall` treats ``loss_fn`` as a hashable method of the module;
:meth:`PreparedLoss.of` reads the module's state through its kept split into the
loss program's inputs (or says ``nnx.value_and_grad`` must run, under a trace);
:meth:`PreparedLoss.finish` writes changed state back and shapes the gradients as
``nnx.value_and_grad`` does. ``loss_fn`` is traced once per signature.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    >>> loss = PreparedLoss.of(model, lambda m, x: jnp.sum(m(x) ** 2), 0, (model, jnp.ones((4, 3))), {}, False)
    >>> [type(x).__name__ for x in loss.inputs[:3]], loss.inputs[3].shape   # then the other arguments
    (['CallStatic', 'list', 'FrozenState'], (4, 3))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from flax import nnx

from jaxaot._src import compat as C
from jaxaot._src import module_links
from jaxaot._src.python_reads import closure_key
from jaxaot._src.nn.module_call import _FLAX_OBJECTS, CallStatic, check_static, has_numbers, python_static
from jaxaot._src.nn.split_cache import ModuleSplit, split_of, write_back
from jaxaot._src.nn.state import FrozenState
from jaxaot._src.nn.traversal import remember
from jaxaot._src.runtime import ArgNames


@dataclasses.dataclass(frozen=True)
class LossCall:
    """``fun`` as a method of the module: ``LossCall(...)(module, *rest)`` calls ``fun`` with
    ``wrapper._wrap(module, programs)`` (the rebuilt module, wrapped as the user's was) inserted at
    ``position``. Hashable (it keys the compile cache)."""

    fun: Callable[..., Any]
    position: int
    has_aux: bool
    wrapper: Any = None
    programs: Any = None
    reads: tuple = ()  #: :func:`closure_key` of ``fun`` when traced: another value traces again
    #: ``(index among the other arguments, value)`` of the Python values passed (:func:`split_statics`)
    statics: tuple = ()
    static_kwargs: tuple = ()  #: ``(name, value)`` of the Python values passed by keyword
    #: Where the aux of the last trace holds the module's own Variables and submodules (:func:`module_links.links`,
    #: key 0: the module): the caller gets its own objects there, as from ``nnx.value_and_grad``. Not compared.
    aux_links: list = dataclasses.field(default_factory=list, compare=False, hash=False, repr=False)

    def __call__(self, module: nnx.Module, *args: Any, **kwargs: Any) -> Any:
        if self.wrapper is not None:
            module = self.wrapper._wrap(module, self.programs)
        if self.statics:
            args = list(args)
            for i, value in self.statics:
                args.insert(i, value)
        out = self.fun(*args[: self.position], module, *args[self.position:], **kwargs, **dict(self.static_kwargs))
        if self.has_aux and isinstance(out, (tuple, list)) and len(out) == 2:
            self.aux_links[:] = [module_links.links(out[1], {0: module})]
        return out

    @property
    def __name__(self) -> str:  # CallStatic's repr names the method
        return getattr(self.fun, "__name__", "loss_fn")

    def change_from(self, old: Any) -> str | None:
        """What differs from ``old``, the loss of another trace, in words (a compile's reason): the function, a
        Python value passed to it (by its position in the loss's call), or what it reads (:func:`closure_key`)."""
        if type(old) is not LossCall:
            return None
        name, parts = self.__name__, []
        if old.fun is not self.fun:
            parts.append(f"loss function {old.__name__} → {name} (another function object)")
        names = ArgNames.of(self.fun)  # by position among the loss's arguments, the module's too
        at = lambda i: names(i if i < self.position else i + 1)  # noqa: E731
        for (was, now, label) in ((dict(old.statics), dict(self.statics), lambda i: f"argument {at(i)}"),
                                  (dict(old.static_kwargs), dict(self.static_kwargs), lambda k: f"argument {k!r}")):
            for key in sorted({*was, *now}, key=str):
                if was.get(key, _GONE) != now.get(key, _GONE):
                    show = lambda v: "not a Python value" if v is _GONE else repr(v)  # noqa: E731
                    parts.append(f"{name}'s {label(key)}: {show(was.get(key, _GONE))} → {show(now.get(key, _GONE))}")
        if old.reads != self.reads:
            named = [now[0] for was, now in zip(old.reads, self.reads) if was != now and _is_named(now)]
            parts.append(f"what {name} reads changed: {', '.join(named)}" if named and len(old.reads) == len(
                self.reads) else f"what {name} reads changed (its closure or globals)")
        return "; ".join(parts) or None


_GONE = object()


def _is_named(read: Any) -> bool:
    """Whether a :func:`closure_key` part is a global's ``(name, key)`` (else a closure cell's key)."""
    return type(read) is tuple and len(read) == 2 and type(read[0]) is str


def _needs_nnx(args: tuple, kwargs: dict) -> bool:
    """Whether the call must go through ``nnx.value_and_grad``: traced inputs, or Flax objects besides the module."""
    if not kwargs and all(type(a) is _ARRAY for a in args):  # the common case: arrays only
        return False
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, _FLAX_OBJECTS))
    return any(C.is_tracer(x) or isinstance(x, _FLAX_OBJECTS) for x in leaves)


_ARRAY = C.ArrayImpl
_MAX_LOSS_STATICS = 64  # a new loss function per step (a lambda made in the loop) compiles anew anyway


def split_statics(args: tuple, kwargs: dict, numbers: bool = False) -> tuple[tuple, tuple, tuple, dict]:
    """``(static positional, other positional, static keywords, other keywords)``: the Python values among a loss's
    other arguments (a bool flag, a string, a function; hashable and no array) are passed to it as they are, as
    ``nnx.value_and_grad`` passes them, and key its program (each new value traces it again); arrays and pytrees of
    them are the program's inputs. Python numbers are inputs too (a loss weight given each step compiles once),
    unless ``numbers``: for a loss whose Python reads their values (``x[:n]``, ``if beta > 0``)."""
    if not kwargs and all(type(a) is _ARRAY for a in args):  # the common case: arrays only
        return (), args, (), kwargs
    statics = tuple((i, a) for i, a in enumerate(args) if python_static(a, numbers))
    at = {i for i, _ in statics}
    static_kwargs = tuple((k, v) for k, v in kwargs.items() if python_static(v, numbers))
    named = {k for k, _ in static_kwargs}
    return (statics, tuple(a for i, a in enumerate(args) if i not in at), static_kwargs,
            {k: v for k, v in kwargs.items() if k not in named})


class PreparedLoss:
    """``fun(*args, **kwargs)`` with ``args[position]`` an ``AOTModule``, as inputs of its loss program.

    Attributes:
      inputs: the loss program's positional arguments ``(static, parameter leaves, frozen state,
        *other args)`` (the keyword arguments are the call's own).
    """

    def __init__(self, model: nnx.Module, split: ModuleSplit, inputs: tuple, leaves: list, rest: tuple,
                 kwargs: dict):
        self.model = model
        self.split = split
        self.inputs = inputs
        self._leaves = leaves
        self._rest = rest
        self._kwargs = kwargs

    @classmethod
    def of(cls, model: nnx.Module, fun: Callable[..., Any], position: int, args: tuple, kwargs: dict,
           has_aux: bool, numbers: bool = False) -> "PreparedLoss | None":
        """The prepared call, or None where it must be ``nnx.value_and_grad`` itself; ``numbers``: Python numbers
        among the arguments are static (:func:`split_statics`)."""
        rest = args[:position] + args[position + 1:]
        statics, rest, static_kwargs, kwargs = split_statics(rest, kwargs, numbers)
        split = split_of(model, model.wrapped)
        if split.traced or _needs_nnx(rest, kwargs):
            return None
        if len(split._statics) > _MAX_LOSS_STATICS:
            split._statics.clear()

        def build() -> CallStatic:
            method = LossCall(fun, position, has_aux, type(model), model.programs, reads, statics, static_kwargs)
            check_static("loss function", method)
            return CallStatic(split.graphdef, method, (), (), param_tree=split.param_tree)

        reads = closure_key(fun)
        static = split.static(("loss", fun, position, has_aux, reads, statics, static_kwargs), build)
        params, state = split.leaves()
        inputs = (static, params, FrozenState.of_leaves(split.rest_tree, state, False), *rest)
        return cls(model, split, inputs, params + state, rest, kwargs)

    @property
    def kwargs(self) -> dict:
        """The keyword arguments the loss program takes (the Python values among them are its statics)."""
        return self._kwargs

    def relinked(self, aux: Any) -> Any:
        """``aux`` with the module's own Variables and submodules where the loss returned those of the module it
        ran on (written back already: call after :meth:`finish`)."""
        method = self.inputs[0].method
        return module_links.relink(aux, method.aux_links[0], {0: self.model}) if method.aux_links else aux

    def finish(self, delta: Any, grads: list) -> nnx.State:
        """Write the changed state (the loss program's ``StateDelta``, or None) back into the module,
        and return the gradients (the parameters' flat leaves) as an ``nnx.State``, remembering their
        parameters for the optimizer's update."""
        same = delta is None or not delta.sources or write_back(
            self.model.wrapped, self.split, delta,
            lambda: self._leaves + jax.tree_util.tree_leaves((self._rest, self._kwargs)))
        state = jax.tree_util.tree_unflatten(self.split.param_tree, grads)
        if same and self.split.plain:
            remember(state, self.model, self.split)
        return state


__all__ = ["LossCall", "PreparedLoss", "has_numbers", "split_statics"]
