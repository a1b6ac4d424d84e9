"""Export the partitioned programs with ``jax.export``; reload them without the source.

:func:`export` runs the runtime's pipeline (trace -> joint -> partition) on
abstract inputs and exports three StableHLO programs with ``jax.export``:

* ``inference``: ``(inputs...) -> (outputs...)``;
* ``forward``: ``(inputs...) -> (outputs..., temporaries...)``;
* ``backward``: ``(cotangents..., saved inputs..., saved outputs...) -> (grads...)``.

This is the :class:`~jaxaot.partition.Partition` contract: the backward's
residuals are the inputs at ``signature.saved_inputs`` followed by the forward
outputs (real or temporary) at ``signature.saved_outputs``; nothing is re-emitted.
:func:`load` turns a saved directory into a :class:`LoadedAOT` callable whose
``jax.grad`` runs the exported forward and backward (through ``jax.custom_vjp``).

Saved directory layout (``ExportedAOT.save``)::

    manifest.json           # see below
    inference.jaxexport     # Exported.serialize() of each program
    forward.jaxexport
    backward.jaxexport

``manifest.json`` holds ``format: "jaxaot-export"``, ``format_version``, the
``versions`` (jaxaot, jax, jaxlib) that wrote it, ``function``, ``platforms``,
``artifacts`` (per program: file, sha256, bytes, platforms, calling convention
version) and ``signature`` (:meth:`AOTSignature.to_json`). Array specs are
``{"shape": [4, "b"], "dtype": "float32", "weak_type": false}``: symbolic dims
are strings in ``jax.export.symbolic_shape`` syntax.

Pytree structures are JSON, never pickles. A node is ``{"kind": K, ...}`` with K:
``leaf``; ``none``; ``tuple`` / ``list`` with ``children``; ``dict`` /
``ordered_dict`` with ``keys`` (str or int) and ``children``; ``namedtuple`` with
``module``, ``qualname``, ``fields`` and ``children`` (reloaded as a new
namedtuple class of that name and fields: no code is imported). Other custom
nodes (``flax.nnx.State``, dataclasses) cannot be described: export raises
:class:`~jaxaot.errors.NotExportableError`; pass plain containers instead, e.g.
``nnx.to_pure_dict(state)``.

``dynamic_shapes`` is the ``shapes_specs`` argument of
``jax.export.symbolic_args_specs``: a pytree prefix of the (non-static) positional
arguments whose entries are shape strings such as ``"b, 16"`` or ``"b, ..."``
(``...`` keeps the remaining dims of the example argument), or None (static).
Alternatively pass ``jax.ShapeDtypeStruct`` arguments with symbolic shapes made
in one ``jax.export.SymbolicScope``. Static arguments of an :class:`AOTFunction`
(``static_argnums``) are baked in: the loaded function takes the others only.

Version policy (:func:`check_manifest`): the format version must match; the
jaxaot major version must match; the writer's jax must be at least 0.10 and not
newer (major.minor) than the reader's (``jax.export`` guarantees only that newer
jax loads older artifacts); each program's calling convention version must be
supported by the reader's jax. ``load(..., check_versions=False)`` skips the jax
checks (not the format check).

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> exp = jaxaot.export(lambda w, x: jnp.tanh(x @ w).sum(), jnp.ones((3, 2)), jnp.ones((4, 3)))
    >>> f = jaxaot.load(exp)  # or exp.save(path) ... jaxaot.load(path) in another process
    >>> jax.grad(f)(jnp.ones((3, 2)), jnp.ones((4, 3))).shape
    (3, 2)
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np

from jaxaot import _compat as C
from jaxaot.compile.cache import atomic_write, is_host_callback
from jaxaot.errors import (
    ArtifactError,
    ArtifactInputError,
    ArtifactVersionError,
    CotangentMismatchError,
    InvalidInputError,
    LoopOverflowError,
    NotExportableError,
    ResidualsMismatchError,
)
from jaxaot._pytrees import flatten_checked, leaf_paths

FORMAT = "jaxaot-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAMS = ("inference", "forward", "backward")
MIN_JAX = (0, 10)


# --------------------------------------------------------------------------- pytree structures as JSON
class _LeafMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


_LEAF = _LeafMarker()


def treedef_to_json(treedef: Any, prefix: str = "arg") -> dict:
    """A JSON description of a pytree structure (see the module docstring).

    Raises :class:`NotExportableError` naming the first node it cannot describe.

    Example:
        >>> import jax
        >>> from jaxaot.export import treedef_to_json
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
        >>> from jaxaot.export import treedef_from_json, treedef_to_json
        >>> td = jax.tree_util.tree_structure(([1, 2], {"a": 3}))
        >>> treedef_from_json(treedef_to_json(td)) == td
        True
    """
    return jax.tree_util.tree_structure(_decode_node(node))


def _decode_node(node: Mapping[str, Any]) -> Any:
    kind = node["kind"]
    if kind == "leaf":
        return _LEAF
    if kind == "none":
        return None
    children = [_decode_node(c) for c in node.get("children", ())]
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


# --------------------------------------------------------------------------- signature
@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape (ints, or strings for symbolic dims) and dtype of one flat array."""

    shape: tuple[int | str, ...]
    dtype: str
    weak_type: bool = False

    @classmethod
    def of(cls, aval: Any) -> "ArraySpec":
        shape = tuple(str(d) if jax.export.is_symbolic_dim(d) else int(d) for d in aval.shape)
        return cls(shape, np.dtype(aval.dtype).name, bool(getattr(aval, "weak_type", False)))

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "weak_type": self.weak_type}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ArraySpec":
        return cls(tuple(d["shape"]), str(d["dtype"]), bool(d.get("weak_type", False)))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class RuntimeCheck:
    """A flag an exported program returns instead of calling back into Python.

    ``kind="loop_overflow"``: a ``jaxaot.while_loop`` ran past ``max_steps``;
    the loaded function raises :class:`~jaxaot.errors.LoopOverflowError`.
    """

    kind: str
    max_steps: int


@dataclasses.dataclass(frozen=True)
class AOTSignature:
    """The calling contract of an exported function.

    Attributes:
      in_structure / out_structure: JSON pytree structures of the positional
        arguments tuple and of the outputs (``in_tree`` / ``out_tree`` decode them).
      in_specs / out_specs: an :class:`ArraySpec` per flat input / output.
      grad_inputs: flat inputs that get a gradient (the differentiable ones).
      cotangent_outputs: flat outputs that take a cotangent.
      saved_inputs: flat inputs the backward captures (residuals, first).
      saved_outputs: forward outputs (``< len(out_specs)``: real, else temporary)
        the backward captures (residuals, after the inputs).
      num_temporaries: extra forward outputs that exist only for the backward.
      residual_specs: an :class:`ArraySpec` per residual, in backward order.
      forward_checks / inference_checks: :class:`RuntimeCheck` flags the program
        returns after its other outputs.
      static_args: repr of the static arguments baked in, if any.
    """

    in_structure: Mapping[str, Any]
    out_structure: Mapping[str, Any]
    in_specs: tuple[ArraySpec, ...]
    out_specs: tuple[ArraySpec, ...]
    grad_inputs: tuple[int, ...]
    cotangent_outputs: tuple[int, ...]
    saved_inputs: tuple[int, ...]
    saved_outputs: tuple[int, ...]
    num_temporaries: int
    residual_specs: tuple[ArraySpec, ...]
    forward_checks: tuple[RuntimeCheck, ...] = ()
    inference_checks: tuple[RuntimeCheck, ...] = ()
    static_args: str | None = None

    @functools.cached_property
    def in_tree(self) -> Any:
        return treedef_from_json(self.in_structure)

    @functools.cached_property
    def out_tree(self) -> Any:
        return treedef_from_json(self.out_structure)

    @property
    def num_outputs(self) -> int:
        return len(self.out_specs)

    @property
    def differentiable(self) -> tuple[bool, ...]:
        return tuple(i in self.grad_inputs for i in range(len(self.in_specs)))

    @functools.cached_property
    def in_paths(self) -> tuple[str, ...]:
        return tuple(leaf_paths(self.in_tree, "arg"))

    @functools.cached_property
    def out_paths(self) -> tuple[str, ...]:
        return tuple(leaf_paths(self.out_tree, "output"))

    def to_json(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("specs"):
                v = [s.to_json() for s in v]
            elif f.name.endswith("checks"):
                v = [dataclasses.asdict(c) for c in v]
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AOTSignature":
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name.endswith("specs"):
                v = tuple(ArraySpec.from_json(s) for s in v)
            elif f.name.endswith("checks"):
                v = tuple(RuntimeCheck(**c) for c in v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)


# --------------------------------------------------------------------------- ExportedAOT
@dataclasses.dataclass(frozen=True)
class ExportedAOT:
    """The exported inference, forward and backward programs and their signature.

    Attributes:
      inference / forward / backward: ``jax.export.Exported`` objects.
      signature: the :class:`AOTSignature`.
      name: the function's name.
    """

    inference: Any
    forward: Any
    backward: Any
    signature: AOTSignature
    name: str = "exported"

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.forward.platforms)

    def manifest(self, artifacts: Mapping[str, Any]) -> dict:
        """The manifest ``save`` writes, given the per-program artifact records."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "versions": _versions(),
            "function": self.name,
            "platforms": list(self.platforms),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "artifacts": dict(artifacts),
            "signature": self.signature.to_json(),
        }

    def save(self, path: str | Path) -> Path:
        """Write the manifest and the serialized programs into the directory ``path``.

        Files are written atomically, the manifest last.

        Example:
            >>> import jax.numpy as jnp, jaxaot, tempfile
            >>> exp = jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(3))
            >>> sorted(p.name for p in exp.save(tempfile.mkdtemp()).iterdir())
            ['backward.jaxexport', 'forward.jaxexport', 'inference.jaxexport', 'manifest.json']
        """
        _require_flatbuffers()
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        artifacts = {}
        for name in PROGRAMS:
            exp = getattr(self, name)
            blob = bytes(exp.serialize())
            file = f"{name}.jaxexport"
            atomic_write(root / file, blob)
            artifacts[name] = {
                "file": file,
                "sha256": hashlib.sha256(blob).hexdigest(),
                "bytes": len(blob),
                "platforms": list(exp.platforms),
                "calling_convention_version": int(exp.calling_convention_version),
            }
        text = json.dumps(self.manifest(artifacts), indent=1, sort_keys=True)
        atomic_write(root / MANIFEST, text.encode())
        return root

    def __repr__(self) -> str:
        s = self.signature
        return (f"ExportedAOT({self.name}: {len(s.in_specs)} inputs, {s.num_outputs} outputs, "
                f"{len(s.residual_specs)} residuals, platforms={self.platforms})")


def _versions() -> dict:
    import sys

    import jaxlib

    return {
        "jaxaot": getattr(sys.modules.get("jaxaot"), "__version__", "0"),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }


# --------------------------------------------------------------------------- export
def export(
    fn_or_aot_function: Callable[..., Any],
    *args: Any,
    platforms: Sequence[str] | None = None,
    dynamic_shapes: Any = None,
    partition_fn: Callable | None = None,
) -> ExportedAOT:
    """Export the inference, forward and backward programs of a function.

    Args:
      fn_or_aot_function: a function of pytrees of arrays, or an
        :class:`~jaxaot.AOTFunction` (its partitioner and decompositions are used).
      *args: example positional arguments (arrays, scalars or
        ``jax.ShapeDtypeStruct``; only shapes and dtypes matter).
      platforms: e.g. ``("cpu", "cuda", "tpu")`` for one multi-platform artifact
        (lowering needs no such hardware); default: the current platform.
      dynamic_shapes: symbolic dims, as ``jax.export.symbolic_args_specs``'s
        ``shapes_specs``: e.g. ``(None, ("b, 16", "b, 4"))`` for ``(params, (x, y))``.
      partition_fn: overrides the partitioner (default: the AOTFunction's, else
        :func:`~jaxaot.default_partition`).

    Raises:
      NotExportableError: host callbacks in the function, pytree nodes the
        manifest cannot describe, or programs ``jax.export`` refuses.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> exp = jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(8), dynamic_shapes=("b",))
        >>> exp.signature.residual_specs[0].shape
        ('b',)
    """
    aot = _fresh_aot_function(fn_or_aot_function, partition_fn)
    name = aot.__name__
    static = set(aot.static_argnums)
    dyn = tuple(a for i, a in enumerate(args) if i not in static)
    flatten_checked((dyn, {}), "input", InvalidInputError)
    specs = _input_specs(dyn, dynamic_shapes)
    in_structure = treedef_to_json(jax.tree_util.tree_structure(specs), "arg")
    it = iter(specs)
    call_args = tuple(a if i in static else next(it) for i, a in enumerate(args))

    entry, _, _ = aot._lookup(call_args, {})  # traces the primal program, compiles nothing
    inference, inference_checks = _hoist_checks(entry.primal, "inference", name)
    training = entry.training()
    part = training.partition
    forward, forward_checks = _hoist_checks(part.forward, "forward", name)
    backward, backward_checks = _hoist_checks(part.backward, "backward", name)
    if backward_checks:  # pragma: no cover - loop checks run where the loop runs: the forward
        raise NotExportableError(f"the backward program of {name} contains a run-time check; it cannot be exported.")

    in_avals = list(entry.in_avals)
    programs = {
        "inference": _export_program(inference, in_avals, platforms, name, "inference"),
        "forward": _export_program(forward, in_avals, platforms, name, "forward"),
        "backward": _export_program(backward, training.backward_avals(), platforms, name, "backward"),
    }
    static_args = repr(tuple(args[i] for i in sorted(static) if i < len(args))) if static else None
    signature = _signature(in_structure, entry, training, forward_checks, inference_checks, static_args)
    return ExportedAOT(name=name, signature=signature, **programs)


def _signature(in_structure: dict, entry: Any, training: Any, forward_checks: tuple, inference_checks: tuple,
               static_args: str | None) -> AOTSignature:
    """The :class:`AOTSignature` of a runtime entry and its (full-mask) training programs."""
    part = training.partition
    return AOTSignature(
        in_structure=in_structure,
        out_structure=treedef_to_json(entry.out_tree, "output"),
        in_specs=tuple(ArraySpec.of(a) for a in entry.in_avals),
        out_specs=tuple(ArraySpec.of(a) for a in training.joint.out_avals),
        grad_inputs=tuple(part.grad_inputs),
        cotangent_outputs=tuple(part.cotangent_outputs),
        saved_inputs=tuple(part.saved_inputs),
        saved_outputs=tuple(part.saved_outputs),
        num_temporaries=part.num_temporaries,
        residual_specs=tuple(ArraySpec.of(r.aval) for r in part.residuals),
        forward_checks=forward_checks,
        inference_checks=inference_checks,
        static_args=static_args,
    )


def _fresh_aot_function(fn: Callable, partition_fn: Callable | None) -> Any:
    # A new AOTFunction, so exporting adds no (abstract, maybe symbolic) entry to
    # the caller's cache; the AOTFunction's options carry over.
    from jaxaot.partition.default import default_partition
    from jaxaot.runtime.function import AOTFunction, aot_function

    if isinstance(fn, AOTFunction):
        return aot_function(
            fn.fn, partition_fn=partition_fn or fn.partition_fn, decompositions=fn.decompositions,
            static_argnums=fn.static_argnums,
        )
    if isinstance(fn, LoadedAOT):
        raise InvalidInputError("this function was loaded from an artifact: save its ExportedAOT again instead.")
    return aot_function(fn, partition_fn=partition_fn or default_partition)


def _input_specs(dyn: tuple, dynamic_shapes: Any) -> tuple:
    if dynamic_shapes is not None:
        try:
            specs = jax.export.symbolic_args_specs(dyn, dynamic_shapes)
        except Exception as err:
            raise InvalidInputError(f"dynamic_shapes {dynamic_shapes!r} does not fit the arguments: {err}") from err
    else:
        specs = dyn
    return jax.tree_util.tree_map(_strip_sharding, specs)


def _strip_sharding(x: Any) -> jax.ShapeDtypeStruct:
    # The artifact is device-independent: shardings of the example arrays stay behind.
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=bool(getattr(aval, "weak_type", False)))


def _export_program(closed: Any, avals: Sequence[Any], platforms: Sequence[str] | None, name: str, what: str):
    def run(*flat):
        return C.eval_closed(closed, *flat)

    run.__name__ = run.__qualname__ = re.sub(r"\W", "_", f"{name}_{what}")
    try:
        return jax.export.export(jax.jit(run, keep_unused=True), platforms=platforms)(*avals)
    except Exception as err:
        raise NotExportableError(
            f"jax.export cannot export the {what} program of {name}: {type(err).__name__}: {err}"
        ) from err


# --------------------------------------------------------------------------- host callbacks
def _callback_eqns(closed: Any, top: bool = True) -> Iterable[tuple[Any, bool]]:
    """``(eqn, is_top_level)`` for every host-callback eqn, sub-jaxprs included."""
    for eqn in C.jaxpr_of(closed).eqns:
        if is_host_callback(eqn):
            yield eqn, top
        for sub in C.eqn_subjaxprs(eqn):
            yield from _callback_eqns(sub, False)


def _hoist_checks(closed: Any, what: str, name: str) -> tuple[Any, tuple[RuntimeCheck, ...]]:
    """``closed`` with jaxaot's loop-overflow callbacks turned into extra outputs.

    ``jax.export`` refuses host callbacks; ``jaxaot.while_loop``'s reverse mode
    checks its stack with one. Such a check becomes a boolean output that the
    loaded function inspects; any other callback is a :class:`NotExportableError`.
    """
    hoist = []
    for eqn, top in _callback_eqns(closed):
        max_steps = _overflow_check_max_steps(eqn)
        if max_steps is None:
            raise NotExportableError(
                f"the {what} program of {name} calls a host callback ({eqn.primitive}) at {C.eqn_source(eqn)}. "
                "jax.export cannot serialize host callbacks (jax.debug.callback, jax.debug.print, io_callback, "
                "pure_callback): remove them from the function before exporting."
            )
        if not top:
            raise NotExportableError(
                f"the {what} program of {name} checks a jaxaot.while_loop stack for overflow inside another "
                f"loop or call ({C.eqn_source(eqn)}); only top-level checks can be exported. Use checkpoints=k "
                "(no run-time check) for nested loops."
            )
        hoist.append((eqn, max_steps))
    if not hoist:
        return closed, ()
    j = C.jaxpr_of(closed)
    skip = {id(e) for e, _ in hoist}
    eqns = [e for e in j.eqns if id(e) not in skip]
    flags = [e.invars[0] for e, _ in hoist]
    new = C.make_closed_jaxpr(j.constvars, j.invars, [*j.outvars, *flags], eqns, C.consts_of(closed))
    return new, tuple(RuntimeCheck("loop_overflow", int(m)) for _, m in hoist)


def _overflow_check_max_steps(eqn: Any) -> int | None:
    """``max_steps`` if ``eqn`` is jaxaot.while_loop's overflow check, else None."""
    if str(eqn.primitive) != "debug_callback" or len(eqn.invars) != 1:
        return None
    try:
        from jaxaot.loops import rules as primitives
    except ImportError:  # pragma: no cover - while-loop support absent
        return None
    target = getattr(primitives, "_raise_overflow", None)

    # jax.debug.callback wraps the callback in closures; look a few levels in.
    def search(obj: Any, depth: int) -> int | None:
        if depth > 4 or obj is None:
            return None
        if isinstance(obj, functools.partial):
            if obj.func is target and "max_steps" in obj.keywords:
                return int(obj.keywords["max_steps"])
            return search(obj.func, depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                found = search(cell.cell_contents, depth + 1) if callable(cell.cell_contents) else None
            except ValueError:  # an empty cell
                found = None
            if found is not None:
                return found
        return None

    return search(eqn.params.get("callback"), 0) if target is not None else None


# --------------------------------------------------------------------------- load
def load(path: str | Path | ExportedAOT, *, check_versions: bool = True) -> "LoadedAOT":
    """Load a directory written by :meth:`ExportedAOT.save` (or wrap an ``ExportedAOT``).

    Needs neither the original function nor its module.

    Raises:
      ArtifactError: missing or corrupt files (checksum mismatch).
      ArtifactVersionError: a manifest from an incompatible format, jaxaot or jax.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot, tempfile
        >>> d = jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)).save(tempfile.mkdtemp())
        >>> f = jaxaot.load(d)
        >>> round(float(jax.grad(f)(jnp.zeros(3))[0]), 3)
        1.0
    """
    if isinstance(path, ExportedAOT):
        return LoadedAOT(path)
    root = Path(path)
    manifest = read_manifest(root)
    check_manifest(manifest, check_versions=check_versions)
    try:
        signature = AOTSignature.from_json(manifest["signature"])
        programs = {name: _load_program(root, name, manifest["artifacts"][name]) for name in PROGRAMS}
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(f"{root / MANIFEST} is malformed: {type(err).__name__}: {err}") from err
    return LoadedAOT(ExportedAOT(name=str(manifest.get("function", "exported")), signature=signature, **programs))


def read_manifest(root: Path) -> dict:
    """The parsed ``manifest.json`` of an artifact directory."""
    try:
        manifest = json.loads((Path(root) / MANIFEST).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{root} is not a jaxaot export: it has no {MANIFEST}.") from None
    except (OSError, ValueError) as err:
        raise ArtifactError(f"cannot read {Path(root) / MANIFEST}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{Path(root) / MANIFEST} is not a jaxaot export manifest (format != {FORMAT!r}).")
    return manifest


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


def check_manifest(manifest: Mapping[str, Any], *, check_versions: bool = True) -> None:
    """Raise :class:`ArtifactVersionError` if this process cannot load the manifest's programs.

    Example:
        >>> from jaxaot.export import check_manifest
        >>> check_manifest({"format": "jaxaot-export", "format_version": 99})
        Traceback (most recent call last):
        ...
        jaxaot.errors.ArtifactVersionError: artifact format version 99 ...
    """
    fv = manifest.get("format_version")
    if fv != FORMAT_VERSION:
        newer = isinstance(fv, int) and fv > FORMAT_VERSION
        raise ArtifactVersionError(
            f"artifact format version {fv} is not supported by this jaxaot (format {FORMAT_VERSION}): "
            + ("upgrade jaxaot to load it." if newer else "re-export it with this jaxaot.")
        )
    versions = manifest.get("versions", {})
    ours = _versions()
    writer = _version_tuple(versions.get("jaxaot", "?"))
    if not writer or writer[0] != _version_tuple(ours["jaxaot"])[0]:
        raise ArtifactVersionError(
            f"artifact written by jaxaot {versions.get('jaxaot')}, incompatible with this jaxaot "
            f"{ours['jaxaot']} (major versions differ): re-export it with this jaxaot."
        )
    if not check_versions:
        return
    wjax, rjax = _version_tuple(versions.get("jax", "?"))[:2], _version_tuple(jax.__version__)[:2]
    if len(wjax) < 2 or wjax < MIN_JAX:
        raise ArtifactVersionError(
            f"artifact written by jax {versions.get('jax')}; jaxaot artifacts need jax >= "
            f"{'.'.join(map(str, MIN_JAX))}: re-export it."
        )
    if wjax > rjax:
        raise ArtifactVersionError(
            f"artifact written by jax {versions.get('jax')}, newer than this process's jax {jax.__version__}: "
            "jax.export guarantees only that newer jax loads older artifacts. Upgrade jax here, re-export "
            "with the older jax, or pass check_versions=False to try anyway."
        )
    lo, hi = jax.export.minimum_supported_calling_convention_version, jax.export.maximum_supported_calling_convention_version
    for name, info in manifest.get("artifacts", {}).items():
        ccv = info.get("calling_convention_version")
        if not isinstance(ccv, int) or not lo <= ccv <= hi:
            raise ArtifactVersionError(
                f"the {name} program uses jax.export calling convention {ccv}; jax {jax.__version__} "
                f"supports {lo}..{hi}: re-export it with a jax that this one can load."
            )


def _load_program(root: Path, name: str, info: Mapping[str, Any]) -> Any:
    path = root / str(info["file"])
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise ArtifactError(f"cannot read the {name} program {path}: {err}") from err
    if hashlib.sha256(blob).hexdigest() != info.get("sha256"):
        raise ArtifactError(f"{path} is corrupt: its sha256 differs from the manifest's. Re-export or re-copy it.")
    try:
        _require_flatbuffers()
        return jax.export.deserialize(bytearray(blob))
    except Exception as err:
        raise ArtifactError(f"jax.export cannot deserialize {path}: {type(err).__name__}: {err}") from err


# --------------------------------------------------------------------------- LoadedAOT
@jax.tree_util.register_pytree_node_class
class ExportedResiduals:
    """What :meth:`LoadedAOT.forward` hands to :meth:`LoadedAOT.backward`.

    ``arrays`` are the residuals in the backward's order; ``input_shapes`` (the
    concrete input shapes) size the ``float0`` gradients of integer inputs.
    """

    def __init__(self, arrays: Sequence[Any], input_shapes: Sequence[tuple[int, ...]]):
        self.arrays = tuple(arrays)
        self.input_shapes = tuple(tuple(s) for s in input_shapes)

    def tree_flatten(self):
        return self.arrays, self.input_shapes

    @classmethod
    def tree_unflatten(cls, input_shapes, arrays):
        return cls(arrays, input_shapes)

    def __repr__(self) -> str:
        return f"ExportedResiduals({len(self.arrays)} arrays)"


class LoadedAOT:
    """A function rebuilt from exported programs: call it, differentiate it, or split it.

    ``jax.grad`` / ``jax.vjp`` run the exported forward and backward (a
    ``jax.custom_vjp``); :meth:`forward` / :meth:`backward` expose the split.
    Inputs are checked against the signature first (:class:`ArtifactInputError`).
    """

    def __init__(self, exported: ExportedAOT):
        self.exported = exported
        self.signature = exported.signature
        self.__name__ = exported.name
        self._structures: dict[Any, Any] = {}
        self._call = self._make_custom_vjp()

    @property
    def inference(self) -> Any:
        return self.exported.inference

    def __call__(self, *args: Any) -> Any:
        leaves = self._check_inputs(args)
        return jax.tree_util.tree_unflatten(self.signature.out_tree, self._call(*leaves))

    def forward(self, *args: Any) -> tuple[Any, ExportedResiduals]:
        """Run the exported forward: ``(outputs, residuals)``.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.load(jaxaot.export(lambda x: jnp.sin(x).sum(), jnp.ones(3)))
            >>> y, res = f.forward(jnp.zeros(3))
            >>> (dx,) = f.backward(res, jnp.float32(1.0))
            >>> dx.tolist()
            [1.0, 1.0, 1.0]
        """
        leaves = self._check_inputs(args)
        outs, residuals = self._forward(leaves)
        shapes = [np.shape(x) for x in leaves]
        return jax.tree_util.tree_unflatten(self.signature.out_tree, outs), ExportedResiduals(residuals, shapes)

    def backward(self, residuals: ExportedResiduals, cotangents: Any) -> tuple:
        """Run the exported backward: gradients shaped like the positional arguments.

        ``cotangents`` has the outputs' structure (leaves of integer outputs are
        ignored and may be None); integer inputs get ``float0`` zeros.
        """
        if not isinstance(residuals, ExportedResiduals):
            raise ResidualsMismatchError(
                f"backward expects the ExportedResiduals returned by {self.__name__}.forward, "
                f"got {type(residuals).__name__}."
            )
        self._check_residuals(residuals.arrays)
        grads = self._backward(residuals.arrays, self._check_cotangents(cotangents))
        full: list[Any] = [np.zeros(s, dtype=C.float0) for s in residuals.input_shapes]
        for i, g in zip(self.signature.grad_inputs, grads):
            full[i] = g
        return jax.tree_util.tree_unflatten(self.signature.in_tree, full)

    # -- programs
    def _infer(self, leaves: Sequence[Any]) -> list:
        outs = list(self.exported.inference.call(*leaves))
        n = self.signature.num_outputs
        _run_checks(outs[n:], self.signature.inference_checks)
        return outs[:n]

    def _forward(self, leaves: Sequence[Any]) -> tuple[list, list]:
        s = self.signature
        outs = list(self.exported.forward.call(*leaves))
        n = s.num_outputs + s.num_temporaries
        _run_checks(outs[n:], s.forward_checks)
        residuals = [leaves[i] for i in s.saved_inputs] + [outs[i] for i in s.saved_outputs]
        return outs[: s.num_outputs], residuals

    def _backward(self, residuals: Sequence[Any], cts: Sequence[Any]) -> list:
        return list(self.exported.backward.call(*cts, *residuals))

    def _make_custom_vjp(self) -> Callable:
        s = self.signature

        @jax.custom_vjp
        def call(*leaves):
            return self._infer(leaves)

        def fwd(*leaves):
            return self._forward(leaves)

        def bwd(residuals, cts):
            selected = [_as_dtype(cts[i], s.out_specs[i].dtype) for i in s.cotangent_outputs]
            grads = self._backward(residuals, selected)
            full: list[Any] = [None] * len(s.in_specs)
            for i, g in zip(s.grad_inputs, grads):
                full[i] = g
            return tuple(full)

        call.defvjp(fwd, bwd)
        return call

    # -- checks
    def _structure(self, treedef: Any) -> Any:
        # Compared as JSON: a namedtuple of the same name and fields matches.
        st = self._structures.get(treedef)
        if st is None:
            try:
                st = treedef_to_json(treedef, "arg")
            except NotExportableError:
                st = repr(treedef)
            self._structures[treedef] = st
        return st

    def _check_inputs(self, args: tuple) -> list:
        s = self.signature
        leaves, treedef = jax.tree_util.tree_flatten(args)
        if self._structure(treedef) != s.in_structure:
            raise ArtifactInputError(
                f"{self.__name__} takes positional arguments structured as {s.in_tree} "
                f"(leaves {', '.join(s.in_paths)}), got {treedef}."
            )
        bound: dict[str, tuple[int, str]] = {}
        for path, spec, x in zip(s.in_paths, s.in_specs, leaves):
            _check_leaf(path, spec, x, bound, ArtifactInputError)
        return leaves

    def _check_residuals(self, arrays: Sequence[Any]) -> None:
        specs = self.signature.residual_specs
        if len(arrays) != len(specs):
            raise ResidualsMismatchError(f"expected {len(specs)} residuals, got {len(arrays)}.")
        bound: dict[str, tuple[int, str]] = {}
        for i, (spec, x) in enumerate(zip(specs, arrays)):
            _check_leaf(f"residual {i}", spec, x, bound, ResidualsMismatchError)

    def _check_cotangents(self, cotangents: Any) -> list:
        s = self.signature
        flat, tree = jax.tree_util.tree_flatten(cotangents, is_leaf=lambda x: x is None)
        if len(flat) != s.num_outputs:
            raise CotangentMismatchError(f"cotangents have structure {tree} but the outputs have {s.out_tree}.")
        out = []
        for i in s.cotangent_outputs:
            ct, spec, path = flat[i], s.out_specs[i], s.out_paths[i]
            if ct is None:
                raise CotangentMismatchError(f"cotangent for {path} is None, but the output is {spec}.")
            _check_leaf(f"cotangent for {path}", spec, ct, {}, CotangentMismatchError)
            out.append(ct)
        return out

    def __repr__(self) -> str:
        return f"<LoadedAOT {self.__name__}: {', '.join(f'{p}: {s}' for p, s in zip(self.signature.in_paths, self.signature.in_specs))}>"


def _shape_dtype(x: Any) -> tuple[tuple, str] | None:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return tuple(x.shape), np.dtype(x.dtype).name
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return (), np.dtype(jax.numpy.result_type(x)).name
    return None


def _check_leaf(path: str, spec: ArraySpec, x: Any, bound: dict, error: type[Exception]) -> None:
    """Raise ``error`` unless ``x`` has ``spec``'s dtype and shape (binding symbolic dims)."""
    got = _shape_dtype(x)
    if got is None:
        raise error(f"{path} is a {type(x).__name__}, not an array: expected {spec}.")
    shape, dtype = got
    mismatch = dtype != spec.dtype or len(shape) != len(spec.shape)
    for want, have in zip(spec.shape, shape):
        if isinstance(want, int):
            mismatch = mismatch or want != have
        elif str(want).isidentifier():  # a plain dimension variable: bind it
            first = bound.setdefault(want, (have, path))
            if first[0] != have:
                raise error(
                    f"{path}: dimension '{want}' is {have} here but {first[0]} in {first[1]} "
                    f"(expected {spec}, got {dtype}[{','.join(map(str, shape))}])."
                )
    if mismatch:
        raise error(f"{path}: expected {spec}, got {dtype}[{','.join(map(str, shape))}].")


def _as_dtype(ct: Any, dtype: str) -> Any:
    # custom_vjp may hand a weak-typed or instantiated-zero cotangent.
    return ct if np.dtype(getattr(ct, "dtype", None) or "float32").name == dtype else jax.numpy.asarray(ct, dtype)


def _raise_overflow(check: RuntimeCheck, flag: Any) -> None:
    if np.any(np.asarray(flag)):
        raise LoopOverflowError(
            f"while_loop needed more than max_steps={check.max_steps} iterations (raised by the exported "
            "forward). Its reverse mode stacks at most max_steps carries: re-export with a larger max_steps, "
            "or with checkpoints=k instead."
        )


def _run_checks(flags: Sequence[Any], checks: Sequence[RuntimeCheck]) -> None:
    for flag, check in zip(flags, checks):
        if C.is_tracer(flag):  # under jit: check when the program runs
            jax.debug.callback(functools.partial(_raise_overflow, check), flag)
        else:
            _raise_overflow(check, flag)


def _require_flatbuffers() -> None:
    """jax.export's (de)serialization needs the ``flatbuffers`` package, an extra of jaxaot."""
    try:
        import flatbuffers  # noqa: F401
    except ImportError:
        raise ImportError(
            "saving or loading jaxaot artifacts needs the 'flatbuffers' package, which jax.export uses "
            "for its serialized format: pip install 'jaxaot[export]' (or pip install flatbuffers)."
        ) from None
