"""The parameters behind a compiled module gradient, remembered for the optimizer's update.

After :func:`jaxaot.value_and_grad` of an ``AOTModule``, ``optimizer.update(model,
grads)`` would walk the module's graph again for the parameters the gradient's split
already found. :func:`remember` records them for that gradients object;
:func:`recall` hands them to :class:`~jaxaot._src.nn.optimizer.Optimizer` when given
the same gradients and module, the module's structure unchanged, and the filter
``nnx.Param``. A record lives as long as its gradients object.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_RECORDS: dict[int, tuple[weakref.ref, weakref.ref, Any]] = {}
_LOCK = threading.Lock()


def remember(grads: Any, model: Any, split: Any) -> None:
    """Record that ``grads`` are the gradients of the parameters of ``model``'s ``split``
    (a :class:`~jaxaot._src.nn.split_cache.ModuleSplit`, whose parameter structure is ``grads``')."""
    key = id(grads)

    def forget(_: Any, key: int = key) -> None:
        with _LOCK:
            _RECORDS.pop(key, None)

    try:
        grads_ref = weakref.ref(grads, forget)
    except TypeError:  # not weakly referenceable: nothing is remembered
        return
    with _LOCK:
        _RECORDS[key] = (grads_ref, weakref.ref(model), split)


def recall(grads: Any, model: Any) -> Any | None:
    """The split :func:`remember` recorded for exactly this ``grads`` object and ``model``, if it
    still describes the module, else None."""
    with _LOCK:
        record = _RECORDS.get(id(grads))
    if record is None:
        return None
    grads_ref, model_ref, split = record
    if grads_ref() is not grads or model_ref() is not model or not split.unchanged():
        return None
    return split


__all__ = ["recall", "remember"]
