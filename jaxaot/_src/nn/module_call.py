"""One prepared module call: its static arguments and the program arguments the runtime compiles.

Both wrappers compile ``pure(static, params, state, *extra, *args, **kwargs) ->
(outputs, StateDelta | None)`` with ``aot_function(pure, static_argnums=0)``.
:class:`CallStatic` is what about a call is a compile-time constant (it keys the
compile cache); :class:`ModuleCall` is one call split into that and the program
arguments, and runs, lowers or exposes the program for export. Internal to the
package.

Example:
    >>> static, args, kwargs = CallStatic.split((1.0, "relu"), {"train": True}, (1,), ("train",),
    ...                                          graphdef=None, method="__call__")
    >>> static, args, kwargs
    (<linen method='__call__' arg[1]='relu' train=True>, (1.0,), {})
    >>> static.merge(args, kwargs)
    ((1.0, 'relu'), {'train': True})
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx  # noqa: F401 - imported here, before flax_objects() reads its types

from jaxaot._src.python_reads import SCALARS, flax_objects
from jaxaot._src import compat as C
from jaxaot._src.pytrees import describe_path
from jaxaot.errors import InvalidInputError
from jaxaot._src.nn.metadata import ModuleLowered, build_metadata, user_input_names
from jaxaot._src.nn.python_values import attribute_changes, graph_hash, same_value
from jaxaot._src.nn.state import FrozenState, leaf_fqns
from jaxaot._src.runtime import AOTFunction

#: What ``method=`` names: a method name, or ``fn(module, *args, **kwargs)``.
Method = str | Callable[..., Any]

_FLAX_OBJECTS = flax_objects()

#: What JAX raises where Python reads the value of a traced number (``x[:n]``, ``range(n)``, ``jnp.zeros(n)``, a
#: shape's ``TypeError``): a call given numbers is traced again with them static (:func:`run_reading_numbers`).
READS_A_NUMBER = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError, IndexError, TypeError)


# --------------------------------------------------------------------------- statics
def check_static(name: str, value: Any) -> None:
    """Raise :class:`InvalidInputError` unless ``value`` can key the compile cache."""
    try:
        hash(value)
    except TypeError:
        raise InvalidInputError(
            f"static argument {name} of type {type(value).__name__} is not hashable. Static arguments key the "
            "compile cache: pass a hashable value (a tuple instead of a list, say)."
        ) from None


def python_static(x: Any, numbers: bool = False) -> bool:
    """Whether ``x`` is a Python value a call takes as it is, as eager Flax does, and which keys its program: a
    bool, a string, None, a function (hashable, no array, no container). A number (not a bool) only with
    ``numbers``: otherwise a number is a program input (a weight given each call compiles once).

    Example:
        >>> [python_static(v) for v in (True, "relu", None, len, 3, (1, 2))], python_static(3, numbers=True)
        ([True, True, True, True, False, False], True)
    """
    if isinstance(x, (jax.Array, np.ndarray, np.generic, list, dict, tuple, _FLAX_OBJECTS)) or C.is_tracer(x):
        return False
    if not (isinstance(x, SCALARS) or callable(x)):
        return False
    if not numbers and isinstance(x, (int, float, complex)) and not isinstance(x, bool):
        return False
    try:
        hash(x)
    except TypeError:
        return False
    return True


def has_numbers(args: tuple, kwargs: dict) -> bool:
    """Whether a call passes Python numbers (not bools) at the top level of its arguments."""
    return any(isinstance(a, (int, float, complex)) and not isinstance(a, bool) for a in (*args, *kwargs.values()))


def run_reading_numbers(programs: Any, args: tuple, kwargs: dict, run: Callable[[bool], Any]) -> Any:
    """``run(numbers)``: first with Python numbers among ``args`` / ``kwargs`` as program inputs, and, where the
    module's Python reads the value of one (:data:`READS_A_NUMBER`), again with them static, which
    ``programs.reads_numbers`` then keeps for later calls."""
    if programs.reads_numbers:
        return run(True)
    try:
        return run(False)
    except READS_A_NUMBER:
        if not has_numbers(args, kwargs):
            raise
    out = run(True)
    programs.reads_numbers = True
    return out


@dataclasses.dataclass(frozen=True)
class CallStatic:
    """Compile-time constants of one call; they key the compile cache (hashable).

    ``graphdef`` is the nnx module's structure, or the Linen module (unbound:
    Linen modules compare by their fields); ``static_args`` are ``(position, value)`` pairs,
    ``static_kwargs`` sorted ``(name, value)`` pairs; ``mutable`` and
    ``capture_intermediates`` are linen's ``apply`` options; ``param_tree``
    (nnx) is the parameters' tree structure, the parameters travelling as
    their flat leaves. The hash is computed once, at construction: hashing a
    ``GraphDef`` walks all of it, so a call that reuses its ``CallStatic``
    (:mod:`jaxaot._src.nn.split_cache`) pays it once.
    """

    graphdef: Any
    method: Any
    static_args: tuple
    static_kwargs: tuple
    mutable: Any = False
    capture_intermediates: Any = False
    param_tree: Any = None
    _hash: int = dataclasses.field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rest = (self.method, self.static_args, self.static_kwargs, self.mutable, self.capture_intermediates,
                self.param_tree)
        try:
            value = hash((self.graphdef, *rest))
        except TypeError:  # a plain dict or list attribute of the module: hashed by its contents
            value = hash((graph_hash(self.graphdef), *rest))
        object.__setattr__(self, "_hash", value)

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def split(cls, args: tuple, kwargs: dict, argnums: Sequence[int], argnames: Sequence[str], *,
              graphdef: Any, method: Any, mutable: Any = False, capture_intermediates: Any = False,
              param_tree: Any = None, cache: Callable[[Any, Callable[[], Any]], Any] | None = None,
              numbers: bool = False) -> tuple["CallStatic", tuple, dict]:
        """``(statics, dynamic positional, dynamic keyword)`` of a call.

        Besides ``argnums`` and ``argnames``, the Python values passed (a ``train`` flag, a mode name; numbers
        too with ``numbers``, :func:`python_static`) are statics, as eager Flax reads them.
        ``cache(key, build)``, when given, returns a :class:`CallStatic` built
        earlier for the same method and static values (``build()`` otherwise).

        Raises:
          InvalidInputError: a static position is past the arguments, a static
            value is unhashable, or a dynamic argument holds an nnx Module or Variable.
        """
        for i in argnums:
            if i >= len(args):
                raise InvalidInputError(
                    f"static_argnums contains {i}, but the module was called with {len(args)} positional arguments."
                )
        if kwargs or not all(type(a) is C.ArrayImpl for a in args):  # Python values passed: statics too
            argnums = sorted({*argnums, *(i for i, a in enumerate(args) if python_static(a, numbers))})
            argnames = {*argnames, *(k for k, v in kwargs.items() if python_static(v, numbers))}
        s_args = tuple((i, args[i]) for i in argnums)
        s_kwargs = tuple(sorted((k, kwargs[k]) for k in argnames if k in kwargs))
        for i, v in s_args:
            check_static(f"arg[{i}]", v)
        for k, v in s_kwargs:
            check_static(f"kwarg[{k!r}]", v)
        d_args = tuple(a for i, a in enumerate(args) if i not in argnums) if argnums else args
        d_kwargs = {k: v for k, v in kwargs.items() if k not in argnames} if argnames else kwargs
        _check_no_flax_objects(d_args, d_kwargs)
        for name, value in (("method", method), ("mutable", mutable), ("capture_intermediates", capture_intermediates)):
            check_static(name, value)

        def build() -> "CallStatic":
            return cls(graphdef, method, s_args, s_kwargs, mutable, capture_intermediates, param_tree)

        static = build() if cache is None else cache((method, s_args, s_kwargs), build)
        return static, d_args, d_kwargs

    def merge(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The full ``(args, kwargs)`` of the call: the dynamic ones with the statics put back."""
        full = list(args)
        for i, v in self.static_args:  # in increasing position
            full.insert(i, v)
        return tuple(full), {**kwargs, **dict(self.static_kwargs)}

    def change_from(self, old: Any) -> str | None:
        """What differs from ``old``, another call's statics, in words (a compile's reason): the method, static
        arguments, ``apply`` options, the parameters' structure, or the module attributes by path."""
        if type(old) is not CallStatic:
            return None
        parts = []
        if old.method != self.method:  # a loss says what of it changed (jaxaot._src.nn.loss_call.LossCall)
            said = self.method.change_from(old.method) if hasattr(self.method, "change_from") else None
            parts.append(said or f"method {_name(old.method)} → {_name(self.method)}")
        for pairs, old_pairs, name, absent in ((self.static_args, old.static_args, self._arg_name, "not static"),
                                               (self.static_kwargs, old.static_kwargs, str, "not passed")):
            now, was = dict(pairs), dict(old_pairs)
            for k in [*was, *(k for k in now if k not in was)]:  # an argument left out (a default) too
                a, b = was.get(k, _MISSING), now.get(k, _MISSING)
                if a is _MISSING or b is _MISSING or not same_value(a, b):
                    parts.append(f"{name(k)}: {absent if a is _MISSING else repr(a)} → "
                                 f"{absent if b is _MISSING else repr(b)}")
        for name in ("mutable", "capture_intermediates"):
            if not same_value(getattr(old, name), getattr(self, name)):
                parts.append(f"{name}: {getattr(old, name)!r} → {getattr(self, name)!r}")
        if old.param_tree != self.param_tree:
            parts.append("the parameters' tree structure changed")
        if not same_value(old.graphdef, self.graphdef):
            parts.append(attribute_changes(old.graphdef, self.graphdef) or "the module's structure changed")
        return "; ".join(parts) or None

    def _arg_name(self, position: int) -> str:
        """The method's parameter at ``position`` among the call's arguments (``train``), else ``arg[position]``."""
        method = self.method
        if isinstance(method, str):  # a method named on the module's class
            method = getattr(_root_type(self.graphdef) if hasattr(self.graphdef, "nodes") else self.graphdef,
                             method, None)
        try:
            names = [p.name for p in inspect.signature(method).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):  # no signature to read (a builtin, a loss program)
            names = []
        names = names[1:]  # the module, whatever the method calls it (``self``, ``me``; ``fn(module, ...)``)
        return f"{names[position]} (arg[{position}])" if position < len(names) else f"arg[{position}]"

    def __repr__(self) -> str:  # the graphdef's own repr runs to pages
        if self.graphdef is None or hasattr(self.graphdef, "nodes"):  # an nnx GraphDef
            owner = "linen" if self.graphdef is None else getattr(_root_type(self.graphdef), "__name__", "nnx")
        else:  # a Linen module
            owner = type(self.graphdef).__name__
        parts = [owner, f"method={getattr(self.method, '__name__', self.method)!r}"]
        parts += [f"arg[{i}]={v!r}" for i, v in self.static_args]
        parts += [f"{k}={v!r}" for k, v in self.static_kwargs]
        if self.mutable is not False:
            parts.append(f"mutable={self.mutable!r}")
        return f"<{' '.join(parts)}>"


_MISSING = object()


def _name(method: Any) -> str:
    return repr(getattr(method, "__name__", method))


def _root_type(graphdef: Any) -> Any:
    nodes = getattr(graphdef, "nodes", None)
    return getattr(nodes[0], "type", None) if nodes else None


def _check_no_flax_objects(args: tuple, kwargs: dict) -> None:
    if not kwargs and all(type(a) is C.ArrayImpl for a in args):  # the common case: arrays only
        return

    def is_flax(x):
        return isinstance(x, _FLAX_OBJECTS)

    for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs), is_leaf=is_flax)[0]:
        if is_flax(leaf):
            raise InvalidInputError(
                f"{describe_path('input', path)} is a {type(leaf).__name__}: aot_module writes back only the "
                "state of the module it wraps. Make it a submodule (or an attribute) of that module, or pass "
                "plain arrays."
            )


# --------------------------------------------------------------------------- one call
def _differentiated_state(rest: Any) -> InvalidInputError:
    """The error for state other than parameters under ``jax.grad`` (``rest``: that state), naming its first
    differentiated leaf: aot_module differentiates parameters only and would return zeros for it."""
    path = next((p for p, x in jax.tree_util.tree_flatten_with_path(rest)[0]
                 if C.is_differentiated(x) and C.is_inexact(x.dtype)), ())
    return InvalidInputError(
        f"module state that is not a parameter is being differentiated ({jax.tree_util.keystr(path) or 'a leaf'}): "
        "aot_module differentiates parameters only (nnx.Param, Linen's 'params') and would return zeros for it. "
        "nnx: make that Variable an nnx.Param (a subclass of it), or leave it out of nnx.grad's DiffState and an "
        "optimizer's wrt. Linen: differentiate variables['params'] and pass the other collections as they are. Or "
        "differentiate the module without aot_module.")


class ModuleCall:
    """One module call, prepared for its program.

    Args:
      program: the :class:`jaxaot.AOTFunction` of the wrapper's pure function.
      static: the call's :class:`CallStatic`.
      state: ``(params, other state)`` as the module holds them (trees).
      args, kwargs: the dynamic user arguments.
      extra: ``(label, value)`` program inputs before the user's (linen's ``("rngs", rngs)``).
      freeze: freeze the other state (see :mod:`jaxaot._src.nn.state`); None: when
        any input is traced, i.e. when the call may be differentiated.
      leaves, rest_tree: ``(parameter leaves, other state leaves)`` and the other
        state's tree structure when the caller has them
        (:class:`~jaxaot._src.nn.split_cache.ModuleSplit`), else read from ``state``.

    With ``static.param_tree`` set (nnx), the parameters go into the program as
    their flat leaves (a list, which the runtime flattens in C++), else as the tree.
    """

    def __init__(self, program: AOTFunction, static: CallStatic, state: tuple, args: tuple, kwargs: dict, *,
                 extra: Sequence[tuple[str, Any]] = (), freeze: bool | None = None,
                 leaves: tuple[list, list] | None = None, rest_tree: Any = None):
        self.program = program
        self.static = static
        self.state = state
        self.extra = tuple(extra)
        self.args = args
        self.kwargs = kwargs
        if leaves is None:
            leaves = (jax.tree_util.tree_leaves(state[0]), jax.tree_util.tree_leaves(state[1]))
        self.state_leaves = leaves[0] + leaves[1]
        if freeze is None:
            freeze = any(map(C.is_tracer, self.state_leaves)) or any(
                map(C.is_tracer, jax.tree_util.tree_leaves((self._extra_values, args, kwargs))))
        self.params_input = leaves[0] if static.param_tree is not None else state[0]
        if rest_tree is None:
            rest_tree = jax.tree_util.tree_structure(state[1])
        if freeze and any(C.is_differentiated(x) and C.is_inexact(x.dtype) for x in leaves[1]):  # (an RNG count
            # written back by an earlier call under the same jax.grad is a tracer too, of an integer: not one)
            raise _differentiated_state(state[1])
        self.frozen = FrozenState.of_leaves(rest_tree, leaves[1], freeze)

    @property
    def _extra_values(self) -> tuple:
        return tuple(v for _, v in self.extra)

    @property
    def dynamic(self) -> tuple[tuple, dict]:
        """``(positional, keyword)`` program arguments after the static one."""
        return (self.params_input, self.frozen, *self._extra_values, *self.args), self.kwargs

    @property
    def user_inputs(self) -> Any:
        """The user's inputs as a tree: ``(args, kwargs)``, after the extra ones (``(rngs, (args, kwargs))``)."""
        user = (self.args, self.kwargs)
        return (*self._extra_values, user) if self.extra else user

    def input_names(self) -> list[tuple[str, str]]:
        """``(name, kind)`` per flat program input: parameters, state, then user inputs."""
        params, state = self.state
        names = [(n, "parameter") for n in leaf_fqns(params)] + [(n, "state") for n in leaf_fqns(state)]
        return names + user_input_names([*self.extra, ("input", (self.args, self.kwargs))])

    def flat_inputs(self) -> list:
        """The flat program inputs a :class:`~jaxaot._src.nn.state.StateDelta` indexes: state leaves, then the user's."""
        return self.state_leaves + jax.tree_util.tree_leaves(((*self._extra_values, *self.args), self.kwargs))

    def pure(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """The program's pure function with this call's statics, on other dynamic arguments (for tracing)."""
        return self.program.fn(self.static, *args, **kwargs)

    def run(self) -> tuple[Any, Any]:
        """Run the program: ``(outputs, StateDelta or None)`` (None: the call returns no state)."""
        args, kwargs = self.dynamic
        return self.program(self.static, *args, **kwargs)

    def run_rebuilt(self) -> tuple[Any, Any]:
        """Run the program: ``(outputs, new (params, other state))``, the state None if the call returns none."""
        out, delta = self.run()
        return out, (None if delta is None else delta.rebuild(self.flat_inputs()))

    def lower(self) -> ModuleLowered:
        """``program.lower`` for this call, with the :class:`CallMetadata` of its inputs and outputs."""
        args, kwargs = self.dynamic
        lowered = self.program.lower(self.static, *args, **kwargs)
        return ModuleLowered(lowered, build_metadata(lowered, self.input_names()))
