"""Planner benchmark: is jaxaot's min-cut ever dominated by a one-line JAX checkpoint policy?

A budget is dominated when a JAX policy saves no more bytes at no more time: on an H100
transformer block, the min-cut at budget 1 once saved 0.355x of ``jax.fwd_and_bwd``'s
residuals at 1.13x the fused step, where ``jax.checkpoint(policy=dots_saveable)`` saved
0.290x at 1.11x. This benchmark asks the question of every model of the
zoo (``benchmarks/models.py``: Llama, GPT-2 (2, 8 and 16 heads), top-2 MoE, ViT, ConvNet + batch norm, GRU by ``lax.scan``,
the 12-layer scanned GPT and the demo transformer block).

Per model, interleaved in one run (programs take turns round by round, each
cycling through ``INPUT_SETS`` input sets as in ``bench_partitioners.py``), it
measures residual bytes (every array the forward hands the backward, inputs
included; host-offloaded ones apart) and the split step time (forward, then
backward; each step blocked on; the forward alone too, and steps dispatched
back to back, "pipelined") of:

* JAX: everything saved (``jax.fwd_and_bwd``), and ``jax.checkpoint`` with
  ``dots_saveable``, ``dots_with_no_batch_dims_saveable``, ``nothing_saveable``
  and, on GPU, ``offload_dot_with_no_batch_dims`` (device -> pinned host), each
  split with ``jax.fwd_and_bwd``;
* jaxaot: the min-cut at memory budgets 0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95 and 1,
  and, per JAX policy, the largest budget whose plan saves at most the policy's
  bytes (found by bisection on ``lower().saved_bytes``, no compilation): the
  budget a user who wants that policy's memory would pick (budgets whose
  partitions are identical are compiled and timed once);
* the fused ``jax.jit(jax.value_and_grad)``, the time reference.

Bytes are a ratio to everything-saved, times a ratio to the fused step (the
median over rounds of each round's ratio, with the rounds' interquartile range). Verdicts:

* per JAX policy P: ``dominated-by-none`` if some jaxaot budget saves at most
  P's bytes in at most 1.02x P's time (the paired per-round ratio's median),
  else ``DOMINATES jaxaot``;
* the default budget (1.0) against ``dots_saveable``: ``DOMINATED`` if
  ``dots_saveable`` saves the same bytes (within 1%) and is faster by more
  than 2%, or saves over 1% fewer bytes and is at most 2% slower; else
  ``not dominated``.

Usage (from the repository root): ``python -m benchmarks.bench_planner [--small] [--only NAME] [--out FILE]
[--rounds N] [--iters N] [--op-costs auto|measured|flops]``
(``--small``: CPU sizes, float32 except the bf16 GPT-2 blocks; default: the
GPU sizes, bf16).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

import jaxaot
from benchmarks import models as zoo_models
from benchmarks.bench_partitioners import INPUT_SETS, input_sets
from benchmarks.harness import fmt_bytes, loop_time, median_time, report, table

BUDGETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
#: The default memory budget of ``min_cut_rematerialization_partition``.
DEFAULT_BUDGET = 1.0
#: A jaxaot budget "matches" a policy's time within this factor (noise of a shared machine).
TIME_SLACK = 1.02
#: Bytes within this fraction of each other tie (the default-budget verdict only).
BYTES_SLACK = 0.01
EVERYTHING = "everything saved"


def jax_policies(gpu: bool) -> dict[str, Any]:
    """name -> ``jax.checkpoint`` policy (``None``: no checkpoint, ``jax.fwd_and_bwd`` of the loss itself)."""
    cp = jax.checkpoint_policies
    pols: dict[str, Any] = {
        EVERYTHING: None,
        "dots_saveable": cp.dots_saveable,
        "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
        "nothing_saveable": cp.nothing_saveable,
    }
    if gpu:
        pols["offload_dot_with_no_batch_dims"] = cp.offload_dot_with_no_batch_dims("device", "pinned_host")
    return pols


# --------------------------------------------------------------------------- programs
class Program:
    """One way to run a training step.

    Attributes:
      name: row label; kind: ``"jax"``, ``"jaxaot"`` or ``"fused"``; budget: jaxaot's memory budget;
        policy: the JAX policy's name.
      step: one fwd+bwd step on the next input set; forward: the forward alone (split programs).
      grads: gradients (float leaves of the differentiated arguments) on ``sets[0]``.
      device_bytes / host_bytes: residual bytes the forward leaves on the device / offloads to host.
      same_as: budgets whose partition is this one's (timed once).
    """

    def __init__(self, name: str, kind: str, run: Callable[..., Any], forward: Callable[..., Any] | None,
                 grads: Callable[[tuple], list], sets: list[tuple], device_bytes: int | None,
                 host_bytes: int = 0, budget: float | None = None, policy: str | None = None):
        self.name, self.kind, self.budget, self.policy = name, kind, budget, policy
        self.device_bytes, self.host_bytes = device_bytes, host_bytes
        self.grads = grads
        self.same_as: list[float] = []
        self._i = 0
        self._sets = sets

        def cycle(fn):
            def go():
                self._i = (self._i + 1) % len(sets)
                return fn(*sets[self._i])
            return go

        self.step = cycle(run)
        self.forward = cycle(forward) if forward is not None else None
        self.single: list[float] = []
        self.fwd: list[float] = []
        self.piped: list[float] = []


def float_grads(grads: Any) -> list:
    return [jnp.asarray(g, jnp.float32) for g in jax.tree_util.tree_leaves(grads)
            if g.dtype != jax.dtypes.float0]


def _residual_bytes(res: Any) -> tuple[int, int]:
    """``(device, host)`` bytes of the residual arrays (host: memory kinds other than ``device``)."""
    dev = host = 0
    for x in jax.tree_util.tree_leaves(res):
        kind = getattr(getattr(x, "sharding", None), "memory_kind", None)
        if kind is not None and "host" in kind:
            host += x.nbytes
        else:
            dev += x.nbytes
    return dev, host


def jax_program(name: str, model: zoo_models.Model, sets: list[tuple], policy: Any, policy_name: str) -> Program:
    """``jax.fwd_and_bwd`` of the loss, under ``jax.checkpoint(policy=...)`` unless ``policy`` is None."""
    loss = model.loss if policy is None else jax.checkpoint(model.loss, policy=policy)
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=model.argnums)
    out, res = fwd(*sets[0])
    ct = jnp.ones_like(out)
    dev, host = _residual_bytes(res)

    def run(*args):
        _, r = fwd(*args)
        return bwd(r, ct)

    return Program(name, "jax", run, fwd, lambda args: float_grads(run(*args)), sets, dev, host,
                   policy=policy_name)


#: What prices recomputation below budget 1 (``--op-costs``): the min-cut's default, "auto", measures on GPUs.
OP_COSTS = "auto"


def partitioner(budget: float, device_model: Any = None) -> Callable:
    """The min-cut at ``budget``; with a ``jaxaot.partition.DeviceModel``, offloading as it plans."""
    if device_model is None:
        return functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget,
                                 op_costs=OP_COSTS)
    return functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget, offload=True,
                             device_model=device_model, op_costs=OP_COSTS)


def matched_budget(model: zoo_models.Model, args: tuple, target: int, steps: int = 12,
                   device_model: Any = None, joint: Any = None) -> float | None:
    """The largest budget (to ``2**-steps``) whose plan keeps at most ``target`` bytes on the device; None
    if even budget 0 keeps more. Budget sweeps are monotone, so bisection finds it. The joint graph is
    traced once (or given: ``joint``); each probe is one partition (what ``lower().device_saved_bytes``
    reports)."""
    joint = jaxaot.partition.trace_joint(model.loss, *args) if joint is None else joint

    def saved(budget: float) -> int:
        return partitioner(budget, device_model)(joint).device_saved_bytes

    if saved(1.0) <= target:
        return 1.0
    if saved(0.0) > target:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if saved(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def jaxaot_programs(model: zoo_models.Model, sets: list[tuple], extra: dict[float, str] | None = None,
                    budgets: tuple = BUDGETS, device_model: Any = None) -> list[Program]:
    """The min-cut at every budget of ``budgets`` and of ``extra`` (budget -> the policy it matches),
    offloading with ``device_model`` if given; budgets with identical partitions share one program."""
    progs: dict[str, Program] = {}
    one = jnp.ones((), jnp.float32)
    extra = extra or {}
    for budget in sorted({*budgets, *extra}):
        aot = jaxaot.aot_function(model.loss, partition_fn=partitioner(budget, device_model))
        low = aot.lower(*sets[0])
        key = f"{low.forward}\n--\n{low.backward}"
        if key in progs:
            progs[key].same_as.append(budget)
            continue

        def run(*args, aot=aot):
            _, res = aot.forward(*args)
            return aot.backward(res, one)

        def grads(args, run=run):
            g = run(*args)
            return float_grads([g[i] for i in model.argnums])

        _, res = aot.forward(*sets[0])
        dev, host = _residual_bytes(res)
        assert dev + host == low.saved_bytes, (dev, host, low.saved_bytes)
        label = (f"jaxaot min-cut {budget:.3g}" + (" offload" if device_model is not None else "")
                 + (f" (matches {extra[budget]})" if budget in extra else ""))
        progs[key] = Program(label, "jaxaot", run, aot.forward, grads, sets, dev, host, budget=budget)
        progs[key].aot = aot  # its fused twin (bench_offload) reuses the traced, partitioned function
    return list(progs.values())


def fused_program(model: zoo_models.Model, sets: list[tuple]) -> Program:
    fused = jax.jit(jax.value_and_grad(model.loss, argnums=model.argnums))
    return Program("jit(value_and_grad) (fused)", "fused", fused, None,
                   lambda args: float_grads(fused(*args)[1]), sets, None)


def check_grads(progs: list[Program], model: zoo_models.Model, args: tuple) -> list[str]:
    """Names of programs whose gradients differ from the fused program's (relative L2 per leaf)."""
    tol = 2e-2 if model.dtype == jnp.float32 else 6e-2
    ref = progs[-1].grads(args)
    bad = []
    for p in progs[:-1]:
        errs = [float(jnp.linalg.norm(g - w) / (jnp.linalg.norm(w) + 1e-30)) for g, w in zip(p.grads(args), ref)]
        if max(errs) > tol:
            bad.append(f"{p.name} (relative error {max(errs):.2e})")
    return bad


# --------------------------------------------------------------------------- timing
def time_interleaved(progs: list[Program], *, rounds: int, iters: int) -> None:
    """Fill each program's per-round times: single steps (blocked), forward alone, pipelined steps."""
    for p in progs:  # warm up: compile, allocate
        median_time(p.step, warmup=2, iters=1)
        if p.forward is not None:
            median_time(p.forward, warmup=1, iters=1)
    for _ in range(rounds):
        for p in progs:
            p.single.append(median_time(p.step, warmup=0, iters=iters, min_seconds=0))
            if p.forward is not None:
                p.fwd.append(median_time(p.forward, warmup=0, iters=iters, min_seconds=0))
            p.piped.append(loop_time(p.step, n=iters, repeats=1))


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b)]


def spread(xs: list[float]) -> str:
    """``median [first quartile-third quartile]``."""
    if len(xs) < 2:
        return f"{statistics.median(xs):.3f}"
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return f"{statistics.median(xs):.3f} [{q1:.2f}-{q3:.2f}]"


# --------------------------------------------------------------------------- verdicts
def policy_verdict(policy: Program, budgets: list[Program]) -> tuple[str, str]:
    """``("dominated-by-none" | "DOMINATES jaxaot", detail)`` for one JAX policy against the jaxaot budgets."""
    matches = []
    for b in budgets:
        r = statistics.median(ratios(b.single, policy.single))
        if b.device_bytes <= policy.device_bytes:
            matches.append((r, b))
    good = [(r, b) for r, b in matches if r <= TIME_SLACK]
    if good:
        r, b = min(good, key=lambda rb: (rb[1].device_bytes, rb[0]))  # the fewest bytes that keep up
        return "dominated-by-none", (f"min-cut {_budgets(b)}: {b.device_bytes / max(policy.device_bytes, 1):.3f}x "
                                     f"its bytes at {r:.3f}x its time")
    if matches:
        r, b = min(matches, key=lambda rb: rb[0])
        return "DOMINATES jaxaot", (f"fastest budget within its bytes: min-cut {_budgets(b)} at {r:.3f}x its time "
                                    f"({b.device_bytes / max(policy.device_bytes, 1):.3f}x its bytes)")
    return "DOMINATES jaxaot", "no budget saves as few bytes"


def default_verdict(default: Program, dots: Program) -> tuple[str, str]:
    """Whether ``dots_saveable`` dominates the default budget (Pareto, with ``TIME_SLACK`` on time and
    ``BYTES_SLACK`` on bytes: a few KB of norm statistics either way is a tie, not a win)."""
    r = statistics.median(ratios(dots.single, default.single))  # dots time / default time
    b = dots.device_bytes / max(default.device_bytes, 1)
    fewer, same = b < 1 - BYTES_SLACK, abs(b - 1) <= BYTES_SLACK
    dominated = (same and r * TIME_SLACK < 1.0) or (fewer and r <= TIME_SLACK)
    detail = (f"dots_saveable: {dots.device_bytes / max(default.device_bytes, 1):.3f}x the default's bytes "
              f"at {r:.3f}x its time")
    return ("DOMINATED" if dominated else "not dominated"), detail


def _budgets(p: Program) -> str:
    return "/".join(f"{b:.3g}" for b in [p.budget, *p.same_as])


# --------------------------------------------------------------------------- one model
def bench_model(model: zoo_models.Model, *, gpu: bool, rounds: int, iters: int,
                summary: list[tuple]) -> str:
    t0 = time.perf_counter()
    sets = input_sets(model.make_args(jax.random.key(0)), INPUT_SETS)
    progs: list[Program] = []
    failed: list[str] = []
    for name, policy in jax_policies(gpu).items():
        label = "jax.fwd_and_bwd (everything saved)" if policy is None else f"checkpoint({name})"
        try:
            progs.append(jax_program(label, model, sets, policy, name))
        except Exception as e:  # noqa: BLE001 - e.g. no pinned host memory on this backend
            failed.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    extra = {}
    joint = jaxaot.partition.trace_joint(model.loss, *sets[0])
    for p in progs:
        if p.policy not in (None, EVERYTHING):
            b = matched_budget(model, sets[0], p.device_bytes, joint=joint)
            if b is not None and b not in BUDGETS:
                extra.setdefault(b, p.policy)
    budgets = jaxaot_programs(model, sets, extra)
    progs += budgets
    progs.append(fused_program(model, sets))
    bad = check_grads(progs, model, sets[0])
    setup = time.perf_counter() - t0
    time_interleaved(progs, rounds=rounds, iters=iters)

    everything = next(p for p in progs if p.policy == EVERYTHING)
    fused = progs[-1]
    rows = []
    for p in progs:
        name = p.name + (f" (= {', '.join(f'{b:g}' for b in p.same_as)})" if p.same_as else "")
        if p.device_bytes is None:
            byt, ratio_b = "-", "-"
        else:
            byt = fmt_bytes(p.device_bytes) + (f" +{fmt_bytes(p.host_bytes)} host" if p.host_bytes else "")
            ratio_b = f"{p.device_bytes / everything.device_bytes:.3f}"
        step = statistics.median(p.single)
        fwd = f"{statistics.median(p.fwd) * 1e3:.3f}" if p.fwd else "-"
        bwd = f"{(step - statistics.median(p.fwd)) * 1e3:.3f}" if p.fwd else "-"
        rows.append((name, byt, ratio_b, f"{step * 1e3:.3f}", fwd, bwd, spread(ratios(p.single, fused.single)),
                     f"{statistics.median(ratios(p.piped, fused.piped)):.3f}"))
    head = ("program", "residuals", "x saved-all", "step ms", "fwd ms", "bwd ms", "x fused [IQR]",
            "pipelined x fused")
    lines = [f"## {model.label}", table([head, *rows]), "", "verdicts (time: median over rounds of paired ratios):"]
    for p in progs:
        pol = p.policy
        if pol is None:
            continue
        v, detail = policy_verdict(p, budgets)
        lines.append(f"  {pol:<34} {v:<18} {detail}")
        summary.append((model.name, pol, v))
    default = next(b for b in budgets if DEFAULT_BUDGET in (b.budget, *b.same_as))
    dots = next((p for p in progs if p.policy == "dots_saveable"), None)
    if dots is not None:
        v, detail = default_verdict(default, dots)
        lines.append(f"  {'default budget vs dots_saveable':<34} {v:<18} {detail}")
        summary.append((model.name, "default budget vs dots_saveable", v))
    for f in failed:
        lines.append(f"  not measured: {f}")
    for b in bad:
        lines.append(f"  GRADIENT MISMATCH against the fused program: {b}")
    lines.append(f"  ({len(progs)} programs, {len(budgets)} distinct jaxaot partitions; "
                 f"setup {setup:.0f} s, total {time.perf_counter() - t0:.0f} s)")
    return "\n".join(lines)


def summary_section(summary: list[tuple]) -> str:
    """model x policy table of the verdicts."""
    models = list(dict.fromkeys(m for m, _, _ in summary))
    cols = list(dict.fromkeys(c for _, c, _ in summary))
    got = {(m, c): v for m, c, v in summary}
    short = {"default budget vs dots_saveable": "default vs dots"}
    rows = [("model", *[short.get(c, c) for c in cols])]
    rows += [(m, *[got.get((m, c), "-") for c in cols]) for m in models]
    n_dom = sum(v == "DOMINATES jaxaot" for _, c, v in summary)
    return (f"## verdicts\n{table(rows)}\n\n{n_dom} policy/model pair(s) where a JAX policy dominates every "
            f"jaxaot budget; default budget dominated by dots_saveable on "
            f"{sum(v == 'DOMINATED' for _, _, v in summary)} model(s).")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes (float32, the GPT-2 blocks bf16)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--only", help="run only the models whose name contains this")
    ap.add_argument("--iters", type=int, default=3, help="timed steps per program and round (median)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of interleaved timing (many short rounds: a burst of load on a shared machine hits "
                    "one round, not one program); default 15, 9 with --small (a 2-core CPU run stays under 10 min)")
    ap.add_argument("--op-costs", default="auto", choices=("auto", "measured", "flops"),
                    help="what prices recomputation below budget 1 (the min-cut's op_costs; auto: measured on GPUs)")
    a = ap.parse_args(argv)
    global OP_COSTS
    OP_COSTS = a.op_costs
    rounds = a.rounds or (9 if a.small else 15)
    gpu = jax.devices()[0].platform == "gpu"
    zoo = zoo_models.zoo("small" if a.small else "gpu")
    summary: list[tuple] = []

    def sections() -> Iterator[str]:
        for name, model in zoo.items():
            if a.only and a.only not in name:
                continue
            yield bench_model(model, gpu=gpu, rounds=rounds, iters=a.iters, summary=summary)
        yield summary_section(summary)

    return report(f"bench_planner: jaxaot min-cut budgets against JAX checkpoint policies (never dominated?); "
                  f"op_costs={a.op_costs}", sections(), a.out)


if __name__ == "__main__":
    main()
