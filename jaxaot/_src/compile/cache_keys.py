"""What names a cache entry: a program, a partitioner or compiler, and the environment.

A key is a sha256 over the entry's kind, the environment (versions, platform,
devices, ``XLA_FLAGS``, precision), the partitioner's or compiler's identity
(code, defaults, closures, and the user's code they reach: :mod:`code_reach`),
the program with its consts, the input avals and shardings, and the options.
A partition is keyed by what its joint graph is a function of
(:class:`~jaxaot._src.tracing.JointRecipe`: the primal program, differentiated
inputs, decompositions, runtime aux outputs) and JAX's trace context, so it is
found without building the joint graph. Values are written canonically
(:func:`value_identity`) so a key is the same in every process; a value that
cannot be written down makes the key None (not cached).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.compile import cache_keys
    >>> closed = jax.make_jaxpr(jnp.sin)(1.0)
    >>> avals = [jax.ShapeDtypeStruct((), jnp.float32)]
    >>> len(cache_keys.executable_key(print, closed, avals, {}))
    64
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import struct
import sys
from typing import Any, Iterable, Sequence

import jax
import jaxlib
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import dtype_name
from jaxaot._src.compile.code_reach import Unkeyable as _Unkeyable
from jaxaot._src.compile.compilers import Compiler
from jaxaot._src.compile.store import FORMAT_VERSION, FRAME_VERSION
from jaxaot._src.partition import Partitioner
from jaxaot._src.tracing import JointRecipe, build_joint
from jaxaot._src.compile.value_keys import ADDRESS, array_identity, callable_identity, type_name, value_identity

_FROZENSET = re.compile(r"frozenset\(\{([^{}]*)\}\)")


# --------------------------------------------------------------------------- keys
def partition_key(partition_fn: Partitioner, recipe: JointRecipe) -> str | None:
    """The key of ``partition_fn(recipe.build())``; None when it cannot be keyed."""
    return _digest(_partition_key_parts(partition_fn, recipe))


def executable_key(compiler: Compiler, closed: Any, avals: Sequence[Any], options: dict) -> str | None:
    """The key of ``compiler(closed, avals, **options)``; None when it cannot be keyed."""
    return _digest(_executable_key_parts(compiler, closed, avals, options))


def _partition_key_parts(partition_fn: Partitioner, recipe: JointRecipe) -> Iterable[Any]:
    yield "partition"
    yield from environment()
    yield trace_context_key()
    yield callable_identity(partition_fn)
    yield callable_identity(build_joint)
    yield program_fingerprint(recipe.primal)
    yield custom_rules_identity(recipe.primal)
    yield avals_key(recipe.in_avals)
    yield value_identity(recipe.differentiated)
    yield value_identity(recipe.decompositions)
    yield value_identity(recipe.aux_outputs)


def _executable_key_parts(compiler: Compiler, closed: Any, avals: Sequence[Any], options: dict) -> Iterable[Any]:
    yield "executable"
    yield from environment()
    yield trace_context_key()  # lowering reads it too (jax_threefry_partitionable, jaxaot's loop lowerings)
    yield callable_identity(compiler)
    yield program_fingerprint(closed)
    yield avals_key(avals)
    yield value_identity(dict(sorted(options.items())))


def _digest(parts: Iterable[Any]) -> str | None:
    h = hashlib.sha256()
    try:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            h.update(struct.pack("<Q", len(b)))
            h.update(b)
    except _Unkeyable:
        return None
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def environment() -> tuple[str, ...]:
    """What a compiled executable depends on besides its program (fixed per process)."""
    dev = jax.devices()[0]
    # Looked up, not imported: jaxaot's __init__ imports this package.
    jaxaot_version = getattr(sys.modules.get("jaxaot"), "__version__", "?")
    return (
        f"cache-format={FORMAT_VERSION}.{FRAME_VERSION}",
        f"jaxaot={jaxaot_version}",
        f"jax={jax.__version__}",
        f"jaxlib={jaxlib.__version__}",
        f"platform={dev.platform}",
        f"device_kind={getattr(dev, 'device_kind', '?')}",
        f"device_count={jax.device_count()}",
        f"xla_flags={os.environ.get('XLA_FLAGS', '')}",
        f"x64={getattr(jax.config, 'jax_enable_x64', None)}",
        f"matmul_precision={getattr(jax.config, 'jax_default_matmul_precision', None)}",
    )


def trace_context_key() -> str:
    """JAX's trace context, written canonically: what tracing depends on besides the program.

    It is the configuration JAX keys its own tracing caches by (x64, dtype
    promotion, the mesh and named axes in scope, jaxaot's traced settings and
    loop options), and the devices of the mesh ``jax.set_mesh`` entered, which
    ``jit`` keys by too. Values without a canonical text (JAX's axis environment)
    are written by their fields; object addresses are blanked.
    """
    mesh = C.device_context()
    devices = "" if mesh is None else f";mesh devices={mesh.device_ids.tolist()}"
    return ";".join(ADDRESS.sub(" at 0x?", _context_value(v)) for v in C.trace_context()) + devices


def _context_value(value: Any) -> str:
    slots = [s for s in getattr(type(value), "__slots__", ()) if not s.startswith("__")]
    if slots and ADDRESS.search(repr(value)):
        return f"{type_name(value)}({','.join(f'{s}={value_identity(getattr(value, s, None), 1)}' for s in slots)})"
    return value_identity(value)


# --------------------------------------------------------------------------- programs
def program_fingerprint(closed: Any) -> str:
    """sha256 of a closed jaxpr: its text plus the bytes of every const and literal, and what its params hold
    that the text leaves out (:func:`_unprinted`).

    The text does not show const values (nor all of a large literal), so those
    are hashed separately, in program order, sub-jaxprs included.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxaot._src.compile.cache_keys import program_fingerprint
        >>> a = program_fingerprint(jax.make_jaxpr(lambda x: x + jnp.arange(3.0))(1.0))
        >>> b = program_fingerprint(jax.make_jaxpr(lambda x: x + jnp.arange(3.0) * 2)(1.0))
        >>> a == b
        False
    """
    h = hashlib.sha256(canonical_text(closed).encode())
    for value in _program_values(closed):
        h.update(array_identity(value).encode())
    for eqn in C.iter_eqns(closed):
        for param in eqn.params.values():
            for part in _unprinted(param):
                h.update(part.encode())
    return h.hexdigest()


def _unprinted(value: Any, inside: bool = False, depth: int = 0) -> Iterable[str]:
    """What a param holds that the program's text leaves out, as text to hash: the jaxprs inside its dataclasses
    (a Pallas kernel's index maps, in its grid mapping) by their fingerprints, and its shardings' devices in mesh
    order (a mesh prints its axes alone: a ``with_sharding_constraint``'s, a ``reshard``'s)."""
    if isinstance(value, (C.ClosedJaxpr, C.Jaxpr)):
        if inside:  # (a jaxpr param itself is printed)
            yield program_fingerprint(value)
    elif isinstance(value, jax.sharding.Sharding):
        yield sharding_key(value)
    elif depth < 8 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _unprinted(v, inside, depth + 1)
    elif depth < 8 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _unprinted(getattr(value, field.name, None), True, depth + 1)


def custom_rules_identity(closed: Any) -> str:
    """The code of the ``jax.custom_jvp`` and ``jax.custom_vjp`` rules ``closed`` calls, which its text does not show
    and its gradient depends on (:func:`callable_identity` of each); unkeyable where a rule is not found."""
    parts = []
    for eqn in C.iter_eqns(closed):
        rules = C.custom_rule_functions(eqn)
        if rules is None:
            raise _Unkeyable(f"the rules of {eqn.primitive}")
        parts.extend(callable_identity(r) for r in rules)
    return f"rules({','.join(parts)})"


def canonical_text(closed: Any) -> str:
    """``str(closed)`` without what differs between processes for the same program.

    Object addresses (``<function f at 0x7f..>`` in callback params) are blanked;
    frozenset elements, printed in hash order (``PYTHONHASHSEED``), are sorted.
    """
    text = ADDRESS.sub(" at 0x?", str(closed))
    return _FROZENSET.sub(lambda m: "frozenset({" + ", ".join(sorted(m.group(1).split(", "))) + "})", text)


def _program_values(closed: Any) -> Iterable[Any]:
    """The consts of ``closed``, then per eqn (depth first) its literals and the consts of its sub-jaxprs."""
    yield from C.consts_of(closed)
    for eqn in C.iter_eqns(closed):
        yield from (v.val for v in eqn.invars if C.is_literal(v))
        for sub in C.eqn_subjaxprs(eqn):
            yield from C.consts_of(sub)


def avals_key(avals: Sequence[Any]) -> str:
    """Shape, dtype, weak type and sharding of each input (mesh shape, axis names and device order)."""
    return ";".join(
        f"{tuple(str(d) for d in a.shape)}{_dtype_key(a.dtype)}"
        f"{'w' if getattr(a, 'weak_type', False) else ''}@{sharding_key(getattr(a, 'sharding', None))}"
        for a in avals
    )


def sharding_key(sharding: Any) -> str:
    """A sharding's repr (mesh axis names and sizes, spec, memory kind) plus its devices, in mesh order."""
    if sharding is None:
        return "None"
    return f"{sharding!r}:devices={_device_ids(sharding)}"


def _device_ids(sharding: Any) -> Any:
    """The ids of a sharding's devices in mesh order (a list), or ``"abstract"`` for a sharding on an abstract mesh
    (under ``jax.set_mesh`` with explicit axes), which names axes but no devices: its ``repr`` keys it."""
    mesh = getattr(sharding, "mesh", None)
    try:
        ids = getattr(mesh, "device_ids", None)
        if ids is None:
            ids = sorted(d.id for d in getattr(sharding, "device_set", ()))
    except ValueError:  # JAX's AbstractMesh "does not implement device_ids" (a ValueError, not an AttributeError)
        return "abstract"
    return np.asarray(ids).tolist()


def _dtype_key(dtype: Any) -> str:
    """numpy's ``'<f4'`` spelling; the name of an extended dtype (``key<fry>``), which numpy cannot read."""
    try:
        return np.dtype(dtype).str
    except TypeError:
        return dtype_name(dtype)
