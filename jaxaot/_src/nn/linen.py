"""``AOTLinenModule``: a ``flax.linen`` module whose ``apply`` runs through :func:`jaxaot.aot_function`.

Linen is functional already, so the wrapper compiles ``apply`` as
:func:`~jaxaot._src.nn.pure.linen_pure`, with the ``"params"`` collection as
parameters and the others as state. The wrapper is itself a Linen module with the
wrapped module's variables at the same paths: at the top level, or as a submodule
sharing its scope (``nn.share_scope``) and writing the returned collections back.
Wrappers of equal modules with the same options share their programs, so building
one in ``setup`` compiles once.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from flax import linen as nn
    >>> dense = AOTLinenModule.of(nn.Dense(2), (), ())
    >>> variables = dense.init(jax.random.key(0), jnp.ones((1, 3)))
    >>> jax.tree.structure(variables) == jax.tree.structure(nn.Dense(2).init(jax.random.key(0), jnp.ones((1, 3))))
    True
    >>> dense.apply(variables, jnp.ones((1, 3))).shape
    (1, 2)
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Mapping

from flax import linen as nn
from flax.linen import module as linen_module

from jaxaot.errors import InvalidInputError, StaticArgumentError
from jaxaot._src.nn.module_call import CallStatic, ModuleCall, run_reading_numbers
from jaxaot._src.nn.metadata import ModuleLowered
from jaxaot._src.nn.pure import linen_pure
from jaxaot._src.nn.python_values import hashable
from jaxaot._src.runtime import AOTFunction, CacheInfo, aot_function


def _normalize_mutable(mutable: Any) -> Any:
    # Hashable and canonical, so that equal filters share a compiled entry (a DenyList's filter too).
    if isinstance(mutable, (list, tuple, set, frozenset)):
        return tuple(sorted(mutable))
    if isinstance(mutable, nn.DenyList):
        return nn.DenyList(_normalize_mutable(mutable.deny))
    return mutable


def _as_state_pair(variables: Mapping[str, Any]) -> tuple:
    # (params, other collections): the pair the pure function takes and its delta describes.
    return variables.get("params"), {k: v for k, v in variables.items() if k != "params"}


def _from_state_pair(params: Any, others: dict) -> dict:
    return {**({"params": params} if params is not None else {}), **others}


def parent_capture() -> Any:
    """The ``capture_intermediates`` filter of the ``apply`` running now (what Flax's own module calls read,
    ``flax.linen.module._context.capture_stack``): a ``(module, method_name) -> bool``, or False."""
    stack = getattr(getattr(linen_module, "_context", None), "capture_stack", None)
    return (stack[-1] or False) if stack else False


def _as_one_apply(wrapper: nn.Module, capture: Any, new: Mapping, old: Mapping) -> dict:
    """The intermediates a wrapped call returned (its own ``apply``), as the parent's one ``apply`` of the plain
    module sows them: the wrapper's call is a Linen method, so the parent's filter sows its output as it would
    the wrapped module's (the wrapped call's own ``__call__`` entry is left to it); and a ``setup``, which runs
    once per ``apply``, keeps the entry it sowed at its first call."""
    out = dict(new)
    if capture(wrapper, "__call__"):
        out.pop("__call__", None)
    return _setup_once(out, old)


def _setup_once(new: Mapping, old: Mapping) -> dict:
    out = {}
    for key, value in new.items():
        if key == "setup" and key in old:
            out[key] = old[key]
        elif isinstance(value, Mapping):
            out[key] = _setup_once(value, old.get(key, {}) if isinstance(old.get(key), Mapping) else {})
        else:
            out[key] = value
    return out


def _unbound(module: nn.Module) -> nn.Module:
    """``module`` as a root (no parent, no name): the program's static part, equal for equal fields."""
    return module if module.parent is None and module.name is None else module.clone(parent=None, name=None)


class LinenPrograms:
    """One wrapped Linen module's program and options; hashable by identity, shared by equal wrappers."""

    def __init__(self, static_argnums: tuple, static_argnames: tuple, aot_kwargs: dict):
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.aot_kwargs = dict(aot_kwargs)
        self.program: AOTFunction = aot_function(linen_pure, static_argnums=0, **self.aot_kwargs)
        self.reads_numbers = False  #: numbers passed are statics (``module_call.run_reading_numbers``)

    def __copy__(self) -> "LinenPrograms":
        return self

    def __deepcopy__(self, memo: Any) -> "LinenPrograms":
        return self

    def __reduce__(self) -> tuple:
        return LinenPrograms, (self.static_argnums, self.static_argnames, self.aot_kwargs)


_SHARED: dict[Any, LinenPrograms] = {}
_LOCK = threading.Lock()


def _programs_for(module: nn.Module, static_argnums: tuple, static_argnames: tuple,
                  aot_kwargs: dict) -> LinenPrograms:
    """The programs of ``module`` (unbound) with these options: built once per equal module and options."""
    _check_hashable(module)
    options = tuple(sorted((k, v if hashable(v) else ("id", id(v))) for k, v in aot_kwargs.items()))
    key = (module, static_argnums, static_argnames, options)
    with _LOCK:
        programs = _SHARED.get(key)
        if programs is None:
            programs = _SHARED[key] = LinenPrograms(static_argnums, static_argnames, aot_kwargs)
    return programs


def _check_hashable(module: nn.Module, path: str = "") -> None:
    """Raise :class:`StaticArgumentError` naming the field of ``module`` (or of a submodule field) with no hash."""
    if hashable(module):
        return
    for field in dataclasses.fields(module):
        value = getattr(module, field.name, None)
        if field.name in ("parent", "name") or hashable(value):
            continue
        where = f"{path}{type(module).__name__}.{field.name}"
        owned = _owned_elsewhere(value)
        if owned:
            names = ", ".join(f"{type(m).__name__} {m.name or ''}".strip() for m in owned)
            owner = type(owned[0].parent).__name__
            raise StaticArgumentError(
                f"the Linen module's field {where} holds Linen modules bound to another module ({names}, built "
                f"inside {owner}'s compact method or setup, belong to {owner}); aot_module compiles a module with "
                "the submodules it creates itself or holds unbound. Build them inside a Linen module of your own and "
                "wrap that module (a class whose compact __call__ returns nn.Sequential([nn.Dense(4), "
                "nn.Dense(2)])(x), say), or wrap the parent module itself.")
        if isinstance(value, nn.Module):
            _check_hashable(value, f"{where} -> ")
        raise StaticArgumentError(
            f"the Linen module's field {where} is a {type(value).__name__}, which has no hash: aot_module keys the "
            "compiled programs on the Linen module, so its fields must be hashable. Give it a "
            "flax.core.FrozenDict instead of a dict, a tuple instead of a list.")


def _owned_elsewhere(value: Any) -> list:
    """The Linen modules in ``value`` (a module, or a tuple, list or dict of them) that another module holds."""
    if isinstance(value, nn.Module):
        return [value] if isinstance(value.parent, nn.Module) else []
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
    return [m for item in items for m in _owned_elsewhere(item)]


class AOTLinenModule(nn.Module):
    """A Linen module whose ``apply`` runs through :func:`jaxaot.aot_function`; its variables are ``wrapped``'s.

    Build one with :func:`aot_module`. ``init`` is the wrapped module's;
    ``apply`` has linen's signature and return value: ``out``, or
    ``(out, updated_collections)`` when ``mutable`` is set. As a submodule of a
    plain Linen module it compiles the wrapped module's ``__call__`` and keeps
    the parent's variable paths (module docstring).
    """

    wrapped: nn.Module
    programs: Any = None

    @classmethod
    def of(cls, module: nn.Module, static_argnums: tuple, static_argnames: tuple,
           **aot_kwargs: Any) -> "AOTLinenModule":
        """The wrapper of ``module`` (``aot_kwargs`` as in :func:`jaxaot.aot_function`)."""
        return cls(module, _programs_for(_unbound(module), static_argnums, static_argnames, aot_kwargs))

    @nn.nowrap  # not a Linen method: a parent's capture_intermediates sows no 'setup' of the wrapper
    def setup(self) -> None:
        nn.share_scope(self, self.wrapped)

    # ------------------------------------------------------------------ as a submodule
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_method("__call__", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Another public method of the wrapped module (``self.ae.encode(x)`` in a parent), compiled as ``__call__`` is:
        the same program path as ``__call__``, with that method."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            wrapped = self.__dict__.get("wrapped")
            if name.startswith("_") or not callable(getattr(type(wrapped), name, None)):
                raise
            return functools.partial(self._call_method, name)

    @nn.nowrap  # a helper, not a Linen method: a parent's capture_intermediates sows the method called, not it
    def _call_method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's method ``name`` run on this submodule's variables, compiled, its mutated collections
        written back to the parent's scope (during ``init``: the wrapped module's own method, as Linen runs it)."""
        method = None if name == "__call__" else name
        if self.is_initializing():
            return getattr(self.wrapped, name)(*args, **kwargs)
        scope = self.scope
        mutable = _normalize_mutable(scope.mutable) or False
        rngs = {name: self.make_rng(name) for name in sorted(scope.rngs)} or None
        capture = parent_capture()
        variables, module = dict(self.variables), _unbound(self.wrapped)
        out, new_state = run_reading_numbers(self.programs, args, kwargs, lambda numbers: self._prepare(
            variables, args, kwargs, rngs=rngs, method=method, mutable=mutable, capture_intermediates=capture,
            module=module, numbers=numbers).run_rebuilt())
        if new_state is None:
            return out
        new_state = _from_state_pair(*new_state)
        if capture and "intermediates" in new_state:
            new_state["intermediates"] = _as_one_apply(self, capture, new_state["intermediates"],
                                                       variables.get("intermediates", {}))
        for collection, tree in new_state.items():
            for name, value in tree.items():
                scope.put_variable(collection, name, value)
        return out

    # ------------------------------------------------------------------ at the top level
    def init(self, rngs: Any, *args: Any, **kwargs: Any) -> Any:
        """``wrapped.init(rngs, *args, **kwargs)``: the wrapped module's variables."""
        return self.wrapped.init(rngs, *args, **kwargs)

    def init_with_output(self, rngs: Any, *args: Any, **kwargs: Any) -> Any:
        """``wrapped.init_with_output(rngs, *args, **kwargs)``."""
        return self.wrapped.init_with_output(rngs, *args, **kwargs)

    def tabulate(self, rngs: Any, *args: Any, **kwargs: Any) -> str:
        """``wrapped.tabulate(rngs, *args, **kwargs)``: the wrapped module's summary table (its variables)."""
        return self.wrapped.tabulate(rngs, *args, **kwargs)

    @nn.nowrap  # a helper, not a Linen method: a parent's capture_intermediates must not sow its ModuleCall
    def _prepare(self, variables: Mapping[str, Any], args: tuple, kwargs: dict, *, rngs: Any = None,
                 method: Any = None, mutable: Any = False, capture_intermediates: Any = False,
                 freeze: bool | None = None, module: nn.Module | None = None, numbers: bool = False) -> ModuleCall:
        if not isinstance(variables, Mapping):
            raise InvalidInputError(
                f"apply expects the variables mapping ({{'params': ...}}), got {type(variables).__name__}."
            )
        programs = self.programs
        static, args, kwargs = CallStatic.split(
            args, kwargs, programs.static_argnums, programs.static_argnames,
            graphdef=_unbound(self.wrapped) if module is None else module, method=method,
            mutable=_normalize_mutable(mutable), capture_intermediates=capture_intermediates,
            numbers=numbers or programs.reads_numbers)
        return ModuleCall(programs.program, static, _as_state_pair(variables), args, kwargs,
                          extra=(("rngs", rngs),), freeze=freeze)

    @nn.nowrap
    def prepare_call(self, variables: Mapping[str, Any], args: tuple, kwargs: dict, *, rngs: Any = None,
                     method: Any = None, mutable: Any = False, capture_intermediates: Any = False,
                     freeze: bool | None = None) -> ModuleCall:
        """This call, prepared for the module's program: what ``apply``, ``lower`` and
        :func:`~jaxaot.nn.aot_export_module` run first.

        The keywords are ``apply``'s. ``freeze``: pass the state other than the parameters in
        frozen, so that it gets no cotangents; None: when any input is traced, i.e. when the call
        may be differentiated.
        """
        return self._prepare(variables, args, kwargs, rngs=rngs, method=method, mutable=mutable,
                             capture_intermediates=capture_intermediates, freeze=freeze)

    def apply(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> Any:
        """``module.apply(variables, *args, rngs=..., method=..., mutable=..., **kwargs)``, compiled.

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> bn = nn.BatchNorm(use_running_average=False)
            >>> variables = bn.init(jax.random.key(0), jnp.ones((2, 3)))
            >>> y, updates = jaxaot.nn.aot_module(bn).apply(variables, jnp.ones((2, 3)), mutable=["batch_stats"])
            >>> sorted(updates)
            ['batch_stats']
        """
        out, new_state = run_reading_numbers(self.programs, args, kwargs, lambda numbers: self._prepare(
            variables, args, kwargs, rngs=rngs, method=method, mutable=mutable,
            capture_intermediates=capture_intermediates, numbers=numbers).run_rebuilt())
        return out if new_state is None else (out, _from_state_pair(*new_state))

    def lower(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> ModuleLowered:
        """Build everything for this ``apply`` signature (as traced) and describe it (see :class:`AOTModule.lower`)."""
        call = self.prepare_call(variables, args, kwargs, rngs=rngs, method=method, mutable=mutable,
                                 capture_intermediates=capture_intermediates, freeze=True)
        return call.lower()

    def cache_info(self) -> CacheInfo:
        """The compile cache of the underlying :class:`jaxaot.AOTFunction` (shared by equal wrappers).

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> m = jaxaot.nn.aot_module(nn.Dense(7))
            >>> variables = m.init(jax.random.key(0), jnp.ones((1, 3)))
            >>> _ = m.apply(variables, jnp.ones((1, 3)))
            >>> m.cache_info().entries[0].executables
            ('inference',)
        """
        return self.programs.program.cache_info()
