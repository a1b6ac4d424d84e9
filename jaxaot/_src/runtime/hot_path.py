"""A signature a training loop calls again and again, checked by the next call in one pass over its leaves.

The full lookup of a call (its signature's key, hashed; the programs found; the fused step's choice) costs
tens of microseconds of Python, beside ``jit``'s dispatch in C++. A :class:`HotPath` keeps the last concrete
call's signature and what it ran: a call with the same structure, abstract values and mesh runs that
directly (:func:`hot_leaves`). Anything else (a tracer, a NumPy leaf, another shape or dtype or weak type,
another JAX configuration) goes to the lookup. So does a call whose signature had arrays committed elsewhere than the
default device when its first such leaf is not committed: the executable would move uncommitted arrays there, where
``jit`` runs a call of uncommitted arrays on the default device (one committed array places it on its devices,
as the executable does). An array committed to other devices is refused by the executable itself (``ValueError``),
after which the caller looks it up.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxaot._src import compat as C
from jaxaot._src.runtime.shardings import context_mesh
from jaxaot._src.runtime.training import TrainingPrograms

_ArrayImpl = C.ArrayImpl


class HotPath(NamedTuple):
    """The last concrete call's signature and what it ran.

    Attributes:
      treedef: the call's ``(args, kwargs)`` structure.
      avals: each leaf's abstract value (every leaf a concrete array).
      mesh: the abstract mesh in context (:func:`~jaxaot._src.runtime.shardings.context_mesh`).
      config: JAX's configuration that tracing reads (``trace_context()``: x64, matmul precision, ...).
      training: the programs it runs.
      runs: what runs them (a gradient's fused executable), or None.
      committed: the first leaf committed elsewhere than the default device (its signature key holds a sharding),
        or None: a call's array there must be committed too, placing the call on its devices as ``jit`` would.
    """

    treedef: Any
    avals: tuple
    mesh: Any
    config: Any
    training: TrainingPrograms
    runs: Any = None
    committed: int | None = None


def hot_path(training: TrainingPrograms, leaves: list, runs: Any = None, static: bool = False) -> HotPath | None:
    """The :class:`HotPath` of a concrete call with ``leaves`` that ran ``training``; None where its signature
    cannot be checked in one pass (``static`` arguments, leaves that are not plain arrays or typed PRNG keys)."""
    if static or not all(type(x) is _ArrayImpl or _is_key_array(x) for x in leaves):
        return None
    sig = training.programs.signature
    committed = next((i for i, key in enumerate(sig.leaves) if type(key) is tuple), None)  # (aval, sharding)
    return HotPath(sig.treedef, tuple(x.aval for x in leaves), sig.mesh, sig.config, training, runs, committed)


def hot_leaves(hot: HotPath | None, args: tuple, kwargs: dict) -> list | None:
    """The call's flat leaves where it has ``hot``'s signature as far as one pass tells (structure, each leaf a
    concrete array of the same abstract value, the first leaf committed where ``hot``'s was committed elsewhere than
    the default device, the same mesh and JAX configuration in context, no trace staging operations), else None.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
        >>> tr = f.lookup((jnp.ones(3),), {}).programs.training()
        >>> hot = hot_path(tr, [jnp.ones(3)])
        >>> hot_leaves(hot, (jnp.zeros(3),), {}) is not None, hot_leaves(hot, (jnp.zeros(4),), {})
        (True, None)
    """
    if hot is None:
        return None
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    if treedef == hot.treedef and hot.mesh is context_mesh() and hot.config == C.trace_context() and all(
            (x.aval == a if type(x) is _ArrayImpl else _same_key_type(x, a)) for x, a in zip(leaves, hot.avals)) and (
            hot.committed is None or leaves[hot.committed].committed) and not C.stages_operations():
        return leaves  # (arrays bound where operations are staged, as under jit over closed-over ones, join it)
    return None


def _is_key_array(x: Any) -> bool:
    """A concrete typed PRNG key array (``jax.random.key``): a dropout key passed every step."""
    return isinstance(x, jax.Array) and not C.is_tracer(x) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _same_key_type(x: Any, aval: Any) -> bool:
    """Whether ``x`` is a key array of ``aval``'s shape and key type (its ``aval``, rebuilt at each read, costs
    several microseconds)."""
    return _is_key_array(x) and x.shape == aval.shape and x.dtype == aval.dtype
