"""One primitive applied eagerly, as a recorded step runs an operation JAX's way (part of :mod:`jaxaot._src.compat`).

Arguments committed to different devices meet in an operation: JAX's ``jit`` reports that as a ``ValueError`` naming
them, but a primitive bound directly raises JAX's internal mismatch error, no ``ValueError``. :func:`bind_on` raises
:class:`~jaxaot.errors.ShardingMismatchError` (a ``ValueError``) naming the devices instead.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src import stages as _stages

from jaxaot.errors import ShardingMismatchError

__all__ = ["bind_on"]

_NULL = contextlib.nullcontext()  # reusable: it holds no state


def bind_on(trace: Any, prim: Any, args: Sequence[Any], params: dict, staged: bool = False,
            info: Any = None) -> list:
    """Apply ``prim`` to ``args`` in ``trace`` (None: the current one); always a list of outputs.

    ``staged`` params are an equation's (from :func:`~jaxaot._src.compat.stage_call`), turned back
    into bind params (sub-functions rebuilt from their jaxprs).
    """
    if staged:
        params = prim.get_bind_params(params)
    ctx = _siu.user_context(info.traceback, name_stack=info.name_stack) if info is not None else _NULL
    try:
        with ctx:
            if trace is None:
                out = prim.bind(*args, **params)
            else:
                with _core.set_current_trace(trace):
                    out = prim.bind(*args, **params)
    except _stages.DeviceAssignmentMismatchError:
        raise ShardingMismatchError(_mixed_devices(prim, params, args)) from None
    return list(out) if prim.multiple_results else [out]


def _mixed_devices(prim: Any, params: dict, args: Sequence[Any]) -> str:
    name = params.get("name", prim.name)
    where = []
    for i, x in enumerate(args):
        sharding = getattr(x, "sharding", None) if getattr(x, "committed", False) else None
        if sharding is not None:
            where.append(f"argument {i} ({x.dtype}{list(x.shape)}) on {sorted(sharding.device_set, key=str)}")
    return (f"Received incompatible devices for the operation {name}: its arguments are committed to different "
            f"devices ({'; '.join(where)}). Put them on one device or mesh first (jax.device_put), as jax.jit asks.")
