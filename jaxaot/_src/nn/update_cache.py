"""What :class:`jaxaot._src.nn.Optimizer`'s compiled update compiled: its ``cache_info()``.

Whether an update compiled is read off JAX itself: :class:`UpdateCache` listens to
``jax.monitoring``'s trace, lowering and compile events of that program while the
update runs. A miss's entry names the inputs as the optimizer does
(``params['kernel']: f32[3,2]``), each stage's seconds and why it compiled, in the
runtime's words, and is logged at INFO. Programs are shared between optimizers with
the same transformation object and input shapes.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.runtime import CacheEntryInfo, CacheInfo, inputs_change, log_compile

#: The ``__name__`` of the optimizer's jitted update (what the compile events name).
UPDATE_NAME = "jaxaot_optimizer_update"

_FUN_NAMES = frozenset({UPDATE_NAME, f"jit({UPDATE_NAME})"})
_STAGE_OF = {event: stage for stage, event in C.JIT_COMPILE_EVENTS.items()}
_LOCAL = threading.local()
_LISTENING: list[bool] = []
_LISTEN_LOCK = threading.Lock()

FIRST_CALL = "first call"


def _listen(event: str, duration: float, **kwargs: Any) -> None:
    """A ``jax.monitoring`` duration listener: keeps the update program's compile stages on this thread."""
    events = getattr(_LOCAL, "events", None)
    if events is not None and event in _STAGE_OF and kwargs.get("fun_name") in _FUN_NAMES:
        events.append((_STAGE_OF[event], duration))


def _start_listening() -> None:
    if not _LISTENING:
        with _LISTEN_LOCK:
            if not _LISTENING:
                import jax.monitoring

                jax.monitoring.register_event_duration_secs_listener(_listen)
                _LISTENING.append(True)


class UpdateCache:
    """One optimizer's record of its compiled updates: hits, and an entry per compile.

    :meth:`run` calls the update, keeping the compile events it raises;
    :meth:`count` then counts it, a hit or (given events) a miss.
    """

    def __init__(self) -> None:
        _start_listening()
        self.hits = 0
        self.entries: list[CacheEntryInfo] = []
        self.compiled: list[tuple[Any, list[tuple[str, Any]]]] = []  #: ``(tx, named inputs)`` per compile
        self.tx: Any = None  #: the optimizer's transformation, and its compiled update (``optimizer._Program``)
        self.program: Any = None
        self.lock = threading.Lock()

    @staticmethod
    def run(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple[str, float]]]:
        """``fn(*args)`` and the ``(stage, seconds)`` of the update program's compile it made (none on a hit)."""
        outer = getattr(_LOCAL, "events", None)
        events: list[tuple[str, float]] = []
        _LOCAL.events = events
        try:
            return fn(*args), events
        finally:
            _LOCAL.events = outer

    def count(self, events: Sequence[tuple[str, float]], tx: Any, named: Callable[[], list[tuple[str, Any]]]
              ) -> None:
        """Count one update: a hit without ``events``, else an entry for the inputs ``named()`` gives."""
        if not events:
            self.hits += 1
            return
        inputs = named()
        with self.lock:
            reason = self._reason(tx, inputs)
            signature = ", ".join(f"{path}: {format_aval(aval, weak=True)}" for path, aval in inputs)
            times = {"trace": sum(t for stage, t in events if stage == "trace"),
                     "compile_update": sum(t for stage, t in events if stage != "trace")}
            self.entries.append(CacheEntryInfo(signature, reason, ("update",), compiles=("update",), times=times))
            self.compiled.append((tx, inputs))
        log_compile("jaxaot._src.nn.Optimizer.update", signature, reason)

    def _reason(self, tx: Any, inputs: list[tuple[str, Any]]) -> str:
        """Why ``inputs`` compiled, against the nearest compiled signature (the latest on ties)."""
        if not self.compiled:
            return FIRST_CALL
        old_tx, old = min(reversed(self.compiled), key=lambda c: (c[0] is not tx) + _distance(c[1], inputs))
        parts = [] if old_tx is tx else ["tx is another optax transformation"]
        change = inputs_change(old, inputs)
        if change:
            parts.append(change)
        return "; ".join(parts) or ("the same shapes and dtypes as an earlier update: the inputs live elsewhere "
                                    "(another sharding), or jax.jit's cache no longer held the executable")

    def cache_info(self) -> CacheInfo:
        with self.lock:
            entries = tuple(self.entries)
        return CacheInfo(self.hits, len(entries), entries)


def _distance(old: list[tuple[str, Any]], new: list[tuple[str, Any]]) -> int:
    """Inputs that differ between two signatures: changed, added or gone."""
    a, b = dict(old), dict(new)
    return sum(_key(a.get(p)) != _key(b.get(p)) for p in a.keys() | b.keys())


def _key(aval: Any) -> Any:
    return None if aval is None else (tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False)))


__all__ = ["FIRST_CALL", "UPDATE_NAME", "UpdateCache"]
