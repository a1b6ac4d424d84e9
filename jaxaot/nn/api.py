"""Flax modules through :func:`jaxaot.aot_function`, with their state written back.

A Flax module's call is turned into a pure function
``(static, params, state, *args, **kwargs) -> (out, delta)`` and compiled with
``aot_function``:

* *parameters* (``nnx.Param``; linen's ``"params"`` collection) are the
  differentiable inputs;
* the rest of the *state* (``BatchStat``, ``RngCount``/``RngKey``, user
  ``nnx.Variable``\\ s; linen's other collections) is non-differentiable input;
* *delta* holds the state the call changed. Only changed leaves leave the
  program, and a changed leaf that is literally another input is not an output
  at all: the wrapper takes that input back (the module-level counterpart of
  the runtime's ``output_is_input``). After each call the wrapper writes the
  delta back, leaving the module as eager Flax would.

The runtime differentiates inexact inputs (traced ones, where it can tell) and
gives every inexact output a cotangent. Whenever the call is traced (under
``grad``, ``jit``, ...), floating-point state therefore travels bitcast to an
unsigned integer of the same width: it gets no gradient even under ``jit``, and
mutated state outputs take no cotangent. Eager inference calls pass state as is
(no extra copies) and build only the inference executable.

:class:`CallMetadata` (PyTorch's ``ViewAndMutationMeta`` in JAX terms) describes
each input and output of the compiled program; ``aot_model.lower(...)`` returns it.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))
    >>> aot_model = jaxaot.aot_module(model)
    >>> y = aot_model(jnp.ones((2, 3)))      # batch statistics written back into model
    >>> bool(jnp.all(model.layers[1].mean[...] != 0))
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from jaxaot import _compat as C
from jaxaot.errors import InvalidInputError
from jaxaot.partition.default import default_partition
from jaxaot.runtime.function import AOTFunction, AOTLowered, CacheInfo, PartitionFn, aot_function
from jaxaot._pytrees import describe_path

Method = str | Callable[..., Any]


# --------------------------------------------------------------------------- frozen state
_UINT_OF_WIDTH = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _freezable(x: Any) -> bool:
    # Complex state has no unsigned twin of its width: it stays inexact and is
    # cut from differentiation with stop_gradient instead (see _thaw_leaf).
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _thaw_leaf(x: Any, dtype: Any, frozen: bool) -> Any:
    if dtype is not None:
        return jax.lax.bitcast_convert_type(x, dtype)
    return jax.lax.stop_gradient(x) if frozen and _is_inexact(x) else x


def _is_inexact(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and C.is_inexact(dtype)


@jax.tree_util.register_pytree_node_class
class _Frozen:
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
    def of(cls, tree: Any, freeze: bool) -> "_Frozen":
        leaves, treedef = jax.tree.flatten(tree)
        dtypes = tuple(np.dtype(x.dtype) if freeze and _freezable(x) else None for x in leaves)
        encoded = [x if d is None else jax.lax.bitcast_convert_type(x, _UINT_OF_WIDTH[d.itemsize])
                   for x, d in zip(leaves, dtypes)]
        return cls(treedef, dtypes, freeze, encoded)

    def thaw(self) -> Any:
        leaves = [_thaw_leaf(x, d, self.frozen) for x, d in zip(self.leaves, self.dtypes)]
        return jax.tree.unflatten(self.treedef, leaves)


# --------------------------------------------------------------------------- state delta
@jax.tree_util.register_pytree_node_class
class _Delta:
    """The state a call leaves behind, as the compiled program returns it.

    ``treedef`` is the structure of the new state; per leaf, ``sources[i]`` is the
    flat program input it literally is (no output needed), else None and the
    value is among ``computed`` (in order). ``targets[i]`` is the flat program
    input the leaf overwrites (None for state the call created).
    """

    def __init__(self, treedef: Any, sources: tuple, targets: tuple, computed: _Frozen):
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
    def capture(cls, new_state: Any, old_state: Any, inputs: Sequence[Any], freeze: bool) -> "_Delta":
        """Describe ``new_state`` against the traced ``inputs`` (whose first leaves are ``old_state``'s)."""
        position = {id(x): i for i, x in enumerate(inputs)}
        old_paths = {_path_key(p): i for i, (p, _) in enumerate(jax.tree_util.tree_flatten_with_path(old_state)[0])}
        with_paths, treedef = jax.tree_util.tree_flatten_with_path(new_state)
        sources = tuple(position.get(id(x)) for _, x in with_paths)
        targets = tuple(old_paths.get(_path_key(p)) for p, _ in with_paths)
        computed = [x for (_, x), s in zip(with_paths, sources) if s is None]
        return cls(treedef, sources, targets, _Frozen.of(computed, freeze))

    def rebuild(self, inputs: Sequence[Any]) -> Any:
        """The new state, taking unchanged or aliased leaves from ``inputs``."""
        computed = iter(self.computed.thaw())
        leaves = [next(computed) if s is None else inputs[s] for s in self.sources]
        return jax.tree.unflatten(self.treedef, leaves)

    @property
    def mutated_inputs(self) -> frozenset[int]:
        return frozenset(t for t, s in zip(self.targets, self.sources) if t is not None and s != t)

    def output_targets(self) -> list[int | None]:
        """Per computed leaf (a program output), the input it overwrites."""
        return [t for t, s in zip(self.targets, self.sources) if s is None]

    def encoded_leaves(self, inputs: Sequence[Any]) -> list:
        """Every new-state leaf as it travels (encoded), taking aliased ones from ``inputs``."""
        computed = iter(self.computed.leaves)
        return [next(computed) if s is None else inputs[s] for s in self.sources]

    def names(self) -> list[str]:
        """Dotted names of the new-state leaves (the state pair's index dropped)."""
        dummy = jax.tree.unflatten(self.treedef, list(range(self.treedef.num_leaves)))
        return [fqn(p[1:]) for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]


def _path_key(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path))


def leaf_fqns(tree: Any) -> list[str]:
    """:func:`fqn` of every leaf of a state tree, in flat order."""
    return [fqn(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


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


# --------------------------------------------------------------------------- call metadata
@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One flat input of the compiled program.

    Attributes:
      name: ``lin.kernel`` (parameter), ``bn.mean`` / ``batch_stats.bn.mean``
        (state), ``arg[0]`` / ``kwarg['mask']`` / ``rngs['dropout']`` (user input).
      kind: ``"parameter"``, ``"state"`` or ``"user_input"``.
      differentiable: whether the program computes a gradient for it.
      mutated: whether the call writes a new value to it.
    """

    name: str
    kind: str
    differentiable: bool
    mutated: bool


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """One flat output of the compiled program.

    Attributes:
      name: ``output[0]`` style for user outputs, the state's name for mutated state.
      kind: ``"user_output"`` or ``"mutated_state"``.
      is_input: the flat input this output literally is (the runtime passes it
        through without running anything), else None.
      duplicate_of: an earlier output this one is literally the same value as, else None.
      mutates: for mutated state, the flat input it overwrites (None for state
        the call created).
      takes_cotangent: whether the backward takes a cotangent for it.
    """

    name: str
    kind: str
    is_input: int | None
    duplicate_of: int | None
    mutates: int | None
    takes_cotangent: bool


@dataclasses.dataclass(frozen=True)
class CallMetadata:
    """Per-input and per-output facts of one compiled call (cf. ``ViewAndMutationMeta``)."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.inputs) if x.mutated)

    @property
    def num_mutated_state_outputs(self) -> int:
        return sum(o.kind == "mutated_state" for o in self.outputs)

    def __str__(self) -> str:
        rows = [("input", "kind", "diff", "mutated")]
        rows += [(x.name, x.kind, _yn(x.differentiable), _yn(x.mutated)) for x in self.inputs]
        rows += [("output", "kind", "cotangent", "is_input/dup/mutates")]
        rows += [(o.name, o.kind, _yn(o.takes_cotangent), f"{o.is_input}/{o.duplicate_of}/{o.mutates}")
                 for o in self.outputs]
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _yn(b: bool) -> str:
    return "yes" if b else "no"


@dataclasses.dataclass(frozen=True)
class ModuleLowered:
    """What ``aot_model.lower(...)`` returns: the runtime's view plus :class:`CallMetadata`.

    Attributes:
      lowered: the :class:`jaxaot.AOTLowered` of the pure function; its
        attributes (``forward``, ``backward``, ``joint``, ``saved``, ...) are also
        reachable directly on this object.
      meta: the :class:`CallMetadata` of its flat inputs and outputs.
    """

    lowered: AOTLowered
    meta: CallMetadata

    def __getattr__(self, name: str) -> Any:
        # Everything else (joint, forward, backward, saved, ...) is the runtime's view.
        if name == "lowered":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.lowered, name)


def _duplicates(outvars: Sequence[Any]) -> list[int | None]:
    first: dict = {}
    dup = []
    for j, v in enumerate(outvars):
        if C.is_literal(v):
            dup.append(None)
            continue
        dup.append(first.get(v))
        first.setdefault(v, j)
    return dup


def build_metadata(lowered: AOTLowered, inputs: Sequence[tuple[str, str]], out_names: Sequence[str]) -> CallMetadata:
    """:class:`CallMetadata` from a lowered pure function and the names/kinds of its inputs.

    ``inputs`` is ``(name, kind)`` per flat input; ``out_names`` names the user
    outputs. The program's output tree must be ``(user outputs, _Delta)``.
    """
    joint = lowered.joint
    dummy = jax.tree.unflatten(joint.out_tree, list(range(joint.out_tree.num_leaves)))
    delta: _Delta | None = dummy[1]
    mutated = delta.mutated_inputs if delta is not None else frozenset()
    infos = tuple(
        InputInfo(name, kind, bool(d), i in mutated)
        for i, ((name, kind), d) in enumerate(zip(inputs, joint.differentiable))
    )
    n_user = len(out_names)
    targets = delta.output_targets() if delta is not None else []
    state_names = [n for n, src in zip(delta.names(), delta.sources) if src is None] if delta is not None else []
    outvars = C.jaxpr_of(joint.jaxpr).outvars[: joint.num_outputs]
    dups = _duplicates(outvars)
    outs = []
    for j in range(joint.num_outputs):
        user = j < n_user
        target = None if user else targets[j - n_user]
        name = out_names[j] if user else state_names[j - n_user]
        outs.append(OutputInfo(name, "user_output" if user else "mutated_state", joint.output_is_input[j],
                               dups[j], target, bool(joint.needs_cotangent[j])))
    return CallMetadata(infos, tuple(outs))


# --------------------------------------------------------------------------- call statics
@dataclasses.dataclass(frozen=True)
class _CallStatic:
    """Compile-time constants of one call; they key the compile cache (hashable)."""

    graphdef: Any
    method: Any
    static_args: tuple
    static_kwargs: tuple
    mutable: Any = False
    capture_intermediates: Any = False

    def __repr__(self) -> str:  # the graphdef's own repr runs to pages
        owner = "linen" if self.graphdef is None else getattr(_root_type(self.graphdef), "__name__", "nnx")
        parts = [owner, f"method={getattr(self.method, '__name__', self.method)!r}"]
        parts += [f"arg[{i}]={v!r}" for i, v in self.static_args]
        parts += [f"{k}={v!r}" for k, v in self.static_kwargs]
        if self.mutable is not False:
            parts.append(f"mutable={self.mutable!r}")
        return f"<{' '.join(parts)}>"


def _root_type(graphdef: Any) -> Any:
    nodes = getattr(graphdef, "nodes", None)
    return getattr(nodes[0], "type", None) if nodes else None


def _check_static(name: str, value: Any) -> None:
    try:
        hash(value)
    except TypeError:
        raise InvalidInputError(
            f"static argument {name} of type {type(value).__name__} is not hashable. Static arguments key the "
            "compile cache: pass a hashable value (a tuple instead of a list, say)."
        ) from None


def _split_static(args: tuple, kwargs: dict, argnums: tuple, argnames: tuple) -> tuple[tuple, tuple, tuple, dict]:
    """``(static positional, static keyword, dynamic positional, dynamic keyword)`` of a call."""
    for i in argnums:
        if i >= len(args):
            raise InvalidInputError(
                f"static_argnums contains {i}, but the module was called with {len(args)} positional arguments."
            )
    s_args = tuple((i, args[i]) for i in argnums)
    s_kwargs = tuple(sorted((k, kwargs[k]) for k in argnames if k in kwargs))
    for i, v in s_args:
        _check_static(f"arg[{i}]", v)
    for k, v in s_kwargs:
        _check_static(f"kwarg[{k!r}]", v)
    d_args = tuple(a for i, a in enumerate(args) if i not in argnums)
    d_kwargs = {k: v for k, v in kwargs.items() if k not in argnames}
    _check_no_flax_objects(d_args, d_kwargs)
    return s_args, s_kwargs, d_args, d_kwargs


def _merge_static(static: _CallStatic, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    full = list(args)
    for i, v in static.static_args:
        full.insert(i, v)
    return tuple(full), {**kwargs, **dict(static.static_kwargs)}


_FLAX_OBJECTS = (nnx.Variable, nnx.Module, *((nnx.Pytree,) if hasattr(nnx, "Pytree") else ()))


def _check_no_flax_objects(args: tuple, kwargs: dict) -> None:
    def is_flax(x):
        return isinstance(x, _FLAX_OBJECTS)

    for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs), is_leaf=is_flax)[0]:
        if is_flax(leaf):
            raise InvalidInputError(
                f"{describe_path('input', path)} is a {type(leaf).__name__}: aot_module writes back only the "
                "state of the module it wraps. Make it a submodule (or an attribute) of that module, or pass "
                "plain arrays."
            )


def _invoke(module: Any, method: Any, args: tuple, kwargs: dict) -> Any:
    if isinstance(method, str):
        return getattr(module, method)(*args, **kwargs)
    return method(module, *args, **kwargs)


def _any_tracer(*trees: Any) -> bool:
    return any(C.is_tracer(x) for t in trees for x in jax.tree.leaves(t))


def _user_input_names(args: tuple, kwargs: dict, extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, str]]:
    """``(name, "user_input")`` per flat user input; ``extra`` adds ``(label, tree)`` inputs first."""
    trees = [*extra, ("input", (args, kwargs))]
    with_paths = jax.tree_util.tree_flatten_with_path
    return [(describe_path(label, p), "user_input") for label, tree in trees for p, _ in with_paths(tree)[0]]


def _output_names(out_tree: Any) -> list[str]:
    dummy = jax.tree.unflatten(out_tree, list(range(out_tree.num_leaves)))
    return [describe_path("output", p) for p, _ in jax.tree_util.tree_flatten_with_path(dummy[0])[0]]


# --------------------------------------------------------------------------- nnx
def _leaves_by_path(state: nnx.State) -> dict:
    return {path: jax.tree.leaves(var) for path, var in nnx.to_flat_state(state)}


def _changed_variables(before: dict, new: nnx.State) -> nnx.State:
    """The Variables of ``new`` whose leaves are not those recorded in ``before`` (or are new)."""
    changed = []
    for path, var in nnx.to_flat_state(new):
        prev = before.get(path)
        leaves = jax.tree.leaves(var)
        if prev is None or len(prev) != len(leaves) or any(a is not b for a, b in zip(prev, leaves)):
            changed.append((path, var))
    return nnx.from_flat_state(changed)


def _nnx_pure(static: _CallStatic, params: nnx.State, state: _Frozen, *args: Any, **kwargs: Any):
    """The module call as a pure function: ``-> (outputs, _Delta of changed Variables)``."""
    rest = state.thaw()
    old = (params, rest)
    # Snapshot before the call: merge reuses these Variables, and the call mutates them.
    inputs = jax.tree.leaves(old) + jax.tree.leaves((args, kwargs))
    before = (_leaves_by_path(params), _leaves_by_path(rest))
    module = nnx.merge(static.graphdef, params, rest)
    full_args, full_kwargs = _merge_static(static, args, kwargs)
    out = _invoke(module, static.method, full_args, full_kwargs)
    new_params, new_rest = nnx.state(module, nnx.Param, ...)
    changed = (_changed_variables(before[0], new_params), _changed_variables(before[1], new_rest))
    return out, _Delta.capture(changed, old, inputs, state.frozen)


class _Call:
    """One call's program arguments, and the leaves a delta's sources index."""

    def __init__(self, static: _CallStatic, state: tuple, frozen: _Frozen, extra: tuple, args: tuple, kwargs: dict):
        self.static = static
        self.state = state
        self.frozen = frozen
        self.extra = extra
        self.args = args
        self.kwargs = kwargs

    @property
    def program_args(self) -> tuple:
        return (self.static, self.state[0], self.frozen, *self.extra, *self.args)

    @property
    def dynamic(self) -> tuple:
        """``(positional, keyword)`` program arguments after the static one."""
        return self.program_args[1:], self.kwargs

    def inputs(self) -> list:
        return jax.tree.leaves(self.state) + jax.tree.leaves(((*self.extra, *self.args), self.kwargs))

    def lower(self, program: AOTFunction, extra_labels: Sequence[str] = ()) -> ModuleLowered:
        """``program.lower`` for this call, with the :class:`CallMetadata` of its inputs and outputs."""
        lowered = program.lower(*self.program_args, **self.kwargs)
        params, state = self.state
        names = [(n, "parameter") for n in leaf_fqns(params)] + [(n, "state") for n in leaf_fqns(state)]
        names += _user_input_names(self.args, self.kwargs, list(zip(extra_labels, self.extra)))
        return ModuleLowered(lowered, build_metadata(lowered, names, _output_names(lowered.joint.out_tree)))


class AOTModule(nnx.Module):
    """An ``nnx.Module`` whose call runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. It holds the wrapped module as
    ``.module`` (so ``nnx.grad``, ``nnx.Optimizer``, ``nnx.split``, ``.train()``
    and ``.eval()`` see its state) and writes mutated state back after each call.
    """

    _pure = staticmethod(_nnx_pure)

    def __init__(self, module: nnx.Module, program: AOTFunction, method: Method, static_argnums: tuple,
                 static_argnames: tuple):
        self.module = module
        self.program = program
        self.method = method
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames

    def _prepare(self, args: tuple, kwargs: dict, freeze: bool | None = None) -> _Call:
        s_args, s_kwargs, d_args, d_kwargs = _split_static(args, kwargs, self.static_argnums, self.static_argnames)
        graphdef, params, rest = nnx.split(self.module, nnx.Param, ...)
        if freeze is None:
            freeze = _any_tracer(params, rest, d_args, d_kwargs)
        static = _CallStatic(graphdef, self.method, s_args, s_kwargs)
        return _Call(static, (params, rest), _Frozen.of(rest, freeze), (), d_args, d_kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._prepare(args, kwargs)
        out, delta = self.program(*call.program_args, **call.kwargs)
        changed_params, changed_rest = delta.rebuild(call.inputs())
        if len(changed_params) or len(changed_rest):
            nnx.update(self.module, changed_params, changed_rest)
        return out

    def lower(self, *args: Any, **kwargs: Any) -> ModuleLowered:
        """Build everything for this call signature (as traced, i.e. training) and describe it.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> bn = jaxaot.aot_module(nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
            >>> meta = bn.lower(jnp.ones((2, 3))).meta
            >>> [(i.name, i.kind, i.mutated) for i in meta.inputs][2:]
            [('mean', 'state', True), ('var', 'state', True), ('arg[0]', 'user_input', False)]
        """
        return self._prepare(args, kwargs, freeze=True).lower(self.program)

    def cache_info(self) -> CacheInfo:
        """The compile cache of the underlying :class:`jaxaot.AOTFunction`.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> from flax import nnx
            >>> model = jaxaot.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
            >>> _ = model(jnp.ones((1, 3)))
            >>> model.cache_info().misses
            1
        """
        return self.program.cache_info()


# --------------------------------------------------------------------------- linen
def _normalize_mutable(mutable: Any) -> Any:
    # Hashable and canonical, so that equal filters share a compiled entry.
    if isinstance(mutable, (list, tuple, set, frozenset)):
        return tuple(sorted(mutable))
    return mutable


class AOTLinenModule:
    """A linen module whose ``apply`` runs through :func:`jaxaot.aot_function`.

    Build one with :func:`aot_module`. ``apply`` has linen's signature and return
    value: ``out``, or ``(out, updated_collections)`` when ``mutable`` is set.
    """

    def __init__(self, module: nn.Module, static_argnums: tuple, static_argnames: tuple, **aot_kwargs: Any):
        self.module = module
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.program = aot_function(self._pure, static_argnums=0, **aot_kwargs)

    def _pure(self, static: _CallStatic, params: Any, state: _Frozen, rngs: Any, *args: Any, **kwargs: Any):
        others = state.thaw()
        variables = dict(others) if params is None else {"params": params, **others}
        full_args, full_kwargs = _merge_static(static, args, kwargs)
        method = static.method
        result = self.module.apply(variables, *full_args, rngs=rngs, method=method, mutable=static.mutable,
                                   capture_intermediates=static.capture_intermediates, **full_kwargs)
        if static.mutable is False:
            return result, None
        out, new_vars = result
        old = (params, others)
        inputs = jax.tree.leaves(old) + jax.tree.leaves(((rngs, *args), kwargs))
        return out, _Delta.capture(_as_state_pair(new_vars), old, inputs, state.frozen)

    def _prepare(self, variables: Mapping[str, Any], args: tuple, kwargs: dict, rngs: Any, method: Any,
                 mutable: Any, freeze: bool | None = None, capture_intermediates: Any = False) -> _Call:
        if not isinstance(variables, Mapping):
            raise InvalidInputError(
                f"apply expects the variables mapping ({{'params': ...}}), got {type(variables).__name__}."
            )
        s_args, s_kwargs, d_args, d_kwargs = _split_static(args, kwargs, self.static_argnums, self.static_argnames)
        params = variables.get("params")
        others = {k: v for k, v in variables.items() if k != "params"}
        if freeze is None:
            freeze = _any_tracer(params, others, rngs, d_args, d_kwargs)
        static = _CallStatic(None, method, s_args, s_kwargs, _normalize_mutable(mutable), capture_intermediates)
        for name in ("mutable", "method", "capture_intermediates"):
            _check_static(name, getattr(static, name))
        return _Call(static, (params, others), _Frozen.of(others, freeze), (rngs,), d_args, d_kwargs)

    def apply(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> Any:
        """``module.apply(variables, *args, rngs=..., method=..., mutable=..., **kwargs)``, compiled.

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> bn = nn.BatchNorm(use_running_average=False)
            >>> variables = bn.init(jax.random.key(0), jnp.ones((2, 3)))
            >>> y, updates = jaxaot.aot_module(bn).apply(variables, jnp.ones((2, 3)), mutable=["batch_stats"])
            >>> sorted(updates)
            ['batch_stats']
        """
        call = self._prepare(variables, args, kwargs, rngs, method, mutable,
                             capture_intermediates=capture_intermediates)
        out, delta = self.program(*call.program_args, **call.kwargs)
        if delta is None:
            return out
        params, others = delta.rebuild(call.inputs())
        return out, _from_state_pair(params, others)

    __call__ = apply

    def lower(self, variables: Mapping[str, Any], *args: Any, rngs: Any = None, method: Any = None,
              mutable: Any = False, capture_intermediates: Any = False, **kwargs: Any) -> ModuleLowered:
        """Build everything for this ``apply`` signature (as traced) and describe it (see :class:`AOTModule.lower`)."""
        call = self._prepare(variables, args, kwargs, rngs, method, mutable, freeze=True,
                             capture_intermediates=capture_intermediates)
        return call.lower(self.program, extra_labels=("rngs",))

    def cache_info(self) -> CacheInfo:
        """The compile cache of the underlying :class:`jaxaot.AOTFunction`.

        Example:
            >>> import jax, jax.numpy as jnp, jaxaot
            >>> from flax import linen as nn
            >>> m = jaxaot.aot_module(nn.Dense(2))
            >>> variables = m.module.init(jax.random.key(0), jnp.ones((1, 3)))
            >>> _ = m.apply(variables, jnp.ones((1, 3)))
            >>> m.cache_info().misses
            1
        """
        return self.program.cache_info()

    def __repr__(self) -> str:
        return f"<AOTLinenModule {type(self.module).__name__}: {self.program!r}>"


def _as_state_pair(new_vars: Mapping[str, Any]) -> tuple:
    # Lined up with the input pair (params, other collections) so that paths match.
    others = {k: v for k, v in new_vars.items() if k != "params"}
    return (new_vars["params"] if "params" in new_vars else None, others)


def _from_state_pair(params: Any, others: dict) -> dict:
    return {**({"params": params} if params is not None else {}), **others}


# --------------------------------------------------------------------------- entry point
def aot_module(
    module: nnx.Module | nn.Module,
    fw_compiler: Callable | None = None,
    bw_compiler: Callable | None = None,
    partition_fn: PartitionFn = default_partition,
    *,
    inference_compiler: Callable | None = None,
    decompositions: Mapping[Any, Callable] | None = None,
    method: Method = "__call__",
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
) -> AOTModule | AOTLinenModule:
    """Compile a Flax module's call ahead of time, writing mutated state back.

    For an ``nnx.Module`` it returns an :class:`AOTModule` (itself an
    ``nnx.Module`` wrapping ``module``) with the module's call signature. For a
    linen module it returns an :class:`AOTLinenModule` whose ``apply`` (also its
    ``__call__``) mirrors ``module.apply(variables, ..., mutable=[...])``.

    Args:
      module: the ``flax.nnx.Module`` or ``flax.linen.Module``.
      fw_compiler, bw_compiler, partition_fn, inference_compiler, decompositions:
        as in :func:`jaxaot.aot_function`.
      method: nnx only: the method to call (a name, or ``fn(module, *args)``);
        linen takes ``method=`` per ``apply`` call as linen does.
      static_argnums / static_argnames: positions / names of call arguments that
        are compile-time constants (``train=True``, say), as in ``jax.jit``.

    Raises:
      InvalidInputError: ``module`` is not a Flax module, ``method`` does not
        exist, or a static argument is invalid or unhashable; at call time, an
        argument holds an nnx Module or Variable (only the wrapped module's state
        is written back).

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> from flax import nnx
        >>> model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> aot_model = jaxaot.aot_module(model)
        >>> grads = nnx.grad(lambda m: m(jnp.ones((1, 3))).sum())(aot_model)
        >>> grads["module"]["kernel"][...].shape
        (3, 2)
    """
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    if any(not isinstance(i, int) or i < 0 for i in nums):
        raise InvalidInputError(f"static_argnums must be non-negative ints, got {static_argnums!r}.")
    if any(not isinstance(n, str) for n in names):
        raise InvalidInputError(f"static_argnames must be strings, got {static_argnames!r}.")
    nums = tuple(sorted(set(nums)))  # static arguments are re-inserted in increasing position
    aot_kwargs = dict(fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=partition_fn,
                      inference_compiler=inference_compiler, decompositions=decompositions)
    if isinstance(module, nn.Module):
        return AOTLinenModule(module, nums, names, **aot_kwargs)
    if not isinstance(module, nnx.Module):
        raise InvalidInputError(
            f"aot_module expects a flax.nnx.Module or a flax.linen.Module, got {type(module).__name__}. "
            "Use jaxaot.aot_function for plain functions."
        )
    if isinstance(method, str) and not callable(getattr(module, method, None)):
        raise InvalidInputError(f"{type(module).__name__} has no method {method!r}.")
    if not isinstance(method, str) and not callable(method):
        raise InvalidInputError(f"method must be a method name or a callable, got {type(method).__name__}.")
    _check_static("method", method)
    program = aot_function(_nnx_pure, static_argnums=0, **aot_kwargs)
    return AOTModule(module, program, method, nums, names)
