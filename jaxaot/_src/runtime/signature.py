"""Input signatures: what selects a compiled program, and what ``cache_info()`` reports about it.

A :class:`Signature` is the pytree structure of ``(args, kwargs)``, one key per leaf
(aval, plus sharding when committed elsewhere than the default device) and the
static arguments; tracers key the same, so ``jit`` reuses what eager calls built.
:func:`lookup_keys` runs on every call, so it is kept cheap. :class:`CacheInfo` is
what every jaxaot callable's ``cache_info()`` reports: hits, misses, and per
signature the executables, compiles, stage times and the reason it compiled.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval, is_array_leaf, leaf_paths
from jaxaot._src.fusion import FusedChoice
from jaxaot._src.runtime.arguments import StaticArg, safe_repr
from jaxaot._src.runtime.shardings import default_device

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
    #: JAX's configuration that tracing reads (``jax_enable_x64``, matmul precision, dtype and rank promotion, ...):
    #: a program traced under one setting is never run under another, as under ``jit``
    config: Any = None


# --------------------------------------------------------------------------- leaf keys
_SHARDING_KEYS: dict[Any, Any] = {}  # a program sees few distinct shardings: remember each one's key


def sharding_key(sharding: Any) -> Any:
    """None for the default device (keys like a tracer's), else the sharding itself. Under
    ``jax.default_device(d)`` the default is ``d``: an array committed to the first device is then keyed by its
    sharding, as one committed elsewhere (uncommitted arrays follow the default, which the signature's JAX
    configuration holds)."""
    if jax.config.jax_default_device is not None:
        return None if C.single_device_of(sharding) == default_device() else sharding
    try:
        return _SHARDING_KEYS[sharding]
    except KeyError:
        pass
    key = None if C.single_device_of(sharding) == default_device() else sharding
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
            out.append(C.abstract_input(a, sharding))  # inside shard_map, with the manual axes it varies over
    return out


def _explicit_sharding(aval: Any) -> Any:
    """The sharding an aval's type carries under a mesh with explicit axes (part of its type, replicated ones
    too: a gradient contracted over a sharded axis takes its parameter's), else None."""
    sharding = getattr(aval, "sharding", None)
    if getattr(sharding, "spec", None) is None:
        return None
    return sharding if C.explicit_axes(getattr(sharding, "mesh", None)) else None


# --------------------------------------------------------------------------- describing
def key_parts(k: Any) -> tuple[Any, Any]:
    """``(aval, sharding or None)`` of a leaf key."""
    return k if isinstance(k, tuple) else (k, None)


def describe_signature(sig: Signature, paths: Sequence[str] | None = None,
                       static_names: Sequence[str] | None = None) -> str:
    """``x: f32[3], scale: i32[], n=4``: a signature as a user reads it (``paths`` name the leaves,
    default ``arg[0]``, ``kwarg['scale']``; ``static_names`` the static arguments)."""
    if paths is None:
        paths = leaf_paths(sig.treedef, "input")
    parts = [f"{p}: {format_aval(key_parts(k)[0], weak=True)}" + _sharding_suffix(key_parts(k)[1])
             for p, k in zip(paths, sig.leaves)]
    if static_names is not None and len(static_names) == len(sig.static):
        parts += [f"{n}={safe_repr(s.value if isinstance(s, StaticArg) else s, 80)}"
                  for n, s in zip(static_names, sig.static)]
    elif sig.static:
        parts.append("static=" + repr(tuple(s if isinstance(s, StaticArg) else safe_repr(s) for s in sig.static)))
    return ", ".join(parts)


def sharding_text(sharding: Any) -> str:
    """A sharding as a reason prints it: its ``PartitionSpec`` when it has one, ``default device`` for None."""
    if sharding is None:
        return "default device"
    spec = getattr(sharding, "spec", None)
    return str(spec) if spec is not None else str(sharding)


def _sharding_suffix(sharding: Any) -> str:
    return "" if sharding is None else f" {sharding_text(sharding)}"


@dataclasses.dataclass(frozen=True)
class CacheEntryInfo:
    """One compiled signature of a program: what was compiled for it, how long each stage took, and why.

    Attributes:
      signature: the inputs, as the user named them (``params['w']: f32[3,2], x: f32[4,3]``).
      reason: why it compiled: ``"first call"``, or what changed against the nearest compiled
        signature, in words (``x: shape (4, 3) → (5, 3)``, ``static argument `n`: 3 → 4``,
        ``Python branch at model.py:42 took the other side``).
      executables: the executables kept, by name (``inference``, ``forward``, ``backward``, ``fused``, ...).
      fused: for each fused training step compiled, the variant kept, whether it or the split
        executables run, and why (:class:`~jaxaot.FusedChoice`).
      program: which of the callable's programs this entry belongs to: ``""`` for a callable with
        one, else ``"call"`` / ``"loss"`` (``aot_module``), ``"stage0"`` (pipelines), ``"step"`` /
        ``"backward"`` (compiled autograd), ...
      compiles: every compilation made for it, in order: each kept executable once, and each variant
        of the fused step tried (``fused:pinned:xla:recomputed:0``) once. A name twice is a
        duplicate compile (:attr:`duplicates`), which never happens.
      times: seconds per stage: ``trace`` (and ``joint``), ``partition``, ``compile_<name>`` (XLA, or the
        persistent cache); compiled autograd reports ``record`` (the forward recorded) instead of a trace.
    """

    signature: str
    reason: str
    executables: tuple[str, ...]
    fused: tuple[FusedChoice, ...] = ()
    program: str = ""
    compiles: tuple[str, ...] = ()
    times: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)

    @property
    def trace_seconds(self) -> float:
        """Seconds spent tracing (the primal, the joint graph, a recorded forward)."""
        return self._seconds("trace", "joint", "record")

    @property
    def partition_seconds(self) -> float:
        """Seconds spent partitioning (or reading the partition from the persistent cache)."""
        return self._seconds("partition")

    @property
    def xla_seconds(self) -> float:
        """Seconds spent compiling (in XLA, or reading executables from the persistent cache)."""
        return self._seconds("compile_")

    def _seconds(self, *prefixes: str) -> float:
        return sum(t for k, t in self.times.items() if k.startswith(prefixes))

    @property
    def variants(self) -> tuple[str, ...]:
        """The fused step's variants compiled to be weighed (kept or not), the compiles that are not kept
        executables."""
        return tuple(dict.fromkeys(c for c in self.compiles if c not in self.executables))

    @property
    def duplicates(self) -> tuple[str, ...]:
        """Names compiled more than once for this signature (a duplicate compile; always empty)."""
        counts = collections.Counter(self.compiles)
        return tuple(name for name, n in counts.items() if n > 1)


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What ``cache_info()`` of any callable jaxaot returns reports: lookups that hit, signatures compiled,
    and one :class:`CacheEntryInfo` per compiled signature (of each of its programs).

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
        >>> _ = f(jnp.ones(3)); _ = f(jnp.ones(3)); _ = f(jnp.ones(4))
        >>> info = f.cache_info()
        >>> info.hits, info.misses, info.entries[1].reason
        (1, 2, 'x: shape (3,) → (4,)')
    """

    hits: int
    misses: int
    entries: tuple[CacheEntryInfo, ...]

    @property
    def recompiles(self) -> int:
        """Signatures compiled after the first of their program."""
        return max(len(self.entries) - len({e.program for e in self.entries}), 0)

    @property
    def compiles(self) -> int:
        """Compilations, fused-step variants included."""
        return sum(len(e.compiles) for e in self.entries)

    @property
    def duplicates(self) -> tuple[str, ...]:
        """Every duplicate compile, as ``"name for signature"`` (always empty: each program of a signature
        compiles once, however many threads call)."""
        return tuple(f"{name} for {e.signature}" for e in self.entries for name in e.duplicates)

    @classmethod
    def combine(cls, parts: Mapping[str, "CacheInfo"]) -> "CacheInfo":
        """One report of several programs': counts summed, each entry labelled by its part (``program``).

        Example:
            >>> from jaxaot import CacheEntryInfo, CacheInfo
            >>> a = CacheInfo(2, 1, (CacheEntryInfo("x: f32[3]", "first call", ("fused",)),))
            >>> CacheInfo.combine({"call": CacheInfo(0, 0, ()), "loss": a}).entries[0].program
            'loss'
        """
        entries = tuple(dataclasses.replace(e, program=f"{label}.{e.program}" if e.program else label)
                        for label, info in parts.items() for e in info.entries)
        return cls(sum(i.hits for i in parts.values()), sum(i.misses for i in parts.values()), entries)

    def __str__(self) -> str:
        lines = [f"{self.misses} compiled, {self.hits} hits"]
        for e in self.entries:
            where = f"[{e.program}] " if e.program else ""
            lines.append(f"{where}{e.signature or 'no inputs'}: {e.reason}")
            tried = f" (variants weighed: {', '.join(e.variants)})" if e.variants else ""
            times = (f"; trace {e.trace_seconds * 1e3:.1f} ms, partition {e.partition_seconds * 1e3:.1f} ms, "
                     f"XLA {e.xla_seconds * 1e3:.1f} ms") if e.times else ""
            lines.append(f"    {', '.join(e.executables) or 'nothing compiled'}{tried}{times}")
        return "\n".join(lines)
