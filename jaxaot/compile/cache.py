"""The persistent compile cache: partitions and compiled executables on disk.

Turn it on with ``jaxaot.config.cache_dir = "/path"`` (or the environment
variable ``JAXAOT_CACHE_DIR``). The runtime then asks this module, instead of
the partitioner and the compiler, through two hooks: :func:`partition` (in
``_Training.partition``) and :func:`compile` (in ``_Entry.compile``). A warm
process still traces (the trace is the key) but runs neither the partitioner
nor XLA.

What is stored, under ``<cache_dir>/jaxaot-v1/``:

* ``partitions/<key>.bin``: the saved set of a partition, as positions of vars
  in the joint jaxpr (``["i", k]`` input k, ``["c", k]`` const k, ``["e", k, j]``
  output j of eqn k). :func:`jaxaot.partition.split_joint` rebuilds the
  :class:`~jaxaot.partition.Partition` from it. Any saved set gives correct
  gradients, so a stale entry can cost memory or time but never correctness;
  a partition that ``split_joint`` cannot reproduce exactly (a partitioner that
  rewrites the joint graph) is not stored.
* ``executables/<key>.bin``: ``jax.experimental.serialize_executable`` output
  for results that are ``jax.stages.Compiled``; other compilers' results are
  not stored. Programs with host callbacks or effects are never stored.

Keys (sha256, hex): the program's text (``str`` of the closed jaxpr, which is
deterministic across processes: vars are named at print time, source info is
not printed; object addresses are normalised away) plus the bytes of its
consts and literals (which the text does not show), the input avals (shape,
dtype, weak type, sharding), the partitioner's or compiler's identity (module,
qualname, bytecode hash, defaults, closure values, ``functools.partial``
arguments), donation, and the environment: jaxaot/jax/jaxlib versions,
platform, device kind and count, ``XLA_FLAGS``, x64 and matmul precision.

Every file is ``magic | sha256(payload) | len(payload) | payload``, written to
a temporary file and ``os.replace``-d into place, so readers see whole files
only and concurrent writers of one key are safe (the last one wins; both wrote
the same thing). A file that fails its checksum or cannot be decoded is
reported once (:class:`~jaxaot.errors.CacheWarning`) and rebuilt. Cache I/O
errors never fail a call.

The directory must be trusted: deserialising an executable can run code
(``jax.experimental.serialize_executable`` uses pickle), as with any compile cache.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot, tempfile
    >>> from jaxaot import cache
    >>> with jaxaot.config.override(cache_dir=tempfile.mkdtemp()):
    ...     _ = jax.grad(jaxaot.aot_function(lambda x: jnp.sin(x).sum()))(jnp.ones(3))
    ...     _ = jax.grad(jaxaot.aot_function(lambda x: jnp.sin(x).sum()))(jnp.ones(3))
    >>> cache.stats().executable_hits >= 2
    True
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np

from jaxaot import _compat as C
from jaxaot._config import config
from jaxaot.errors import CacheWarning
from jaxaot.partition.split import Partition, split_joint

FORMAT_VERSION = 1
_MAGIC = b"JXAOTC01"
_HEADER = struct.Struct("<8s32sQ")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FROZENSET = re.compile(r"frozenset\(\{([^{}]*)\}\)")


# --------------------------------------------------------------------------- statistics
@dataclasses.dataclass(frozen=True)
class CacheStats:
    """Counts since the process started (or :func:`reset_stats`).

    ``skipped`` counts partitions and programs that cannot be cached (a
    partitioner ``split_joint`` cannot reproduce, a result that is not a
    serialisable ``jax.stages.Compiled``, host callbacks, unhashable consts).
    """

    partition_hits: int = 0
    partition_misses: int = 0
    executable_hits: int = 0
    executable_misses: int = 0
    corrupt: int = 0
    skipped: int = 0


_counts: collections.Counter = collections.Counter()
_warned: set[str] = set()
_lock = threading.Lock()


def stats() -> CacheStats:
    """The hit/miss/corrupt counts of this process.

    Example:
        >>> from jaxaot import cache
        >>> isinstance(cache.stats().executable_misses, int)
        True
    """
    with _lock:
        return CacheStats(**{f.name: _counts[f.name] for f in dataclasses.fields(CacheStats)})


def reset_stats() -> None:
    """Zero the counts and forget which files were already warned about."""
    with _lock:
        _counts.clear()
        _warned.clear()


def _count(name: str) -> None:
    with _lock:
        _counts[name] += 1


def _warn_once(path: Path | str, message: str) -> None:
    with _lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warnings.warn(message, CacheWarning, stacklevel=4)


# --------------------------------------------------------------------------- hooks
def cached_partition(partition_fn: Callable[[Any], Partition], joint: Any) -> Partition:
    """``partition_fn(joint)``, from the cache when an entry exists (runtime hook)."""
    root = cache_root()
    if root is None:
        return partition_fn(joint)
    key = _digest(_partition_key_parts(partition_fn, joint))
    if key is None:
        _count("skipped")
        return partition_fn(joint)
    path = root / "partitions" / f"{key}.bin"
    payload = _read(path)
    if payload is not None:
        part = _decode_partition(joint, payload)
        if part is not None:
            _count("partition_hits")
            return part
        _corrupt(path, "its saved set does not rebuild a valid partition of this joint graph")
    _count("partition_misses")
    part = partition_fn(joint)
    record = _encode_partition(joint, part)
    if record is None:
        _count("skipped")
    else:
        _write(path, record)
    return part


def cached_compile(compiler: Callable, closed: Any, avals: Sequence[Any], **kwargs: Any) -> Any:
    """``compiler(closed, avals, **kwargs)``, from the cache when an entry exists (runtime hook)."""
    root = cache_root()
    if root is None:
        return compiler(closed, avals, **kwargs)
    key = None if _has_host_callbacks(closed) else _digest(_executable_key_parts(compiler, closed, avals, kwargs))
    if key is None:
        _count("skipped")
        return compiler(closed, avals, **kwargs)
    path = root / "executables" / f"{key}.bin"
    payload = _read(path)
    if payload is not None:
        exe = _decode_executable(payload)
        if exe is not None:
            _count("executable_hits")
            return exe
        _corrupt(path, "the serialized executable could not be loaded")
    _count("executable_misses")
    exe = compiler(closed, avals, **kwargs)
    blob = _encode_executable(exe, len(avals), len(C.jaxpr_of(closed).outvars))
    if blob is None:
        _count("skipped")
    else:
        _write(path, blob)
    return exe


def cache_root() -> Path | None:
    """``<jaxaot.config.cache_dir>/jaxaot-v1``, or None when the cache is off."""
    if not config.cache_dir:
        return None
    return Path(config.cache_dir) / f"jaxaot-v{FORMAT_VERSION}"


# --------------------------------------------------------------------------- keys
class _Unkeyable(Exception):
    """A value whose identity cannot be written down (the entry is then not cached)."""


def _digest(parts: Iterable[Any] | None) -> str | None:
    if parts is None:
        return None
    h = hashlib.sha256()
    try:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            h.update(struct.pack("<Q", len(b)))
            h.update(b)
    except _Unkeyable:
        return None
    return h.hexdigest()


def _partition_key_parts(partition_fn: Callable, joint: Any) -> Iterable[Any]:
    yield "partition"
    yield from _environment()
    yield callable_identity(partition_fn)
    yield program_fingerprint(joint.jaxpr)
    yield avals_key(joint.in_avals)
    yield repr((joint.differentiable, joint.needs_cotangent, joint.num_outputs))


def _executable_key_parts(compiler: Callable, closed: Any, avals: Sequence[Any], kwargs: dict) -> Iterable[Any]:
    yield "executable"
    yield from _environment()
    yield callable_identity(compiler)
    yield program_fingerprint(closed)
    yield avals_key(avals)
    yield value_identity(dict(sorted(kwargs.items())))


@functools.lru_cache(maxsize=1)
def _environment() -> tuple[str, ...]:
    """What a compiled executable depends on besides its program (fixed per process)."""
    dev = jax.devices()[0]
    jaxaot_version = getattr(sys.modules.get("jaxaot"), "__version__", "?")
    return (
        f"cache-format={FORMAT_VERSION}",
        f"jaxaot={jaxaot_version}",
        f"jax={jax.__version__}",
        f"jaxlib={_jaxlib_version()}",
        f"platform={dev.platform}",
        f"device_kind={getattr(dev, 'device_kind', '?')}",
        f"device_count={jax.device_count()}",
        f"xla_flags={os.environ.get('XLA_FLAGS', '')}",
        f"x64={getattr(jax.config, 'jax_enable_x64', None)}",
        f"matmul_precision={getattr(jax.config, 'jax_default_matmul_precision', None)}",
    )


def _jaxlib_version() -> str:
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # pragma: no cover - jaxlib always has a version
        return "?"


def program_fingerprint(closed: Any) -> str:
    """sha256 of a closed jaxpr: its text plus the bytes of every const and literal.

    The text does not show const values (nor all of a large literal), so those
    are hashed separately, in program order, sub-jaxprs included.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot.cache import program_fingerprint
        >>> a = program_fingerprint(jax.make_jaxpr(lambda x: x + jnp.arange(3.0))(1.0))
        >>> b = program_fingerprint(jax.make_jaxpr(lambda x: x + jnp.arange(3.0) * 2)(1.0))
        >>> a == b
        False
    """
    h = hashlib.sha256(canonical_text(closed).encode())
    for value in _program_values(closed):
        h.update(_array_identity(value).encode())
    return h.hexdigest()


def canonical_text(closed: Any) -> str:
    """``str(closed)`` without what differs between processes for the same program.

    Object addresses (``<function f at 0x7f..>`` in callback params) are blanked;
    frozenset elements, printed in hash order (``PYTHONHASHSEED``), are sorted.
    """
    text = _ADDRESS.sub(" at 0x?", str(closed))
    return _FROZENSET.sub(lambda m: "frozenset({" + ", ".join(sorted(m.group(1).split(", "))) + "})", text)


def _program_values(closed: Any) -> Iterable[Any]:
    yield from C.consts_of(closed)
    for eqn in C.jaxpr_of(closed).eqns:
        for v in eqn.invars:
            if C.is_literal(v):
                yield v.val
        for sub in C.eqn_subjaxprs(eqn):
            yield from _program_values(sub)


def _has_host_callbacks(closed: Any) -> bool:
    # A serialized executable cannot carry a Python callback; effects (ordered
    # callbacks, prints) must run, so such programs are always compiled afresh.
    if C.jaxpr_of(closed).effects:
        return True
    return any(is_host_callback(e) for e in _all_eqns(closed))


def is_host_callback(eqn: Any) -> bool:
    """Whether ``eqn`` runs Python on the host (``jax.debug.print`` / ``callback``, io/pure callbacks)."""
    name = str(eqn.primitive)
    return "callback" in name or name == "debug_print"


def _all_eqns(closed: Any) -> Iterable[Any]:
    for eqn in C.jaxpr_of(closed).eqns:
        yield eqn
        for sub in C.eqn_subjaxprs(eqn):
            yield from _all_eqns(sub)


def _array_identity(value: Any) -> str:
    try:
        a = np.asarray(value)
    except Exception:
        raise _Unkeyable(type(value).__name__) from None
    if a.dtype == object:
        raise _Unkeyable(type(value).__name__)
    return f"{a.dtype.str}{a.shape}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}"


def avals_key(avals: Sequence[Any]) -> str:
    """Shape, dtype, weak type and sharding of each input."""
    return ";".join(
        f"{tuple(str(d) for d in a.shape)}{np.dtype(a.dtype).str}"
        f"{'w' if getattr(a, 'weak_type', False) else ''}@{getattr(a, 'sharding', None)!r}"
        for a in avals
    )


def value_identity(value: Any, depth: int = 0) -> str:
    """A text that names ``value`` across processes (arrays by content hash).

    A repr with an object address makes the key differ in each process: the
    entry is then never hit, which is safe.
    """
    if depth > 8:
        raise _Unkeyable("too deep")
    if isinstance(value, (str, int, float, complex, bool, type(None))):
        return repr(value)
    if isinstance(value, (np.ndarray, jax.Array, np.generic)):
        return _array_identity(value)
    if isinstance(value, (tuple, list)):
        inner = ",".join(value_identity(v, depth + 1) for v in value)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, dict):
        inner = ",".join(f"{value_identity(k, depth + 1)}:{value_identity(v, depth + 1)}" for k, v in value.items())
        return f"{type(value).__name__}({inner})"
    if callable(value):
        return callable_identity(value, depth + 1)
    return f"{type(value).__module__}.{type(value).__qualname__}:{value!r}"


def callable_identity(fn: Any, depth: int = 0) -> str:
    """Module, qualname, bytecode hash, defaults and closure values of a callable.

    ``functools.partial`` objects add their arguments, so
    ``partial(min_cut_rematerialization_partition, memory_budget=0.5)`` and
    ``memory_budget=0.7`` key differently.

    Example:
        >>> import functools, jaxaot
        >>> from jaxaot.cache import callable_identity
        >>> p = functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=0.5)
        >>> "memory_budget" in callable_identity(p)
        True
    """
    if depth > 8:
        raise _Unkeyable("too deep")
    if isinstance(fn, functools.partial):
        args = value_identity(fn.args, depth + 1)
        kw = value_identity(dict(sorted(fn.keywords.items())), depth + 1)
        return f"partial({callable_identity(fn.func, depth + 1)},{args},{kw})"
    if hasattr(fn, "__func__") and hasattr(fn, "__self__"):  # bound method
        return f"method({callable_identity(fn.__func__, depth + 1)},{value_identity(fn.__self__, depth + 1)})"
    code = getattr(fn, "__code__", None)
    if code is None:  # builtins, callable objects
        return f"{type(fn).__module__}.{type(fn).__qualname__}:{getattr(fn, '__qualname__', None)}:{fn!r}"
    parts = [
        f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', None)}",
        _code_hash(code),
        value_identity(getattr(fn, "__defaults__", None), depth + 1),
        value_identity(getattr(fn, "__kwdefaults__", None), depth + 1),
    ]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            parts.append(value_identity(cell.cell_contents, depth + 1))
        except ValueError:  # an empty cell
            parts.append("<empty>")
    return "fn(" + ",".join(parts) + ")"


def _code_hash(code: Any) -> str:
    h = hashlib.sha256(code.co_code)
    for c in code.co_consts:
        h.update(_code_hash(c).encode() if hasattr(c, "co_code") else repr(c).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- partitions
def _var_positions(jaxpr: Any) -> dict[Any, list]:
    pos: dict[Any, list] = {}
    for k, v in enumerate(jaxpr.invars):
        pos.setdefault(v, ["i", k])
    for k, v in enumerate(jaxpr.constvars):
        pos.setdefault(v, ["c", k])
    for k, eqn in enumerate(jaxpr.eqns):
        for j, v in enumerate(eqn.outvars):
            if not C.is_drop_var(v):
                pos.setdefault(v, ["e", k, j])
    return pos


def _vars_at(jaxpr: Any, positions: Sequence[Sequence[Any]]) -> list:
    out = []
    for p in positions:
        tag, k = p[0], int(p[1])
        if tag == "i":
            out.append(jaxpr.invars[k])
        elif tag == "c":
            out.append(jaxpr.constvars[k])
        elif tag == "e":
            out.append(jaxpr.eqns[k].outvars[int(p[2])])
        else:
            raise ValueError(f"unknown var position {p!r}")
    return out


def _saved_vars(part: Partition) -> list:
    # split_joint's backward takes (cotangents..., saved inputs..., saved outputs...):
    # exactly the saved vars of the joint jaxpr, when the partition came from it.
    return list(C.jaxpr_of(part.backward).invars[len(part.cotangent_outputs):])


def _summary(part: Partition) -> dict:
    return {
        "saved_inputs": list(part.saved_inputs),
        "saved_outputs": list(part.saved_outputs),
        "residuals": [[[str(d) for d in r.aval.shape], np.dtype(r.aval.dtype).name] for r in part.residuals],
    }


def _same_partition(a: Partition, b: Partition) -> bool:
    fields = ("num_outputs", "cotangent_outputs", "saved_inputs", "saved_outputs", "grad_inputs",
              "residuals", "recomputed")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and (
        str(a.forward) == str(b.forward) and str(a.backward) == str(b.backward)
    )


def _split_source(joint: Any, plan: Any) -> Any:
    """The joint graph a partition is split from: ``joint``, or it with a primal rewrite replayed."""
    if plan is None:
        return joint
    from jaxaot.partition.min_cut import rejoint_with_plan  # only min-cut rewrites primals

    return rejoint_with_plan(joint, plan)


def _encode_partition(joint: Any, part: Partition) -> bytes | None:
    """The saved set as var positions (plus any primal-rewrite plan), or None if they
    cannot reproduce ``part``."""
    plan = part.primal_plan
    source = part.split_from if plan is not None else joint
    if source is None:
        return None
    pos = _var_positions(C.jaxpr_of(source.jaxpr))
    saved = _saved_vars(part)
    if not all(not C.is_literal(v) and v in pos for v in saved):
        return None  # the partitioner rewrote the joint graph without telling how: not replayable
    try:
        rebuilt_source = _split_source(joint, plan)
        rebuilt = split_joint(rebuilt_source, _vars_at(C.jaxpr_of(rebuilt_source.jaxpr), [pos[v] for v in saved]))
    except Exception:
        return None
    if not _same_partition(rebuilt, part):
        return None
    record = {"format": FORMAT_VERSION, "saved": [pos[v] for v in saved], "summary": _summary(part), "plan": plan}
    return json.dumps(record, sort_keys=True).encode()


def _decode_partition(joint: Any, payload: bytes) -> Partition | None:
    try:
        record = json.loads(payload)
        if record.get("format") != FORMAT_VERSION:
            return None
        plan = record.get("plan")
        source = _split_source(joint, plan)
        part = split_joint(source, _vars_at(C.jaxpr_of(source.jaxpr), record["saved"]))
        if plan is not None:
            part = dataclasses.replace(part, primal_plan=plan, split_from=source)
    except Exception:
        return None
    return part if _summary(part) == record["summary"] else None


# --------------------------------------------------------------------------- executables
def _encode_executable(exe: Any, n_in: int, n_out: int) -> bytes | None:
    if not isinstance(exe, jax.stages.Compiled):
        return None
    try:
        from jax.experimental import serialize_executable

        blob, in_tree, out_tree = serialize_executable.serialize(exe)
    except Exception:  # backends or programs that do not serialize
        return None
    if in_tree != _in_tree(n_in) or out_tree != _out_tree(n_out):
        return None  # not a compilers.xla-style flat program: we could not rebuild its trees
    header = json.dumps({"n_in": n_in, "n_out": n_out}).encode()
    return struct.pack("<I", len(header)) + header + blob


def _decode_executable(payload: bytes) -> Any | None:
    try:
        from jax.experimental import serialize_executable

        (n,) = struct.unpack_from("<I", payload)
        header = json.loads(payload[4: 4 + n])
        blob = payload[4 + n:]
        return serialize_executable.deserialize_and_load(
            blob, _in_tree(int(header["n_in"])), _out_tree(int(header["n_out"]))
        )
    except Exception:
        return None


def _in_tree(n: int) -> Any:
    return jax.tree_util.tree_structure((tuple(range(n)), {}))


def _out_tree(n: int) -> Any:
    return jax.tree_util.tree_structure(list(range(n)))


# --------------------------------------------------------------------------- files
def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def _unframe(data: bytes) -> bytes | None:
    if len(data) < _HEADER.size:
        return None
    magic, digest, n = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != _MAGIC or n != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _read(path: Path) -> bytes | None:
    """The entry's payload; None when absent. A corrupt entry warns once and reads as absent."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        _warn_once(path, f"jaxaot cache: cannot read {path} ({err}); compiling instead.")
        return None
    payload = _unframe(data)
    if payload is None:
        _corrupt(path, "it is truncated or fails its checksum")
    return payload


def _corrupt(path: Path, why: str) -> None:
    _count("corrupt")
    _warn_once(path, f"jaxaot cache: ignoring corrupt entry {path} ({why}); rebuilding it.")


def _write(path: Path, payload: bytes) -> None:
    try:
        atomic_write(path, _frame(payload))
    except OSError as err:
        root = cache_root() or path.parent
        _warn_once(root, f"jaxaot cache: cannot write to {root} ({err}); not caching.")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the new one, never a partial one; concurrent
    writers are safe (the last one wins). Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
