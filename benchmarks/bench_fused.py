"""Fused training step: ``jaxaot.value_and_grad`` (one executable keeping the plan) against JAX's fused steps.

For every model of ``benchmarks/models.py`` it prints, from one run:

* the step time of ``jaxaot.value_and_grad(aot_function(loss, partition_fn=p))``
  (fused, the default) for the default partition and the min-cut at budgets
  1 and 0.95 (with the layouts and backward order the step chose; at budget 1 also
  in XLA's order where it chose consume-first, and taking every residual where it derived some
  again), of the split ``fused=False`` path at budget 1, and of
  ``jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=dots_saveable)))``
  and, where the model has layers (``Model.per_layer``), the same policy on each layer
  (``jax.checkpoint(layer, policy=dots_saveable)`` inside the scan or on the block), as users place it,
  each as a ratio to ``jax.jit(jax.value_and_grad(loss))``: the median of the
  rounds' ratios (programs take turns round by round, each round the median of
  ``--iters`` steps, inputs rotating over three sets) with the min-max;
* the compiled peak memory of each fused program, as a ratio to the
  ``dots_saveable`` program's;
* a gradient check of every program against ``jax.value_and_grad``;
* ``jit(value_and_grad)`` compiled a second time: how far two compiles of one
  program differ in this run (the noise floor of the ratios).

The ``runs`` column says which step ``jaxaot.value_and_grad`` chose (``FusedChoice.runs``: timed
against the split on accelerators) and the goal line compares that step at budget 1 with the split:
single blocked calls of the two taking turns call by call (``--pairs`` of each, each step first in every
other pair), the ratio of their medians with the min-max over five blocks of the pairs.

The targets: a fused step within 1.02x ``jit(value_and_grad)``'s time at no more than
``dots_saveable``'s peak memory, and what ``value_and_grad`` runs within 1.02x the split step,
on every model (``docs/benchmarks.md``, "Fused step").

Usage (from the repository root): ``python -m benchmarks.bench_fused [--small] [--only NAME] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxaot
from benchmarks.harness import fmt_bytes, peak_bytes, report, table
from benchmarks.models import zoo
from jaxaot._src.fusion import fused_program


def _budget(b: float) -> Callable:
    return functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=b)


PARTITIONS = {"default": jaxaot.partition.default_partition, "min-cut 1": _budget(1.0), "min-cut 0.95": _budget(0.95)}


def jax_references(model: Any, args: tuple) -> dict[str, tuple[Callable, Any]]:
    """JAX's fused steps: ``jit(value_and_grad)`` and with ``checkpoint(dots_saveable)`` on the whole loss and
    (where the model has layers) on each layer, each with its executable."""
    loss, nums = model.loss, model.argnums
    jit = jax.jit(jax.value_and_grad(loss, argnums=nums))
    ckpt = jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=jax.checkpoint_policies.dots_saveable),
                                      argnums=nums))
    return {"jit(value_and_grad)": (jit, jit.lower(*args).compile()),
            "jit(dots_saveable)": (ckpt, ckpt.lower(*args).compile()),
            **_per_layer_dots(model, args)}


def _per_layer_dots(model: Any, args: tuple) -> dict[str, tuple[Callable, Any]]:
    if getattr(model, "per_layer", None) is None:
        return {}
    wrap = functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_saveable)
    step = jax.jit(jax.value_and_grad(model.per_layer(wrap), argnums=model.argnums))
    return {"jit(dots_saveable per layer)": (step, step.lower(*args).compile())}


def programs(model: Any, args: tuple, choices: dict[str, Any] | None = None) -> dict[str, tuple[Callable, Any]]:
    """name -> (step(args), compiled executable for memory analysis or None); ``choices`` (when given)
    gets, for each ``jaxaot.value_and_grad`` row, its fused step's ``FusedChoice`` (the variant kept, and
    whether it or the split pair runs)."""
    loss, nums = model.loss, model.argnums
    out = jax_references(model, args)
    again = jax.jit(jax.value_and_grad(lambda *a: loss(*a), argnums=nums))  # a second compile: the noise floor
    out["jit(value_and_grad), compiled again"] = (again, again.lower(*args).compile())
    kept: dict[str, Any] = {}
    for name, pf in PARTITIONS.items():
        f = jaxaot.aot_function(loss, partition_fn=pf)
        vg = jaxaot.value_and_grad(f, argnums=nums)
        vg(*args)
        tr = f.lookup(args, {}).programs
        fused = [e for n, e in tr.executables.items() if n.startswith("fused")]
        out[f"jaxaot fused {name}"] = (vg, fused[0] if fused else None)
        kept[f"jaxaot fused {name}"] = next(iter(tr.fused_choices.values()))
    if choices is not None:
        choices.update(kept)
    f = jaxaot.aot_function(loss, partition_fn=_budget(1.0))
    chosen = kept["jaxaot fused min-cut 1"]
    if chosen.order != "xla":  # the same step in XLA's order, for comparison
        out["jaxaot fused min-cut 1, XLA's order"] = fused_variant(f, nums, args, "all", chosen.layouts, "xla")
    if chosen.rederived:  # the same step taking every residual, in both orders
        for order in ("xla", "consume_first"):
            out[f"jaxaot fused min-cut 1, nothing derived again, {order}"] = fused_variant(
                f, nums, args, chosen.barrier, chosen.layouts, order)
    out["jaxaot split min-cut 1"] = (jaxaot.value_and_grad(f, argnums=nums, fused=False), None)
    return out


def fused_variant(f: Any, nums: Any, args: tuple, barrier: str, layouts: str = "auto",
                  order: str = "xla", rederive: bool = False) -> tuple[Callable, Any]:
    """``(step, executable)`` of one variant of ``f``'s fused step: the residuals ``barrier`` names behind
    the optimization barrier, with ``layouts``, ``order`` and ``rederive`` (:func:`jaxaot._src.fusion.fused_program`),
    whatever the step would choose."""
    nums = (nums,) if isinstance(nums, int) else tuple(nums)
    programs, leaves, _ = f.lookup(args, {})
    mask = [i in nums for i, a in enumerate(args) for _ in jax.tree.leaves(a)]
    closed = fused_program(programs.training(tuple(mask)), barrier=barrier, layouts=layouts, order=order,
                           rederive=rederive)
    exe = jax.jit(lambda *xs: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *xs)).lower(*leaves).compile()
    return (lambda *a: exe(*jax.tree.leaves(a))), exe


def check(progs: dict, model: Any, args: tuple) -> float:
    want = jax.value_and_grad(model.loss, argnums=model.argnums)(*args)
    worst = 0.0
    for name, (step, _) in progs.items():
        got = step(*args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-6))
            worst = max(worst, err)
            if err > 5e-2:
                raise AssertionError(f"{model.name}/{name}: relative gradient error {err:.3g}")
    return worst


def time_rounds(progs: dict, sets: list, rounds: int, iters: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {n: [] for n in progs}
    for step, _ in progs.values():
        for s in sets:
            jax.block_until_ready(step(*s))
    for _ in range(rounds):
        for name, (step, _) in progs.items():
            ts = []
            for i in range(iters):
                t = time.perf_counter()
                jax.block_until_ready(step(*sets[i % len(sets)]))
                ts.append(time.perf_counter() - t)
            times[name].append(statistics.median(ts))
    return times


def measure(progs: dict, model: Any, sets: list, rounds: int, iters: int) -> tuple[float, dict, list, Any]:
    """Check and time the programs that have a step (``sets[1]`` checks, all rotate in timing):
    ``(worst gradient error, times by name, jit(value_and_grad)'s times, dots_saveable's peak)``."""
    timed = {k: v for k, v in progs.items() if v[0] is not None}
    err = check(timed, model, sets[1])
    times = time_rounds(timed, sets, rounds, iters)
    return err, times, times["jit(value_and_grad)"], peak_bytes(progs["jit(dots_saveable)"][1])


def ratio_cells(times: list[float] | None, ref: list[float], exe: Any, dots_peak: int | None) -> list[str]:
    """One program's table cells: median time ratio to ``ref`` over the rounds, its (min-max),
    compiled peak, and peak as a ratio to ``dots_peak`` ("-" where not measured)."""
    r = [t / b for t, b in zip(times, ref)] if times else None
    peak = peak_bytes(exe) if exe is not None else None
    return [f"{statistics.median(r):.3f}" if r else "-", f"({min(r):.2f}-{max(r):.2f})" if r else "-",
            fmt_bytes(peak), f"{peak / dots_peak:.3f}" if peak and dots_peak else "-"]


def probe_main(doc: str, title: str, probe: Callable[..., str], argv: list[str] | None = None,
               rounds: int = 9, **extra: int) -> None:
    """The command line the fused-step probes share: ``MODEL [MODEL ...] [--small] [--rounds 9]
    [--iters 5] [--out FILE]``, plus an integer ``--NAME`` per ``extra`` (its default), each model's
    section from ``probe(model, rounds, iters, **extra)``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", help="also write the report to this file")
    for name, default in extra.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args(argv)
    models = zoo("small" if a.small else "gpu")
    report(title, (probe(models[m], a.rounds, a.iters, **{k: getattr(a, k) for k in extra}) for m in a.models),
           a.out)


def paired_ratio(a: Callable, b: Callable, sets: list, pairs: int, blocks: int = 5) -> tuple[float, float, float]:
    """``(median ratio, min, max)`` of step ``a``'s single blocked calls to ``b``'s, the two taking turns call by
    call (each first in every other pair, inputs rotating over ``sets``): the ratio of all calls' medians, and the
    least and greatest over ``blocks`` consecutive blocks of the pairs. Calls this close in time share the
    host's and the device's state, which drifts over a run by more than the 2% the goal reads."""
    times: dict[Callable, list[float]] = {a: [], b: []}
    for i in range(pairs):
        for step in ((a, b) if i % 2 == 0 else (b, a)):
            t = time.perf_counter()
            jax.block_until_ready(step(*sets[i % len(sets)]))
            times[step].append(time.perf_counter() - t)
    size = max(1, pairs // blocks)
    ratios = [statistics.median(times[a][k:k + size]) / statistics.median(times[b][k:k + size])
              for k in range(0, pairs - size + 1, size)]
    return statistics.median(times[a]) / statistics.median(times[b]), min(ratios), max(ratios)


def bench_model(model: Any, rounds: int, iters: int, pairs: int = 100) -> str:
    sets = [model.make_args(jax.random.key(i)) for i in range(3)]
    choices: dict[str, Any] = {}
    progs = programs(model, sets[0], choices)
    err, times, ref, dots_peak = measure(progs, model, sets, rounds, iters)
    rows = [["program", "runs", "step ms", "x jit(v&g)", "(min-max)", "peak", "x dots_saveable peak", "layouts",
             "order", "barrier", "derived again"]]
    for name, (_, exe) in progs.items():
        c = choices.get(name)
        rows.append([name, "-" if c is None else str(c.runs), f"{statistics.median(times[name]) * 1e3:.3f}",
                     *ratio_cells(times[name], ref, exe, dots_peak),
                     *(["-"] * 4 if c is None else [c.layouts, c.order, c.barrier, str(len(c.rederived))])])
    ratio, low, high = paired_ratio(progs["jaxaot fused min-cut 1"][0], progs["jaxaot split min-cut 1"][0], sets, pairs)
    verdict = "met" if ratio <= 1.02 else "NOT met"
    goal = (f"goal: value_and_grad at min-cut 1 (runs {choices['jaxaot fused min-cut 1'].runs}) within 1.02x the "
            f"split step: {verdict} ({ratio:.3f}, {low:.2f}-{high:.2f} over five blocks of {pairs} pairs of calls)")
    why = f"its choice: {choices['jaxaot fused min-cut 1'].why}"
    return f"## {model.label}  (max relative grad error {err:.1e})\n" + table(rows) + "\n" + goal + "\n" + why


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--only", help="run only the models whose name contains one of these (comma-separated)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=100, help="pairs of calls the goal line times")
    a = ap.parse_args(argv)
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    jax.config.update("jax_default_matmul_precision", "default")
    only = a.only.split(",") if a.only else None
    models = [m for n, m in zoo("small" if a.small else "gpu").items() if not only or any(o in n for o in only)]
    sections = (bench_model(m, a.rounds, a.iters, a.pairs) for m in models)
    return report("fused training step vs jax.jit(jax.value_and_grad)", sections, a.out)


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing
    main()
