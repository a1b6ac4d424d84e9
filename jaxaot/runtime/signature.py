"""Input signatures: what selects a compiled program, and why a call recompiled.

A :class:`Signature` is the pytree structure of ``(args, kwargs)``, one key per
leaf and the static arguments. A leaf's key is its aval (shape, dtype, weak
type), plus its sharding when the array is committed to anything other than
the default device; tracers and ``jax.ShapeDtypeStruct`` inputs key the same
way, so tracing a signature under ``jit`` reuses what eager calls built.

:func:`lookup_keys` computes the keys and the :class:`TraceKind` of a call in
one pass over the leaves: it runs on every call, so it is the runtime's hot
path and is kept cheap (one ``type`` check for the common case of an
uncommitted ``jax.Array``).

:class:`CacheInfo` is what ``AOTFunction.cache_info()`` reports: one
:class:`CacheEntryInfo` per signature with the reason it was compiled, printed
as ``arg[0]: f32[3] -> f32[4]``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, NamedTuple, Sequence

import jax

from jaxaot import _compat as C
from jaxaot._pytrees import format_aval, is_array_leaf, leaf_paths
from jaxaot.runtime.arguments import StaticArg, safe_repr

_ArrayImpl = C.ArrayImpl


class TraceKind(enum.IntEnum):
    """How a call's leaves are being traced; a call takes the largest kind among its leaves."""

    CONCRETE = 0      #: arrays: run the executables
    TRACED = 1        #: tracers of jit, vmap, grad: evaluate the programs in that trace
    FORWARD_MODE = 2  #: tracers of ``jax.jvp``: ``custom_vjp`` refuses them, so inline the primal
    ABSTRACT = 3      #: ``jax.ShapeDtypeStruct``: only ``lower`` takes these


class Signature(NamedTuple):
    """The compile-cache key of a call. A NamedTuple, not a dataclass: it is hashed on every call."""

    treedef: Any
    leaves: tuple
    static: tuple
    mesh: Any = None  #: the abstract mesh of the ``jax.set_mesh`` context, if any


# --------------------------------------------------------------------------- leaf keys
_DEFAULT_DEVICE: list = []
_SHARDING_KEYS: dict[Any, Any] = {}  # a program sees few distinct shardings: remember each one's key


def sharding_key(sharding: Any) -> Any:
    """None for the default device (keys like a tracer's), else the sharding itself."""
    try:
        return _SHARDING_KEYS[sharding]
    except KeyError:
        pass
    if not _DEFAULT_DEVICE:
        _DEFAULT_DEVICE.append(jax.devices()[0])
    key = None if C.single_device_of(sharding) == _DEFAULT_DEVICE[0] else sharding
    if len(_SHARDING_KEYS) < 1024:
        _SHARDING_KEYS[sharding] = key
    return key


def leaf_key(x: Any) -> Any:
    """The part of a leaf's type that selects a compiled executable.

    The aval (shape, dtype, weak type) alone for most leaves: it is cached on
    arrays and cheap to hash. Committed arrays add their sharding.
    """
    if isinstance(x, C.Tracer):
        primal = C.concrete_primal(x)  # eager grad: the executables will run on this array
        if primal is not None and primal.committed:
            sk = sharding_key(primal.sharding)
            if sk is not None:
                return (x.aval, sk)
        return x.aval
    if isinstance(x, jax.Array):
        if x.committed:
            sk = sharding_key(x.sharding)
            if sk is not None:
                return (x.aval, sk)
        return x.aval
    if isinstance(x, jax.ShapeDtypeStruct):  # abstract input, for lower()
        aval = C.shaped_abstractify(x)
        sk = sharding_key(x.sharding) if x.sharding is not None else None
        return aval if sk is None else (aval, sk)
    return jax.typeof(x)


def lookup_keys(leaves: Sequence[Any], on_bad_leaf: Callable[[], None]) -> tuple[tuple, TraceKind]:
    """Every leaf's key and the call's :class:`TraceKind`, in one pass.

    ``on_bad_leaf`` is called (and must raise) when a leaf is not an array.
    """
    keys = []
    kind = TraceKind.CONCRETE
    for x in leaves:
        if type(x) is _ArrayImpl:  # the common case, kept cheap
            if x.committed:
                sk = sharding_key(x.sharding)
                keys.append(x.aval if sk is None else (x.aval, sk))
            else:
                keys.append(x.aval)
            continue
        if isinstance(x, C.Tracer):
            kind = max(kind, TraceKind.FORWARD_MODE if C.is_forward_mode_tracer(x) else TraceKind.TRACED)
        elif isinstance(x, jax.ShapeDtypeStruct):
            kind = TraceKind.ABSTRACT
        elif not is_array_leaf(x):
            on_bad_leaf()
        keys.append(leaf_key(x))
    return tuple(keys), kind


def leaf_avals(leaves: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    """The abstract inputs programs are traced and compiled for (shardings kept)."""
    out = []
    for x in leaves:
        if isinstance(x, jax.Array) and not C.is_tracer(x):
            a = x.aval  # typed PRNG keys have no .weak_type of their own
            # An uncommitted array goes where the program runs, as under jit: no sharding.
            sharding = x.sharding if x.committed else None
            out.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding, weak_type=a.weak_type))
        elif isinstance(x, jax.ShapeDtypeStruct):
            out.append(x)
        else:
            a = jax.typeof(x)
            primal = C.concrete_primal(x) if C.is_tracer(x) else None
            sharding = primal.sharding if primal is not None and primal.committed else _explicit_sharding(a)
            out.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding, weak_type=a.weak_type))
    return out


def _explicit_sharding(aval: Any) -> Any:
    """The sharding an aval's type carries under a mesh with explicit axes (part of its type), else None."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if not spec or not any(p is not None for p in spec):
        return None
    explicit = jax.sharding.AxisType.Explicit
    return sharding if any(t == explicit for t in sharding.mesh.axis_types) else None


# --------------------------------------------------------------------------- describing
def _key_parts(k: Any) -> tuple[Any, Any]:
    """``(aval, sharding or None)`` of a leaf key."""
    return k if isinstance(k, tuple) else (k, None)


def describe_signature(sig: Signature) -> str:
    """``arg[0]: f32[3], kwarg['x']: i32[]``: a signature as a user reads it."""
    parts = [f"{p}: {format_aval(_key_parts(k)[0], weak=True)}" + _sharding_suffix(_key_parts(k)[1])
             for p, k in zip(leaf_paths(sig.treedef, "input"), sig.leaves)]
    if sig.static:
        parts.append(f"static={_static_repr(sig.static)}")
    return ", ".join(parts)


def _sharding_suffix(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return f" {spec}"
    return "" if sharding is None else f" {sharding}"


def describe_change(old: Signature, new: Signature) -> str:
    """Why ``new`` needs its own programs, against the last signature ``old``.

    Only a reason text: it never raises, whatever the static values' ``__eq__``
    or ``__repr__`` do (:class:`~jaxaot.runtime.arguments.StaticArg`).
    """
    static = _static_change(old.static, new.static)
    if static:
        return static
    if old.mesh != new.mesh:
        return f"mesh context changed: {old.mesh} -> {new.mesh}"
    if old.treedef != new.treedef:
        return f"input pytree structure changed: {old.treedef} -> {new.treedef}"
    diffs = []
    for path, ka, kb in zip(leaf_paths(new.treedef, "input"), old.leaves, new.leaves):
        (a, sa), (b, sb) = _key_parts(ka), _key_parts(kb)
        if (a.shape, a.dtype, a.weak_type) != (b.shape, b.dtype, b.weak_type):
            diffs.append(f"{path}: {format_aval(a, weak=True)} -> {format_aval(b, weak=True)}")
        elif sa != sb:
            diffs.append(f"{path}: sharding {sa} -> {sb}")
    return "; ".join(diffs) or "new signature"


def _static_change(old: tuple, new: tuple) -> str | None:
    """Why two calls' static arguments differ, or None when they are equal; never raises."""
    mutated = [f"arg[{b.index}]" for a, b in zip(old, new) if isinstance(a, StaticArg) and isinstance(b, StaticArg)
               and a.value is b.value and hash(a) != hash(b)]
    if mutated:
        return f"static argument {', '.join(mutated)} was mutated since an earlier call (its hash changed)"
    try:
        if old == new:
            return None
    except Exception:  # an __eq__ that raises: the values count as different
        pass
    return f"static arguments changed: {_static_repr(old)} -> {_static_repr(new)}"


def _static_repr(static: tuple) -> str:
    return repr(tuple(s if isinstance(s, StaticArg) else safe_repr(s) for s in static))


@dataclasses.dataclass(frozen=True)
class FusedChoice:
    """How one fused training step (:mod:`jaxaot.fusion`) was compiled.

    Attributes:
      executable: its name among the signature's executables (``"fused[...]"``).
      layouts: ``"auto"`` (XLA's residual layouts) or ``"pinned"``.
      order: ``"xla"`` or ``"consume_first"`` (the backward's order).
      barrier: which residuals pass ``optimization_barrier``: ``"all"``, ``"recomputed"`` or ``"none"``.
      rederived: the residuals the step's backward derives again instead of taking them
        (:mod:`jaxaot.fusion.rederive`), described as ``lower()``'s residual table does.
    """

    executable: str
    layouts: str
    order: str
    barrier: str
    rederived: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CacheEntryInfo:
    """One compiled signature of an :class:`~jaxaot.AOTFunction`: its executables by name, and for
    each fused training step among them the variant kept (:class:`FusedChoice`)."""

    signature: str
    reason: str
    executables: tuple[str, ...]
    fused: tuple[FusedChoice, ...] = ()


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What :meth:`AOTFunction.cache_info <jaxaot.AOTFunction.cache_info>` reports."""

    hits: int
    misses: int
    entries: tuple[CacheEntryInfo, ...]

    @property
    def recompiles(self) -> int:
        return max(self.misses - 1, 0)
