"""The parameters behind a compiled module gradient, remembered for the optimizer's update.

An eager training step calls :func:`jaxaot.value_and_grad` on an
:class:`~jaxaot.nn.nnx.AOTModule` and then ``optimizer.update(model, grads)``.
Both need the module's parameter Variables: the gradient finds them with one
``nnx.split`` of the module, and ``nnx.Optimizer.update`` walks the module's
graph again (``nnx.state(model, wrt)``), which on a GPU is a few hundred
microseconds of a step of a couple of milliseconds.

:func:`remember` records, for the gradients object a compiled gradient returned,
the module it differentiated and the State of live parameter Variables that its
split found; :func:`recall` hands them back to
:class:`~jaxaot.nn.optimizer.Optimizer` when it is given *that same gradients
object* and *that same module*. Each record lives as long as its gradients
object (a weak reference to it keys the record).

What it cannot see: a module whose parameters were re-assigned between the
gradient and the update (``model.layer = nnx.Linear(...)`` in between). The
update then writes into the Variables the gradient was taken of, which the
module no longer holds (``nnx.Optimizer`` would update the new ones). The
optimizer uses the record only when it filters on ``nnx.Param``, the filter the
gradient's split uses.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_RECORDS: dict[int, tuple[weakref.ref, weakref.ref, Any]] = {}
_LOCK = threading.Lock()


def remember(grads: Any, model: Any, params: Any) -> None:
    """Record that ``grads`` are the gradients of ``model``'s parameters ``params`` (a State of
    live Variables, structured as ``grads``)."""
    key = id(grads)

    def forget(_: Any, key: int = key) -> None:
        with _LOCK:
            _RECORDS.pop(key, None)

    try:
        grads_ref = weakref.ref(grads, forget)
    except TypeError:  # not weakly referenceable: nothing is remembered
        return
    with _LOCK:
        _RECORDS[key] = (grads_ref, weakref.ref(model), params)


def recall(grads: Any, model: Any) -> Any | None:
    """The parameters :func:`remember` recorded for exactly this ``grads`` object and ``model``, or None."""
    with _LOCK:
        record = _RECORDS.get(id(grads))
    if record is None:
        return None
    grads_ref, model_ref, params = record
    if grads_ref() is not grads or model_ref() is not model:
        return None
    return params


__all__ = ["recall", "remember"]
