"""``jaxaot.compare``: jaxaot's training steps next to JAX's on your own function, by compiled peak and step time.

Rows: jaxaot's min-cut at each budget, ``jax.jit(jax.value_and_grad(fn))`` (the
reference) and ``jax.checkpoint(fn, policy=P)`` per named JAX policy. Each :class:`Row`
holds the step's compiled peak per device, its seconds per call over interleaved
rounds, and its largest difference from the reference's value and gradient, so a
program computing something else shows. Nothing is printed: ``str()`` is a table.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> loss = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)
    >>> w, x = jnp.ones((8, 4)), jnp.ones((16, 8))
    >>> result = jaxaot.compare(loss, w, x, budgets=(1.0,), policies=("nothing_saveable",), rounds=1, calls=1)
    >>> [row.name for row in result.rows]
    ['jaxaot memory_budget=1.0', 'jax.jit(jax.value_and_grad)', 'jax.checkpoint(nothing_saveable)']
    >>> all(row.peak_bytes > 0 and row.max_abs_diff < 1e-5 for row in result.rows)
    True
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import jax.numpy as jnp

from jaxaot._src.autograd import as_index, value_and_grad
from jaxaot._src.partition import compiled_peak, min_cut_rematerialization_partition
from jaxaot._src.units import format_bytes
from jaxaot._src import progress as _progress
from jaxaot._src.runtime import aot_function
from jaxaot._src.tables import median_spread, table
from jaxaot.errors import InvalidInputError, InvalidValueError

#: The memory budgets of jaxaot's rows by default: save what JAX saves (1), half way, recompute all it can (0).
DEFAULT_BUDGETS = (1.0, 0.5, 0.0)
#: JAX's policies compared by default (names in ``jax.checkpoint_policies``).
DEFAULT_POLICIES = ("dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable")
#: The name of the reference row, ``jax.jit(jax.value_and_grad(fn))``.
REFERENCE = "jax.jit(jax.value_and_grad)"


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared program.

    Attributes:
      name: ``jaxaot memory_budget=0.5``, ``jax.jit(jax.value_and_grad)``, ``jax.checkpoint(dots_saveable)``.
      kind: ``"jaxaot"`` or ``"jax"``.
      peak_bytes: the step's compiled peak device memory per device (None where the backend reports none).
      times: seconds per call, one per round.
      max_abs_diff: the largest absolute difference of the value and gradient from the reference's.
    """

    name: str
    kind: str
    peak_bytes: int | None
    times: tuple[float, ...]
    max_abs_diff: float

    @property
    def step_seconds(self) -> float:
        """The median of :attr:`times`."""
        return statistics.median(self.times)

    @property
    def step_spread(self) -> tuple[float, float]:
        """The fastest and slowest round's seconds per call."""
        return min(self.times), max(self.times)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What :func:`compare` measured: its rows, and how (``rounds`` of ``calls`` calls on ``device``)."""

    rows: tuple[Row, ...]
    rounds: int
    calls: int
    device: str

    @property
    def reference(self) -> Row:
        """The ``jax.jit(jax.value_and_grad)`` row."""
        return self.row(REFERENCE)

    def row(self, name: str) -> Row:
        """The row called ``name`` (KeyError naming the rows there are, if none is)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; the rows: {[r.name for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data (what ``jaxaot inspect --compare --json`` prints)."""
        return {
            "device": self.device, "rounds": self.rounds, "calls": self.calls, "reference": REFERENCE,
            "rows": [{"name": r.name, "kind": r.kind, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds,
                      "step_min": r.step_spread[0], "step_max": r.step_spread[1], "times": list(r.times),
                      "max_abs_diff": r.max_abs_diff} for r in self.rows],
        }

    def __str__(self) -> str:
        ref = self.reference
        rows = [("program", "peak", "x peak", "step ms: median (min-max)", "x time: median (min-max)",
                 "max |diff|")]
        for r in self.rows:
            ratio = (f"{r.peak_bytes / ref.peak_bytes:.2f}" if r.peak_bytes and ref.peak_bytes else "-")
            rows.append((r.name, format_bytes(r.peak_bytes), ratio, median_spread([t * 1e3 for t in r.times], "{:.3f}"),
                         median_spread([a / b for a, b in zip(r.times, ref.times)], "{:.2f}x"),
                         f"{r.max_abs_diff:.1e}"))
        return "\n".join([
            table(rows), "",
            f"peak: the step's compiled peak device memory (memory_analysis); step: seconds per call over "
            f"{self.rounds} round{'s' * (self.rounds != 1)} of {self.calls} call{'s' * (self.calls != 1)}, "
            f"the programs taking turns, on {self.device}",
            f"x: ratio to {REFERENCE}'s (step times compared within each round); max |diff|: the largest "
            f"difference of the value and gradient from the reference's",
        ])


def compare(fn: Callable[..., Any], *args: Any, budgets: Sequence[float | int | str] = DEFAULT_BUDGETS,
            argnums: int | Sequence[int] = 0, policies: Sequence[str] | Mapping[str, Callable] = DEFAULT_POLICIES,
            rounds: int = 5, calls: int = 3) -> Comparison:
    """Measure jaxaot's training steps of ``fn`` next to JAX's, at ``args`` (module docstring).

    Args:
      fn: the loss: a function returning a real scalar.
      *args: its positional arguments, arrays (the steps run on them).
      budgets: jaxaot's ``memory_budget`` of each jaxaot row, read as everywhere
        (:func:`jaxaot.partition.parse_memory_budget`: a fraction in ``[0, 1]``, bytes, or a string with a unit).
      argnums: the arguments differentiated, as ``jax.value_and_grad``'s (a negative one counts from the end).
      policies: names in ``jax.checkpoint_policies``, or a mapping of row names to policies.
      rounds, calls: timing rounds, and calls of each program per round.

    Returns:
      a :class:`Comparison`: jaxaot's rows (in the order of ``budgets``), the reference, then the policies' rows.

    Raises:
      InvalidInputError: ``fn`` is not callable; ``budgets`` is not a list or tuple; ``argnums``,
        ``policies``, ``rounds`` or ``calls`` of the wrong kind (an integer is what ``operator.index`` reads, as in
        JAX: ``np.int64(1)`` is one, a bool is not); ``argnums`` naming an argument twice; an argument given as a
        ``jax.ShapeDtypeStruct`` (the steps need values to run on); ``jax.checkpoint`` refusing ``fn`` under one of
        ``policies`` (an ``io_callback`` in it).
      InvalidValueError: a budget that means neither a fraction nor bytes, no budgets, an unknown
        policy name, ``argnums`` beyond the arguments, ``rounds`` or ``calls`` below 1.
      MemoryBudgetError: no plan fits a byte budget.
    """
    partitioners = _check(fn, args, budgets, argnums, rounds, calls)
    rounds, calls = as_index(rounds), as_index(calls)  # np.int64(1) as 1, as are argnums
    argnums = as_index(argnums) if as_index(argnums) is not None else _integers(argnums)
    jax_policies = _policies(policies)
    steps: dict[str, tuple[str, Callable[[], Any], Callable[[], int | None]]] = {}
    for b, pf in zip(budgets, partitioners):
        vg = value_and_grad(aot_function(fn, partition_fn=pf), argnums=argnums)
        steps[_budget_row(b)] = (
            "jaxaot", lambda vg=vg: vg(*args), lambda vg=vg: vg.lower(*args).compile().peak_bytes)
    for name, policy in {REFERENCE: None, **jax_policies}.items():
        name = name if policy is None else f"jax.checkpoint({name})"
        loss = fn if policy is None else jax.checkpoint(fn, policy=policy)
        with _progress.task(f"compiling {name}"):
            try:
                exe = jax.jit(jax.value_and_grad(loss, argnums=argnums)).lower(*args).compile()
            except NotImplementedError as err:  # JAX's checkpoint refuses effects (an io_callback, say)
                if policy is None:
                    raise
                raise InvalidInputError(f"{name} cannot wrap this function ({err}): compare jaxaot's rows and "
                                        "jit's alone with policies=().") from err
        steps[name] = ("jax", lambda exe=exe: exe(*args), lambda exe=exe: compiled_peak(exe))
    diffs, peaks = {}, {}
    with _progress.task(f"running each step once ({len(steps)} programs)"):
        ref = jax.block_until_ready(steps[REFERENCE][1]())
        for name, (_, run, peak) in steps.items():  # one step's results at a time besides the reference's
            diffs[name] = max_abs_diff(jax.block_until_ready(run()), ref)
            # jaxaot's first call compiles its step and decides how it runs: its peak is read after, of that step.
            peaks[name] = peak()
        del ref
    with _progress.task(f"timing ({rounds} rounds of {calls} calls)"):
        times = time_rounds({name: run for name, (_, run, _) in steps.items()}, rounds=rounds, calls=calls)
    rows = tuple(Row(name, kind, peaks[name], tuple(times[name]), diffs[name]) for name, (kind, _, _) in steps.items())
    dev = jax.devices()[0]
    return Comparison(rows, rounds, calls, f"{dev.platform} ({getattr(dev, 'device_kind', dev.platform)})")


def time_rounds(programs: Mapping[str, Callable[[], Any]], *, rounds: int = 7, calls: int = 5
                ) -> dict[str, list[float]]:
    """Seconds per call of each program, one number per round.

    After two warm-up calls each, the programs take turns: in every round each
    runs ``calls`` times back to back (blocking on each result), so a slow
    moment of the machine hits all of them alike.

    Example:
        >>> s = time_rounds({"add": lambda: jnp.ones(3) + 1}, rounds=3, calls=2)
        >>> len(s["add"]), all(t > 0 for t in s["add"])
        (3, True)
    """
    for run in programs.values():
        for _ in range(2):
            jax.block_until_ready(run())
    out: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, run in programs.items():
            t = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(run())
            out[name].append((time.perf_counter() - t) / calls)
    return out


def max_abs_diff(got: Any, want: Any) -> float:
    """The largest absolute difference between the leaves of two pytrees (inf if their leaf counts differ). Equal
    values differ by 0 (an infinity included); a NaN on either side makes the result NaN, wherever it is.

    Example:
        >>> max_abs_diff((jnp.float32(1.0), [jnp.ones(2)]), (jnp.float32(1.5), [jnp.zeros(2)]))
        1.0
        >>> max_abs_diff((1.0, [jnp.array([jnp.nan])]), (1.0, [jnp.ones(1)]))
        nan
    """
    a, b = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    if len(a) != len(b):
        return float("inf")
    diffs = [np.max(np.where(x == y, 0.0, np.abs(x - y))) for x, y in map(_wide, a, b) if y.size]
    return float(np.max(diffs)) if diffs else 0.0


def _wide(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both leaves as float64 (complex128 where either is complex), to compare without overflow or rounding."""
    x, y = np.asarray(x), np.asarray(y)
    dtype = np.complex128 if np.iscomplexobj(x) or np.iscomplexobj(y) else np.float64
    return x.astype(dtype), y.astype(dtype)


def _check(fn: Any, args: tuple, budgets: Any, argnums: Any, rounds: Any, calls: Any) -> list[Any]:
    """Check :func:`compare`'s options before anything is traced; return the configured partitioner per budget."""
    if not callable(fn):
        raise InvalidInputError(f"compare expects a callable fn, got {type(fn).__name__} {fn!r}.")
    if not isinstance(budgets, (list, tuple)):
        raise InvalidInputError(f"budgets of compare must be a list or tuple of memory budgets, got "
                                f"{type(budgets).__name__} {budgets!r} (one budget: budgets=({budgets!r},)).")
    if not budgets:
        raise InvalidValueError("budgets of compare is empty: give at least one memory budget, e.g. (1.0, 0.0).")
    names = [_budget_row(b) for b in budgets]
    if len(set(names)) < len(names):
        raise InvalidValueError(f"budgets of compare repeats a budget: {list(budgets)!r}; give each once.")
    nums = _integers(argnums)
    if not nums or any(n is None for n in nums):
        raise InvalidInputError(f"argnums of compare must be an integer or a non-empty sequence of integers, got "
                                f"{argnums!r}.")
    if any(not -len(args) <= n < len(args) for n in nums):  # a negative one counts from the end, as in JAX
        raise InvalidValueError(f"argnums={argnums!r} of compare, but fn is given {len(args)} positional "
                                f"argument{'s' * (len(args) != 1)}: pass argnums from {-len(args)} to "
                                f"{len(args) - 1} (a negative one counts from the end, as in jax.value_and_grad).")
    if len({n % len(args) for n in nums}) != len(nums):  # (0, -2) of two arguments, as (0, 0)
        raise InvalidInputError(f"argnums={argnums!r} of compare names an argument more than once; name each once.")
    for name, value in (("rounds", rounds), ("calls", calls)):
        if as_index(value) is None:
            raise InvalidInputError(f"{name} of compare must be an integer, got {type(value).__name__} {value!r}.")
        if value < 1:
            raise InvalidValueError(f"{name} of compare must be at least 1, got {value}.")
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise InvalidInputError(
                f"compare runs the steps, so it needs values: argument leaf args{jax.tree_util.keystr(path)} is a "
                f"jax.ShapeDtypeStruct {leaf.dtype}{list(leaf.shape)}; pass an array (e.g. jnp.ones(shape, dtype)).")
    return [min_cut_rematerialization_partition(memory_budget=b) for b in budgets]


def _integers(argnums: Any) -> tuple[int | None, ...]:
    """``argnums`` (an integer or a list or tuple of them) as a tuple, each read by ``as_index``; () otherwise."""
    if as_index(argnums) is not None:
        return (as_index(argnums),)
    return tuple(map(as_index, argnums)) if isinstance(argnums, (list, tuple)) else ()


def _budget_row(budget: Any) -> str:
    """The name of jaxaot's row at ``budget``: ``jaxaot memory_budget=0.5``, ``jaxaot memory_budget=64KiB``."""
    return f"jaxaot memory_budget={budget if isinstance(budget, str) else repr(budget)}"


def _policies(policies: Any) -> dict[str, Callable]:
    """``name -> policy`` of ``policies``: names in ``jax.checkpoint_policies``, or such a mapping itself."""
    if isinstance(policies, Mapping):
        bad = [k for k, v in policies.items() if not isinstance(k, str) or not callable(v)]
        if bad:
            raise InvalidInputError(f"policies of compare maps names to checkpoint policies (callables); "
                                    f"not so for {bad!r}.")
        taken = [k for k in policies if k == REFERENCE or k.startswith("jaxaot memory_budget=")]
        if taken:
            raise InvalidValueError(f"policies of compare names rows {taken!r}, the names of the reference and "
                                    f"jaxaot's rows: give those policies other names.")
        return dict(policies)
    if isinstance(policies, str) or not isinstance(policies, (list, tuple)):
        raise InvalidInputError(f"policies of compare must be a list or tuple of names in jax.checkpoint_policies, "
                                f"or a mapping of names to policies, got {type(policies).__name__} {policies!r}.")
    known = sorted(n for n in dir(jax.checkpoint_policies) if n.endswith("_saveable"))
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise InvalidValueError(f"unknown checkpoint policies {unknown!r} in policies of compare: the policies "
                                f"taking no options are {', '.join(known)}.")
    return {p: getattr(jax.checkpoint_policies, p) for p in policies}
