"""Measured per-op costs: each distinct expensive eqn timed once per device kind, and cached.

:class:`MeasuredCosts` is the :class:`~jaxaot._src.partition.costs.op_costs.OpCosts` the
min-cut uses on accelerators (:func:`resolve_costs`): fusible eqns get a FLOP
estimate, others are timed on the device once
(:func:`~jaxaot._src.partition.costs.op_profile.profile_seconds`), less an empty kernel's
time, since a recomputed small op runs inside a kernel that runs anyway. The table
is shared per device kind and, with ``jaxaot.config.cache_dir``, kept on disk as
numbers only, read as safely as the compile cache's entries.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition import MeasuredCosts
    >>> costs = MeasuredCosts(jax.devices()[0], path=None)
    >>> dot = jax.make_jaxpr(jnp.dot)(jnp.ones((128, 128)), jnp.ones((128, 128))).jaxpr.eqns[0]
    >>> costs.seconds(dot) > 0, costs.measured
    (True, 1)
    >>> costs.seconds(dot) == costs.seconds(dot), costs.measured  # timed once
    (True, 1)
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jaxlib

from jaxaot._src import progress as _progress
from jaxaot._src import workers
from jaxaot._src.config import config
from jaxaot._src.files import (
    UnsafeFolderError, atomic_write, check_folders, folder_advice, parse_json, read_regular, untrusted,
)
from jaxaot.errors import PartitionError
from jaxaot._src.partition.costs import cost_model, op_profile
from jaxaot._src.partition.costs.autotune_bytes import compiles_untuned
from jaxaot._src.partition.costs.device_model import DeviceModel
from jaxaot._src.partition.costs.op_costs import CheckedCosts, FlopCosts, OpCosts

#: Bumped when what a stored time means changes.
TABLE_VERSION = 1
#: The largest op-cost table read, in bytes (a table holds one number per distinct op).
MAX_TABLE_BYTES = 64 << 20
#: How deep a table's JSON may nest (it is ``{"environment": {...}, "seconds": {...}}``).
MAX_TABLE_DEPTH = 4


class MeasuredCosts:
    """Costs timed on ``device``, once per distinct eqn (see the module docstring).

    Args:
      device: the device to time on (default ``jax.devices()[0]``).
      fallback: the :class:`OpCosts` for fusible eqns and eqns that cannot be
        timed (default: FLOP estimates at ``device``'s measured rates,
        :meth:`DeviceModel.compute_costs`: no host-memory probes).
      path: the JSON file to persist the table in; ``"auto"`` (default) picks
        one under ``jaxaot.config.cache_dir`` when that is set, None keeps it in memory.
    """

    def __init__(self, device: Any = None, *, fallback: OpCosts | None = None, path: str | os.PathLike | None = "auto"):
        self.device = jax.devices()[0] if device is None else device
        self._fallback = fallback
        self._table: dict[str, float] = {}
        self._lock = threading.Lock()
        self.measured = 0  #: eqns timed by this object
        self.estimated: set[str] = set()  #: signatures that could not be timed (fallback used)
        auto = path == "auto"
        self._attach(_default_path(self.device, config.cache_dir) if auto else None if path is None else Path(path),
                     auto)

    def _attach(self, path: Path | None, auto: bool) -> None:
        """Keep the table in the file ``path`` (None: in memory), reading what it holds; ``auto``: a file of
        :func:`_default_path`, under the cache folder's checked chain."""
        self._path, self._folders = path, _folders(path, auto)
        if path is not None:
            self._table, self._path = _read(path, self._folders)

    @property
    def fallback(self) -> OpCosts:
        if self._fallback is None:
            self._fallback = DeviceModel.compute_costs(self.device)
        return self._fallback

    @property
    def note(self) -> str:
        kind = getattr(self.device, "device_kind", self.device.platform)
        text = f"recompute costs: measured on {kind} ({len(self._table) - (_LAUNCH in self._table)} distinct ops timed"
        if self.estimated:
            text += f"; {len(self.estimated)} not timeable, FLOP-estimated"
        return text + (f", table {self._path})" if self._path is not None else ")")

    def seconds(self, eqn: Any) -> float:
        if cost_model.classify(eqn) is cost_model.Recompute.CHEAP:
            return self.fallback.seconds(eqn)
        raw = self._raw(op_profile.signature(eqn), lambda: op_profile.profile_seconds(eqn, self.device))
        if raw is None:
            return self.fallback.seconds(eqn)
        return max(raw - self.empty_kernel_seconds, raw / 100)

    def start_rates(self) -> concurrent.futures.Future | None:
        """Begin measuring the device's rates (the default :attr:`fallback`) on a worker thread, and return its
        future (None where a fallback is set): a planner about to price eqns calls it before its cuts, so the
        rate probes run beside them rather than before its first timing, and waits for it before it returns
        (:meth:`DeviceModel.compute_costs` measures once per process; a second caller waits for the first)."""
        return None if self._fallback is not None else workers.submit(DeviceModel.compute_costs, self.device)

    @property
    def empty_kernel_seconds(self) -> float:
        """What an empty kernel measures on this device (subtracted from every op's time)."""
        return self._raw(_LAUNCH, lambda: op_profile.launch_seconds(self.device), counts=False) or 0.0

    def prefetch(self, eqns: Any) -> None:
        """Time every eqn of ``eqns`` that :meth:`seconds` would time and has not, together: their programs
        compiled concurrently, then timed one by one. A planner calls it with the eqns it is about to
        price, so their compiles overlap."""
        with self._lock:
            todo: dict[str, Any] = {}
            for eqn in eqns:
                if cost_model.classify(eqn) is cost_model.Recompute.CHEAP or not op_profile.measurable(eqn):
                    continue
                key = op_profile.signature(eqn)
                if key not in self._table and key not in self.estimated:
                    todo.setdefault(key, eqn)
            if not todo:
                return
            if _LAUNCH not in self._table:
                todo[_LAUNCH] = op_profile.launch_eqn()
            _progress.step("timing ops", self.measured + 1, detail=f"{len(todo)} ops, compiled together")
            times = op_profile.profile_many(list(todo.values()), self.device)
            for key, t in zip(todo, times):
                self._store(key, t, counts=key != _LAUNCH, write=False)
            self._write()  # the table once for the batch

    def _raw(self, key: str, measure: Callable[[], float | None], counts: bool = True) -> float | None:
        """The table's time for ``key``, ``measure()``-d now if absent (None: cannot be timed)."""
        with self._lock:
            if key in self._table:
                return self._table[key]
            if key in self.estimated:
                return None
            _progress.step("timing ops", self.measured + 1, detail=key.split("{")[0][:80])
            return self._store(key, measure(), counts)

    def _store(self, key: str, t: float | None, counts: bool = True, write: bool = True) -> float | None:
        """Keep ``t`` for ``key`` (None: cannot be timed), and with ``write`` the table on disk where it has a file."""
        if t is None:
            self.estimated.add(key)
            return None
        self.measured += counts
        self._table[key] = t
        if write and op_profile.is_portable(key):
            self._write()
        return t

    def _write(self) -> None:
        if self._path is not None:
            portable = {k: v for k, v in self._table.items() if op_profile.is_portable(k)}
            if not _write(self._path, self._folders,
                          {"environment": _environment(self.device), "seconds": portable}):
                self._path = None  # warned once; the table stays in memory

    @classmethod
    def for_device(cls, device: Any = None) -> "MeasuredCosts":
        """The shared table of ``device``'s kind (default ``jax.devices()[0]``), one per process."""
        device = jax.devices()[0] if device is None else device
        base = config.cache_dir  # read once: the table's key and its file agree if another thread changes it
        key = (device.platform, getattr(device, "device_kind", "?"), str(base))
        with _SHARED_LOCK:
            if key not in _SHARED:
                table = _SHARED[key] = cls(device, path=None)
                table._attach(_default_path(device, base), auto=True)
            return _SHARED[key]


_SHARED: dict[tuple, MeasuredCosts] = {}
_LAUNCH = "<empty kernel>"
_SHARED_LOCK = threading.Lock()

#: What ``op_costs="auto"`` measures on: platforms where FLOP counts mislead most, and timing is cheap.
MEASURED_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})


def resolve_costs(op_costs: Any, model: DeviceModel | None = None, *, model_given: bool = False) -> OpCosts:
    """The :class:`OpCosts` a partitioner plans with.

    ``op_costs`` is ``"auto"`` (measured on GPUs and TPUs, FLOP estimates
    elsewhere), ``"measured"``, ``"flops"``, or an :class:`OpCosts`. FLOP
    estimates use ``model``'s rates when there is a model (the offload timeline
    needs seconds), else nominal ones (only ratios matter to the knapsack).
    ``model_given``: the caller chose ``model`` (a synthetic device, say), so
    ``"auto"`` prices eqns at its rates rather than timing the real device.
    """
    if isinstance(op_costs, (FlopCosts, MeasuredCosts)):
        return op_costs
    if isinstance(op_costs, OpCosts):
        return CheckedCosts(op_costs)
    if op_costs == "auto":
        measure = not model_given and jax.devices()[0].platform in MEASURED_PLATFORMS
        op_costs = "measured" if measure else "flops"
    if op_costs == "flops":
        return model.flop_costs if model is not None else FlopCosts()
    if op_costs == "measured":
        return MeasuredCosts.for_device()
    raise PartitionError(f"op_costs must be 'auto', 'measured', 'flops' or an OpCosts (an object with "
                         f"seconds(eqn) and note), got {op_costs!r}.")


# --------------------------------------------------------------------------- the file
def _environment(device: Any) -> dict:
    return {"table": TABLE_VERSION, "platform": device.platform,
            "compile": "untuned" if compiles_untuned(device.platform) else "default",  # how its programs compile
            "device_kind": getattr(device, "device_kind", "?"), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "x64": bool(jax.config.jax_enable_x64),
            "matmul_precision": str(jax.config.jax_default_matmul_precision)}


def _default_path(device: Any, base: Any) -> Path | None:
    """The table's file under the cache folder ``base`` (``jaxaot.config.cache_dir`` as read once), or None."""
    if not base:
        return None
    env = json.dumps(_environment(device), sort_keys=True)
    digest = hashlib.sha256(env.encode()).hexdigest()[:16]
    return Path(base) / "jaxaot-v2" / "op-costs" / f"{digest}.json"


def _folders(path: Path | None, auto: bool) -> tuple[Path, tuple[str, ...]] | None:
    """The folder chain holding the table, as :func:`~jaxaot._src.files.check_folders` takes it."""
    if path is None:
        return None
    if auto:
        return path.parents[2], path.parts[-3:-1]  # <cache_dir>, ("jaxaot-v2", "op-costs"): _default_path's
    return path.parent, ()


def _read(path: Path, folders: tuple[Path, tuple[str, ...]]) -> tuple[dict[str, float], Path | None]:
    """The table at ``path`` and the path to keep writing it to (None: a folder others can write)."""
    try:
        check_folders(folders[0], *folders[1], create=False)
        record = parse_json(read_regular(path, MAX_TABLE_BYTES, check=untrusted), MAX_TABLE_DEPTH)
        table = record["seconds"]
        return {str(k): float(v) for k, v in table.items() if isinstance(v, (int, float)) and v > 0}, path
    except (FileNotFoundError, NotADirectoryError):
        return {}, path
    except UnsafeFolderError as err:
        warnings.warn(f"jaxaot: not using the op-cost table {path}: its folder {err}, so others could plant or "
                      f"replace it. Ops are timed again, and the table kept in memory; {folder_advice(err.path)}",
                      RuntimeWarning, stacklevel=3)
        return {}, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
        warnings.warn(f"jaxaot: ignoring the op-cost table {path} ({type(err).__name__}: {err}); "
                      f"ops are timed again and the file rewritten.", RuntimeWarning, stacklevel=3)
        return {}, path


def _write(path: Path, folders: tuple[Path, tuple[str, ...]], record: dict) -> bool:
    """Atomically (:func:`jaxaot._src.files.atomic_write`) into checked folders; an I/O error or a folder others can
    write warns and returns False: the table is a cache."""
    try:
        check_folders(folders[0], *folders[1], create=True)
        atomic_write(path, json.dumps(record, sort_keys=True, indent=0).encode())
        return True
    except OSError as err:
        warnings.warn(f"jaxaot: cannot write the op-cost table {path} ({err}); keeping it in memory.",
                      RuntimeWarning, stacklevel=2)
        return False
