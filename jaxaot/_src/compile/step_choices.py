"""The fused step's choices a process made, kept in the persistent cache beside its executables.

On an accelerator the first call of a fused step weighs its variants (each compiled)
and times it against the split programs (each run) before it runs. What it chose
depends on the program and the machine, both in the key, so a warm process with
``jaxaot.config.cache_dir`` reads the choice and loads the one executable kept,
instead of loading every variant and timing again; it also runs what the cold
process ran, not what a second timing might choose. A record is a small JSON
object, framed and signed as every entry (:mod:`~jaxaot._src.compile.store`);
one that does not parse is reported and made again.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot, tempfile
    >>> from jaxaot._src.compile import step_choices, xla
    >>> closed, avals = jax.make_jaxpr(lambda x: x * 2)(1.0), [jax.ShapeDtypeStruct((), jnp.float32)]
    >>> with jaxaot.config.override(cache_dir=tempfile.mkdtemp()):
    ...     step_choices.remember_choice(xla, closed, avals, "fused", {"runs": "fused"})
    ...     step_choices.recall_choice(xla, closed, avals, "fused")
    {'runs': 'fused'}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from jaxaot._src.compile import store
from jaxaot._src.compile.cache_keys import executable_key
from jaxaot._src.compile.compilers import Compiler

#: The largest record read (a choice is a few hundred bytes).
MAX_RECORD_BYTES = 1 << 16


def keeps_choices() -> bool:
    """Whether choices are kept: a persistent cache is set and trusted."""
    return store.cache_root() is not None


def _path(compiler: Compiler, closed: Any, avals: Sequence[Any], name: str) -> Path | None:
    """Where the choice for the fused step ``name`` of program ``closed`` lives; None without a cache."""
    if not keeps_choices():
        return None
    key = executable_key(compiler, closed, list(avals), {"fused_step_choice": name})
    return None if key is None else store.entry_path("choices", key)


def recall_choice(compiler: Compiler, closed: Any, avals: Sequence[Any], name: str) -> dict | None:
    """The record :func:`remember_choice` kept for this program and ``name``, or None (no cache, no record, or a
    record that does not parse, which is reported)."""
    path = _path(compiler, closed, avals, name)
    payload = None if path is None else store.read(path)
    if payload is None:
        return None
    try:
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError("too large")
        record = json.loads(bytes(payload).decode("utf-8"))
        if not isinstance(record, dict):
            raise ValueError("not an object")
    except ValueError as err:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        store.corrupt(path, f"the fused step's choice does not parse: {err}")
        return None
    return record


def remember_choice(compiler: Compiler, closed: Any, avals: Sequence[Any], name: str, record: dict) -> None:
    """Keep ``record`` (JSON values) as the choice for this program and ``name``, where a cache is set."""
    path = _path(compiler, closed, avals, name)
    if path is not None:
        store.write(path, json.dumps(record, sort_keys=True).encode("utf-8"))
