"""Byte-budget benchmark: does ``memory_budget`` = a JAX policy's peak fit that peak, no slower, planned fast?

For each model (the zoo of ``benchmarks/models.py`` and two models not in it:
an 8-layer Llama by ``lax.scan`` in bf16, and a post-LN ReLU block with 12
heads in float32) and each JAX checkpoint policy P (``dots_saveable``,
``dots_with_no_batch_dims_saveable``, ``nothing_saveable``, and
``offload_dot_with_no_batch_dims`` where the backend has host memory), placed
as users place it, both

* on the whole loss, ``jax.checkpoint(loss, policy=P)``, and
* per layer, ``jax.checkpoint(layer, policy=P)`` inside the ``lax.scan`` or on
  each block beneath the loss head (``Model.per_layer``),

it measures P's step, ``jax.jit(jax.value_and_grad(...))``: its compiled peak
(``memory_analysis``) and its time; then jaxaot with ``memory_budget`` = that
peak, run as ``jaxaot.value_and_grad`` of the ``aot_function``: the compiled
peak of the step it runs (``lower(...).compile().peak_bytes``) and its time.

Verdict per (model, P, placement): ``met`` if jaxaot's compiled peak is at most
P's and its time at most P's (the median of per-round ratios), ``within
noise`` up to 1.02x, ``SLOWER`` beyond, ``OVER`` if its peak is above P's,
``REFUSED`` if the planner raised ``MemoryBudgetError`` (its smallest peak is
printed).

Per model, a (peak, time) Pareto table of every program: each P in both
placements, jaxaot at each matched budget and at the fractions 0, 0.5 and 1,
and ``jit(value_and_grad)``; medians over interleaved rounds, with the min-max;
``*`` marks the Pareto front, and the summary says whether every JAX program
is dominated by (or equal to) a jaxaot one.

First steps: the first call (trace, plan, compile, run) of ``jit(value_and_grad)``
and of jaxaot at every budget is timed in fresh processes with cold caches (no
persistent cache), ``--first-rounds`` times each, interleaved (the median, and
its ratio to ``jit(value_and_grad)``'s first step), and in the same process,
where the backend reports it, ``peak_bytes_in_use`` after the first step, under JAX's
default allocator, against the compiled peak of the program that process ran (its plan is
its own: the op timings that price plans differ between processes): the memory the
process needed, planning included; the table shows the worst process, its planning peak too. "planning peak" is the
device's ``peak_bytes_in_use`` when the first call's planning (trace, joint, partition) ended,
read every 5 ms on a thread: what planning held before the step's executable ran.
On an accelerator, where a fraction's
first call returns before the fused step's variants compile, the process then
calls the step until the choice is made: "choice made" is the seconds from
the first call's start, and "calls" how many calls after it that took.
``--first-only`` measures just that: the first steps at the fractions and at
each per-layer policy's peak (with ``--no-budgets``, at the fractions alone), into
``results/budget_first_<device>.txt`` by default, apart from the full table.

Usage (from the repository root): ``python -m benchmarks.bench_budget [--small] [--only NAME ...]
[--rounds N] [--iters N] [--first-rounds N] [--out FILE] [--plot DIR]``
(``--small``: CPU sizes and the models of ``SMALL_MODELS``, a quarter of an hour on two cores; ``--only``
picks models of either size).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxaot
from jaxaot._src.config import SETTINGS
from benchmarks import models as zoo_models
from benchmarks.bench_partitioners import input_sets
from benchmarks.harness import (
    TimeUp, fmt_bytes, median_time, peak_bytes, provisional, raise_on_sigterm, report, result_path, table, time_is_up,
    weighing)
from benchmarks.models import Draw, Model, layer_norm, mean_square, rms_norm, rotary

#: A jaxaot step within this factor of a policy's time ties it (two compiles of one program differ by ~2%).
NOISE = 1.02
FRACTIONS = (0.0, 0.5, 1.0)
#: The models a ``--small`` run covers by default (the CPU is slow to compile): a block, a scanned model
#: of the zoo, and the two models not in the zoo.
SMALL_MODELS = ("llama_block", "gpt_scanned", "llama_scanned", "postln_relu_block")


def policies(offload: bool) -> dict[str, Any]:
    cp = jax.checkpoint_policies
    out = {"dots_saveable": cp.dots_saveable,
           "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
           "nothing_saveable": cp.nothing_saveable}
    if offload:
        out["offload_dot_with_no_batch_dims"] = cp.offload_dot_with_no_batch_dims("device", "pinned_host")
    return out


# --------------------------------------------------------------------------- two models not in the zoo
def llama_scanned(batch: int, seq: int, width: int, hidden: int, layers: int, dtype: Any) -> Model:
    """A Llama-style stack by ``lax.scan``: RMSNorm, rotary, causal attention with 8 query and 2 key/value
    heads, SwiGLU; loss ``mean(y**2)`` in float32."""
    q_heads, kv_heads = 8, 2
    hd = width // q_heads

    def layer(x, p):
        b, t, d = x.shape
        h = rms_norm(x, p["attn_norm"])
        q = rotary((h @ p["wq"]).reshape(b, t, q_heads, hd))
        k = rotary((h @ p["wk"]).reshape(b, t, kv_heads, hd))
        v = (h @ p["wv"]).reshape(b, t, kv_heads, hd)
        k, v = (jnp.repeat(a, q_heads // kv_heads, axis=2) for a in (k, v))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.asarray(hd ** 0.5, x.dtype)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, jnp.finfo(s.dtype).min)
        a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["wo"]
        h = rms_norm(x, p["mlp_norm"])
        return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], None

    def per_layer(wrap):
        def loss(p, x):
            y, _ = lax.scan(wrap(layer), x, p)
            return mean_square(y)
        return loss

    def make_args(key):
        r = Draw(key)
        p = {"attn_norm": r.near_one((layers, width), dtype),
             "wq": r.dense((layers, width, width), dtype, fan_in=width),
             "wk": r.dense((layers, width, kv_heads * hd), dtype, fan_in=width),
             "wv": r.dense((layers, width, kv_heads * hd), dtype, fan_in=width),
             "wo": r.dense((layers, width, width), dtype, fan_in=width, scale=0.5),
             "mlp_norm": r.near_one((layers, width), dtype),
             "w_gate": r.dense((layers, width, hidden), dtype, fan_in=width),
             "w_up": r.dense((layers, width, hidden), dtype, fan_in=width),
             "w_down": r.dense((layers, hidden, width), dtype, fan_in=hidden, scale=0.5)}
        return p, r.normal((batch, seq, width), dtype)

    label = f"llama {layers} layers by lax.scan, 8q/2kv heads ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("llama_scanned", label, per_layer(lambda f: f), make_args, (0, 1), dtype, per_layer)


def postln_relu_block(batch: int, seq: int, width: int, heads: int, dtype: Any) -> Model:
    """A post-LN block (BERT's order): non-causal attention with ``heads`` heads, LayerNorm after each
    residual add, a ReLU MLP of width 4x; loss ``mean(y**2)`` in float32."""

    def block(p, x):
        b, t, d = x.shape
        q, k, v = (a.reshape(b, t, heads, d // heads) for a in jnp.split(x @ p["qkv"], 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.asarray((d // heads) ** 0.5, x.dtype)
        a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
        x = layer_norm(x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["proj"], p["ln1"], p["b1"])
        return layer_norm(x + jax.nn.relu(x @ p["fc"]) @ p["out"], p["ln2"], p["b2"])

    def per_layer(wrap):
        return lambda p, x: mean_square(wrap(block)(p, x))

    def make_args(key):
        r = Draw(key)
        p = {"qkv": r.dense((width, 3 * width), dtype), "proj": r.dense((width, width), dtype),
             "ln1": r.near_one(width, dtype), "b1": r.small((width,), dtype),
             "fc": r.dense((width, 4 * width), dtype), "out": r.dense((4 * width, width), dtype, scale=0.5),
             "ln2": r.near_one(width, dtype), "b2": r.small((width,), dtype)}
        return p, r.normal((batch, seq, width), dtype)

    label = f"post-LN ReLU block, {heads} heads ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("postln_relu_block", label, per_layer(lambda f: f), make_args, (0, 1), dtype, per_layer)


def all_models(size: str) -> dict[str, Model]:
    """The zoo at ``size`` and the two models above (``tiny`` and ``small``: CPU shapes; ``gpu``: an H100's)."""
    models = dict(zoo_models.zoo(size))
    if size == "gpu":
        extra = [llama_scanned(8, 1024, 1024, 2816, 8, jnp.bfloat16), postln_relu_block(4, 1024, 768, 12, jnp.float32)]
    elif size == "small":
        extra = [llama_scanned(2, 64, 64, 176, 4, jnp.bfloat16), postln_relu_block(2, 64, 96, 12, jnp.float32)]
    else:
        extra = [llama_scanned(2, 8, 16, 40, 2, jnp.bfloat16), postln_relu_block(2, 8, 24, 12, jnp.float32)]
    models.update((m.name, m) for m in extra)
    return models


# --------------------------------------------------------------------------- programs
class Program:
    """One step of one model: ``step()`` runs it on the next input set (blocked by the timer)."""

    def __init__(self, name: str, kind: str, run: Callable[..., Any], sets: list[tuple], peak: int | None,
                 spec: str = ""):
        self.name, self.kind, self.peak, self.spec = name, kind, peak, spec
        self.times: list[float] = []
        self.also: list[str] = []  # budgets whose plan is this one's
        self._i, self._sets, self._run = 0, sets, run

    def step(self) -> Any:
        self._i = (self._i + 1) % len(self._sets)
        return self._run(*self._sets[self._i])


def jax_step(model: Model, policy: Any, per_layer: bool = False) -> Callable[..., Any]:
    """``jit(value_and_grad)`` of the loss, under ``policy`` on the whole loss or on each layer."""
    if policy is None:
        loss = model.loss
    elif per_layer:
        loss = model.per_layer(functools.partial(jax.checkpoint, policy=policy))
    else:
        loss = jax.checkpoint(model.loss, policy=policy)
    return jax.jit(jax.value_and_grad(loss, argnums=model.argnums))


def jaxaot_step(model: Model, budget: float | int) -> Callable[..., Any]:
    pf = jaxaot.partition.min_cut_rematerialization_partition(memory_budget=budget)
    return jaxaot.value_and_grad(jaxaot.aot_function(model.loss, partition_fn=pf), argnums=model.argnums)


def step_of(model: Model, spec: str) -> Callable[..., Any]:
    """The step a spec names: ``jax:none``, ``jax:POLICY`` (whole loss), ``jax-layer:POLICY`` (per layer),
    ``jaxaot:BUDGET`` (a JSON number, or a string with a unit)."""
    kind, _, what = spec.partition(":")
    if kind == "jaxaot":
        return jaxaot_step(model, json.loads(what))
    return jax_step(model, None if what == "none" else policies(True)[what], per_layer=kind == "jax-layer")


def jax_program(name: str, model: Model, sets: list[tuple], spec: str) -> Program | None:
    step = step_of(model, spec)
    try:
        peak = peak_bytes(step.lower(*sets[0]).compile())
        jax.block_until_ready(step(*sets[0]))
    except Exception as err:  # noqa: BLE001 - an offload policy on a backend without host memory
        print(f"  {name}: not run here ({type(err).__name__}: {str(err).splitlines()[0][:120]})", flush=True)
        return None
    return Program(name, "jax", step, sets, peak, spec)


def jaxaot_program(name: str, model: Model, sets: list[tuple], budget: float | int,
                   seen: dict[str, Program]) -> Program | str:
    """jaxaot at ``budget``, or the refusal's text; plans equal to one in ``seen`` share its program."""
    spec = f"jaxaot:{json.dumps(budget)}"
    vg = step_of(model, spec)
    try:
        low = vg.lower(*sets[0])
    except jaxaot.errors.MemoryBudgetError as err:
        return f"REFUSED (smallest peak {fmt_bytes(err.smallest_peak)})"
    key = f"{low.forward}\n--\n{low.backward}"
    if key in seen:
        seen[key].also.append(name)
        return seen[key]
    jax.block_until_ready(vg(*sets[0]))
    prog = Program(name, "jaxaot", vg, sets, low.compile().peak_bytes, spec)
    seen[key] = prog
    return prog


def time_interleaved(progs: list[Program], rounds: int, iters: int) -> None:
    """Each round, each program in turn: the median of ``iters`` blocked steps."""
    for p in progs:
        median_time(p.step, warmup=2, iters=1, min_seconds=0)
    for _ in range(rounds):
        for p in progs:
            p.times.append(median_time(p.step, warmup=0, iters=iters, min_seconds=0))


# --------------------------------------------------------------------------- first steps, fresh processes
def fresh_first_step(model_name: str, size: str, spec: str) -> dict:
    """A fresh process's first step of ``spec`` (seconds: trace, plan, compile, run) and its
    ``peak_bytes_in_use`` after it (None where the backend does not report it); {} if it failed."""
    cmd = [sys.executable, "-m", "benchmarks.bench_budget", "--fresh", model_name, spec, "--size", size]
    cold = (SETTINGS["cache_dir"].env, "JAX_COMPILATION_CACHE_DIR")  # no persistent cache: a cold start
    env = {k: v for k, v in os.environ.items() if k not in cold}
    # JAX's default allocator: one region reserved up front, whose chunks ``peak_bytes_in_use`` counts as asked.
    # Growing regions as needed (preallocation off), it counts a whole free region given to a request up to 128 MiB
    # smaller: the planning's regions, free when the step runs, then read as held (``docs/benchmarks.md``).
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if r.returncode == 0 and lines else {}


def fresh_main(model_name: str, spec: str, size: str) -> None:
    """In a fresh process (cold caches): time the first step of ``spec``, then read the device's peak."""
    model = all_models(size)[model_name]
    args = jax.block_until_ready(model.make_args(jax.random.key(0)))
    step = step_of(model, spec)
    watch = PeakWatch(jax.devices()[0])
    t, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(step(*args))
    first, first_cpu = time.perf_counter() - t, time.process_time() - cpu
    stats = jax.devices()[0].memory_stats() or {}
    watch.stop()
    chosen, calls = _chosen_after(step, args, t)
    f = getattr(step, "__wrapped__", None)
    times = f.lookup(args, {}).programs.times if hasattr(f, "lookup") else {}
    planned = sum(times.get(k, 0.0) for k in ("trace", "joint", "partition"))
    print(json.dumps({"first_step": first, "first_step_cpu": first_cpu, "chosen_after": chosen, "calls": calls,
                      "phases": {k: round(v, 2) for k, v in times.items()},
                      "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
                      "planning_peak": watch.at(t + planned) if planned else None,
                      "compiled_peak": _ran_peak(step, args)}))


class PeakWatch:
    """The device's ``peak_bytes_in_use``, read every :attr:`PERIOD` seconds on a thread from now until :meth:`stop`
    (nothing where the backend does not report it): what the process held by a given moment, such as the end of
    planning (the first call's trace, joint and partition phases, timed by the runtime). A byte budget's planning
    takes seconds; reading more often would take the GIL from the step being timed."""

    PERIOD = 0.005

    def __init__(self, device: Any) -> None:
        self.device, self.samples, self.done = device, [], threading.Event()
        self.thread = None
        if "peak_bytes_in_use" in (device.memory_stats() or {}):
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.PERIOD):
            self.samples.append((time.perf_counter(), self.device.memory_stats()["peak_bytes_in_use"]))

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()

    def at(self, when: float) -> int | None:
        """The last peak read at or before ``when`` (a ``time.perf_counter()``); None if none was."""
        before = [peak for t, peak in self.samples if t <= when]
        return before[-1] if before else None


def _chosen_after(step: Callable, args: tuple, start: float, limit: float = 120.0) -> tuple[float, int]:
    """``(seconds from ``start`` until the fused step's choice is made, the calls after the first that it took)``:
    on an accelerator a jaxaot step's first call returns before its variants compile
    (``jaxaot.config.tune_in_background``), and the calls that follow make the choice; on CPU a byte budget's
    first calls run the search's executable until the runtime's own compile replaces it."""
    f = getattr(step, "__wrapped__", None)
    calls = 0
    while (weighing(f) or provisional(f, args)) and time.perf_counter() - start < limit:
        jax.block_until_ready(step(*args))
        calls += 1
    return time.perf_counter() - start, calls


def _ran_peak(step: Callable, args: tuple) -> int | None:
    """The compiled peak of the program ``step``'s first call ran (a jaxaot step's plan is its process's own:
    the op timings that price plans differ between processes); None where it is not reported."""
    try:
        compiled = step.lower(*args).compile()
        peak = getattr(compiled, "peak_bytes", None)  # jaxaot's; JAX's as the table reads it (temporaries included)
        return int(peak) if peak is not None else peak_bytes(compiled)
    except Exception:  # noqa: BLE001 - a step without the lower/compile stages, a backend without analysis
        return None


def first_steps(model: Model, size: str, specs: list[str], rounds: int) -> tuple[dict[str, list[dict]], str]:
    """Each spec's fresh-process first steps, ``rounds`` times, interleaved, and a note: empty, or where the time
    limit came first, how many processes ended before it (their results are kept)."""
    out: dict[str, list[dict]] = {s: [] for s in specs}
    try:
        for _ in range(rounds):
            for spec in specs:
                out[spec].append(fresh_first_step(model.name, size, spec))
                print(f"# {model.name} first step of {spec}: {out[spec][-1]}", file=sys.stderr, flush=True)
    except TimeUp:
        done = sum(map(len, out.values()))
        return out, f"(stopped at the time limit: {done} of {rounds * len(specs)} fresh processes ended)"
    return out, ""


# --------------------------------------------------------------------------- one model
def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _pareto(progs: list[Program]) -> set[int]:
    pts = [(id(p), p.peak, _median(p.times)) for p in progs if p.peak is not None]
    return {i for i, m, t in pts if not any(m2 <= m and t2 <= t and (m2, t2) != (m, t) for _, m2, t2 in pts)}


def _verdict(j: Program | str, p: Program) -> list[str]:
    if isinstance(j, str):
        return [fmt_bytes(p.peak), "-", "-", j]
    r = [a / b for a, b in zip(j.times, p.times)]
    fits = j.peak is not None and p.peak is not None and j.peak <= p.peak
    verdict = "OVER" if not fits else "met" if _median(r) <= 1.0 else "within noise" if _median(r) <= NOISE \
        else "SLOWER"
    return [fmt_bytes(p.peak), fmt_bytes(j.peak), f"{_median(r):.3f} ({min(r):.3f}-{max(r):.3f})", verdict]


class Outcome:
    """What one model's run found, for the summary."""

    def __init__(self):
        self.verdicts: list[str] = []
        self.jax_programs = 0
        self.dominated = 0  # JAX programs some jaxaot program matches or beats in both peak and time
        self.first_budget: list[float] = []  # first step / jit's, byte budgets
        self.first_fraction: list[float] = []  # ... fractions
        self.process_vs_compiled: list[float] = []  # process peak / compiled peak, byte budgets


def run_model(model: Model, size: str, rounds: int, iters: int, first_rounds: int, plot: str | None,
              outcome: Outcome) -> str:
    """The model's Pareto, verdict and first-step tables."""
    args = model.make_args(jax.random.key(0))
    sets = input_sets(args)
    progs: list[Program] = []
    ref = jax_program("jit(value_and_grad)", model, sets, "jax:none")
    progs.append(ref)
    peers: dict[tuple[str, str], Program] = {}
    offload = any(m.kind == "pinned_host" for m in jax.devices()[0].addressable_memories())
    placements = ("whole", "per layer") if model.per_layer is not None else ("whole",)
    for name in policies(offload):
        for where in placements:
            spec = f"jax:{name}" if where == "whole" else f"jax-layer:{name}"
            p = jax_program(f"{name} ({where})", model, sets, spec)
            if p is not None:
                peers[(name, where)] = p
                progs.append(p)
    seen: dict[str, Program] = {}
    matched: dict[tuple[str, str], Program | str] = {}
    budgets: dict[int, Program | str] = {}
    for (name, where), p in peers.items():
        if p.peak not in budgets:
            budgets[p.peak] = jaxaot_program(f"jaxaot at {fmt_bytes(p.peak)} ({name}, {where})", model, sets,
                                             p.peak, seen)
        elif isinstance(budgets[p.peak], Program):
            budgets[p.peak].also.append(f"at {name} ({where})")
        matched[(name, where)] = budgets[p.peak]
    for f in FRACTIONS:
        jaxaot_program(f"jaxaot fraction {f:g}", model, sets, f, seen)
    progs += list(seen.values())
    time_interleaved(progs, rounds, iters)

    specs = ["jax:none", *[f"jaxaot:{json.dumps(b)}" for b in budgets], *[f"jaxaot:{json.dumps(f)}" for f in FRACTIONS]]
    compiled = {p.spec: p.peak for p in progs}
    compiled.update((f"jaxaot:{json.dumps(b)}", q.peak) for b, q in budgets.items() if isinstance(q, Program))
    starts, first = first_step_table(model, size, specs, first_rounds, compiled, outcome)
    front = _pareto(progs)
    jit_first = first("jax:none")
    rows = [["program", "kind", "compiled peak", "time (ms)", "min-max", "x jit", "first step (s)", "x jit",
             "front", "same plan"]]
    for p in sorted(progs, key=lambda p: (p.peak or 0, _median(p.times))):
        t = _median(p.times)
        rows.append([p.name, p.kind, fmt_bytes(p.peak), f"{t * 1e3:.3f}",
                     f"{min(p.times) * 1e3:.3f}-{max(p.times) * 1e3:.3f}", f"{t / _median(ref.times):.3f}",
                     _seconds(first(p.spec)), _seconds(first(p.spec) / jit_first), "*" if id(p) in front else "",
                     ", ".join(p.also)])
    verdicts = [["policy", "placed", "its peak", "jaxaot peak", "time ratio (min-max)", "verdict"]]
    for (name, where), p in peers.items():
        v = _verdict(matched[(name, where)], p)
        verdicts.append([name, where, *v])
        outcome.verdicts.append(v[-1].split(" (")[0])
    jaxaot_pts = [(q.peak, _median(q.times)) for q in seen.values() if q.peak is not None]
    for p in peers.values():
        outcome.jax_programs += 1
        outcome.dominated += any(m <= p.peak and t <= _median(p.times) for m, t in jaxaot_pts)

    if plot:
        from jaxaot import viz

        os.makedirs(plot, exist_ok=True)
        fig = viz.plot_pareto([(p.name.replace("jaxaot ", ""), p.peak, _median(p.times), p.kind) for p in progs
                               if p.peak is not None], title=model.label)
        fig.savefig(os.path.join(plot, f"budget_{model.name}.png"), dpi=120)
    return f"## {model.name}: {model.label}\n\n{table(rows)}\n\n{table(verdicts)}\n\n{starts}"


def _seconds(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def first_step_table(model: Model, size: str, specs: list[str], rounds: int, compiled: dict[str, int | None],
                     outcome: Outcome) -> tuple[str, Callable[[str], float]]:
    """The first steps of ``specs`` (fresh processes, ``rounds`` each) as a table, and ``first(spec)``: a
    spec's median first step (NaN if not measured). ``compiled`` gives specs' compiled peaks."""
    firsts, note = first_steps(model, size, specs, rounds) if rounds else ({}, "")

    def first(spec: str) -> float:
        return _median([r["first_step"] for r in firsts.get(spec, []) if "first_step" in r])

    def cpu(spec: str) -> float:
        return _median([r["first_step_cpu"] for r in firsts.get(spec, []) if "first_step_cpu" in r])

    jit_first = first("jax:none")
    rows = [["first step of", "median (s)", "min-max", "x jit", "CPU time (s)", "x jit", "choice made (s)",
             "calls", "planning peak", "process peak", "x compiled peak"]]
    for spec in specs:
        ts = [r["first_step"] for r in firsts.get(spec, []) if "first_step" in r]
        if not ts:
            rows.append([spec, *["-"] * 10])
            continue
        made = [r["chosen_after"] for r in firsts[spec] if r.get("calls")]
        calls = [r["calls"] for r in firsts[spec] if r.get("calls")]
        ratio = _median(ts) / jit_first
        # Each process's peak against its own plan's compiled peak (plans differ between processes): the worst
        # process, and its planning's peak.
        pairs = [(r["peak_bytes_in_use"], r.get("compiled_peak") or compiled.get(spec), r.get("planning_peak"))
                 for r in firsts[spec] if r.get("peak_bytes_in_use")]
        proc, peak, planning = max(pairs, key=lambda pp: pp[0] / pp[1] if pp[1] else 0, default=(None, None, None))
        rows.append([spec, f"{_median(ts):.2f}", f"{min(ts):.2f}-{max(ts):.2f}", f"{ratio:.2f}",
                     _seconds(cpu(spec)), _seconds(cpu(spec) / cpu("jax:none")),
                     _seconds(_median(made)) if made else "-", str(int(_median(calls))) if calls else "-",
                     fmt_bytes(planning) if planning else "-", fmt_bytes(proc),
                     f"{proc / peak:.3f}" if proc and peak else "-"])
        if spec.startswith("jaxaot:"):
            value = json.loads(spec.split(":", 1)[1])
            (outcome.first_fraction if value <= 1 else outcome.first_budget).append(ratio)
            if value > 1 and proc and peak:
                outcome.process_vs_compiled.append(proc / peak)
    return table(rows) + (f"\n{note}" if note else ""), first


def first_only(model: Model, size: str, rounds: int, outcome: Outcome, budgets_too: bool = True) -> str:
    """First steps alone: ``jit(value_and_grad)``, jaxaot at the fractions and (``budgets_too``) at each
    per-layer policy's peak (each whole-loss policy's where the model has no layers)."""
    args = model.make_args(jax.random.key(0))
    budgets: dict[int, str] = {}
    for name in policies(False) if budgets_too else ():
        spec = f"jax-layer:{name}" if model.per_layer is not None else f"jax:{name}"
        peak = peak_bytes(step_of(model, spec).lower(*args).compile())
        budgets.setdefault(peak, spec)
    specs = ["jax:none", *[f"jaxaot:{json.dumps(b)}" for b in budgets], *[f"jaxaot:{json.dumps(f)}" for f in FRACTIONS]]
    # Each fresh process reports the compiled peak of its own plan: nothing is planned here.
    text, _ = first_step_table(model, size, specs, rounds, {}, outcome)
    where = ", ".join(f"{fmt_bytes(b)} = {s.split(':')[1]}'s" for b, s in budgets.items())
    return f"## {model.name}: {model.label} (first steps; byte budgets: {where or 'none'})\n\n{text}"


def summary(o: Outcome) -> str:
    counts = {v: o.verdicts.count(v) for v in ("met", "within noise", "SLOWER", "OVER", "REFUSED")}
    lines = [f"## summary: {len(o.verdicts)} policy/model pairs", ""]
    if o.verdicts:
        lines += [", ".join(f"{k}: {n}" for k, n in counts.items()),
                  f"JAX programs matched or beaten in both compiled peak and time by a jaxaot program: "
                  f"{o.dominated} of {o.jax_programs}"]
    if o.first_budget:
        lines.append(f"first step / jit(value_and_grad)'s: byte budgets {min(o.first_budget):.2f}-"
                     f"{max(o.first_budget):.2f} (median {_median(o.first_budget):.2f}), fractions "
                     f"{min(o.first_fraction):.2f}-{max(o.first_fraction):.2f}")
    if o.process_vs_compiled:
        lines.append(f"process peak / compiled peak, byte budgets: {min(o.process_vs_compiled):.3f}-"
                     f"{max(o.process_vs_compiled):.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes, the models of SMALL_MODELS")
    ap.add_argument("--only", nargs="*", default=None, help="model names (either size)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--first-rounds", type=int, default=None,
                    help="fresh processes per program for its first step (0: none; default 2, 3 on GPUs)")
    ap.add_argument("--first-only", action="store_true", help="first steps only (no step times, no Pareto)")
    ap.add_argument("--no-budgets", action="store_true", help="with --first-only: jit and the fractions alone")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, help="a directory for each model's Pareto plot (PNG)")
    ap.add_argument("--fresh", nargs=2, metavar=("MODEL", "SPEC"), help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = a.size or ("small" if a.small else "gpu")
    if a.fresh:
        fresh_main(*a.fresh, size)
        return
    raise_on_sigterm()  # stopped by `timeout`, the run still writes what it measured
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    models = all_models(size)
    names = a.only or (list(SMALL_MODELS) if a.small else list(models))
    rounds = a.rounds or (3 if a.small else 9)
    iters = a.iters or (3 if a.small else 5)
    first_rounds = a.first_rounds if a.first_rounds is not None else (2 if a.small else 3)
    outcome = Outcome()

    def each():
        for name in names:
            if time_is_up():
                yield f"## {name}: not run (the time limit came first)"
                continue
            try:
                if a.first_only:
                    yield first_only(models[name], size, first_rounds or 2, outcome, budgets_too=not a.no_budgets)
                else:
                    yield run_model(models[name], size, rounds, iters, first_rounds, a.plot, outcome)
            except TimeUp:
                yield f"## {name}: stopped at the time limit before its tables"
        yield summary(outcome)

    title = (f"bench_budget ({size} sizes, {rounds} interleaved rounds of {iters} steps, {first_rounds} fresh "
             f"processes per first step; byte budget = each JAX policy's compiled peak; first steps in wall time "
             f"and in the process's CPU time, which other work on the machine moves less)")
    report(title, each(), a.out or str(result_path("budget_first" if a.first_only else "budget")))


if __name__ == "__main__":
    main()
