"""The parameters behind a compiled module gradient, remembered for the optimizer's update.

An eager training step calls :func:`jaxaot.value_and_grad` on an
:class:`~jaxaot._src.nn.nnx.AOTModule` and then ``optimizer.update(model, grads)``.
Both need the module's parameter Variables: the gradient finds them in the
module's kept split (:mod:`jaxaot._src.nn.split_cache`), and ``nnx.Optimizer.update``
walks the module's graph again (``nnx.state(model, wrt)``), which on a GPU is a few hundred
microseconds of a step of a couple of milliseconds.

:func:`remember` records, for the gradients object a compiled gradient returned,
the module it differentiated and the live parameter Variables that its split
found (its :class:`~jaxaot._src.nn.split_cache.ModuleSplit`: the Variables in the
gradients' leaf order, with their tree structure); :func:`recall` hands them
back to :class:`~jaxaot._src.nn.optimizer.Optimizer` when it is given *that same
gradients object* and *that same module*, and the module's structure is still
the one split (a submodule re-assigned in between, and the optimizer walks the
module as ``nnx.Optimizer`` does). Each record lives as long as its gradients
object (a weak reference to it keys the record). The optimizer uses the record
only when it filters on ``nnx.Param``, the filter the gradient's split uses.
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
