"""A compiled program as a cache entry: a serialized ``jax.stages.Compiled``.

The payload is a JSON header (input and output counts, device ids) and the bytes
of ``jax.experimental.serialize_executable``. Only flat programs (what
:func:`~jaxaot._src.compile.compilers.xla` compiles) are stored, so the header is
enough to rebuild their pytrees. Loading unpickles, so :mod:`~jaxaot._src.compile.store`
hands over only payloads signed with this user's key; :func:`misfit` then compares
the executable's input and output types with the program's.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.files import parse_json

_LENGTH = struct.Struct("<I")


def encode(exe: Any, n_in: int, n_out: int) -> bytes | None:
    """The payload of ``exe``; None when it is not a serializable flat ``jax.stages.Compiled``."""
    if not isinstance(exe, jax.stages.Compiled):
        return None
    try:
        blob, in_tree, out_tree = C.serialize_executable(exe)
    except Exception:  # backends or programs that do not serialize
        return None
    if in_tree != _in_tree(n_in) or out_tree != _out_tree(n_out):
        return None  # not a compilers.xla-style flat program: we could not rebuild its trees
    header = json.dumps({"n_in": n_in, "n_out": n_out, "devices": C.executable_device_ids(exe)}).encode()
    return _LENGTH.pack(len(header)) + header + blob


def decode(payload: bytes | memoryview) -> jax.stages.Compiled | None:
    """The executable :func:`encode` stored, loaded; None when the payload does not load."""
    try:
        (n,) = _LENGTH.unpack_from(payload)
        header = parse_json(payload[_LENGTH.size: _LENGTH.size + n], max_depth=2)
        blob = payload[_LENGTH.size + n:]
        devices = header.get("devices")
        return C.deserialize_executable(blob, _in_tree(int(header["n_in"])), _out_tree(int(header["n_out"])),
                                        None if devices is None else [int(i) for i in devices])
    except Exception:
        return None


def misfit(exe: jax.stages.Compiled, in_avals: Sequence[Any], out_avals: Sequence[Any]) -> str | None:
    """Why ``exe`` cannot run a program of these input and output types (shape and dtype), or None.

    A loaded executable carries its own types; an entry whose types differ from
    the program it was looked up for (a stale or misplaced entry) would make
    every call fail, or compute another program, so the cache evicts it.
    """
    try:
        have_in = [a for a in jax.tree_util.tree_leaves(exe.in_avals)]
        have_out = [a for a in jax.tree_util.tree_leaves(exe.out_info)]
    except Exception as err:  # an executable that cannot say what it takes
        return f"its types cannot be read ({type(err).__name__})"
    for what, have, want in (("inputs", have_in, in_avals), ("outputs", have_out, out_avals)):
        if len(have) != len(want):
            return f"it has {len(have)} {what}, the program {len(want)}"
        for i, (h, w) in enumerate(zip(have, want)):
            if _type(h) != _type(w):
                return f"its {what[:-1]} {i} is {_describe(h)}, the program's is {_describe(w)}"
    return None


def _type(aval: Any) -> tuple:
    return tuple(aval.shape), str(aval.dtype)


def _describe(aval: Any) -> str:
    return f"{aval.dtype}[{','.join(map(str, aval.shape))}]"


def _in_tree(n: int) -> Any:
    return jax.tree_util.tree_structure((tuple(range(n)), {}))


def _out_tree(n: int) -> Any:
    return jax.tree_util.tree_structure(list(range(n)))
