"""Byte-budget benchmark: does ``memory_budget`` = a JAX policy's peak fit that peak, no slower?

For each model (the zoo of ``benchmarks/models.py`` and two models not in it:
an 8-layer Llama by ``lax.scan`` in bf16, and a post-LN ReLU block with 12
heads in float32) and each JAX checkpoint policy P (``dots_saveable``,
``dots_with_no_batch_dims_saveable``, ``nothing_saveable``, and
``offload_dot_with_no_batch_dims`` where the backend has host memory), it
measures P's step, ``jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=P)))``:
its compiled peak (``memory_analysis``) and its time; then jaxaot with
``memory_budget`` = that peak, run as ``jaxaot.value_and_grad`` of the
``aot_function``: the compiled peak of the step it runs
(``lower(...).compile().peak_bytes``) and its time. On a GPU each such pair
also runs in fresh processes (the inputs, planning, then 3 steps) whose
``peak_bytes_in_use`` is read: the memory each process actually needed.

Verdict per (model, P): ``met`` if jaxaot's compiled peak is at most P's and
its time at most P's (the median of per-round ratios), ``within noise`` up to
1.02x, ``SLOWER`` beyond, ``OVER`` if its peak is above P's, ``REFUSED`` if
the planner raised ``MemoryBudgetError`` (its smallest peak is printed).

Per model, a (peak, time) Pareto table of every program: P's, jaxaot at each
matched budget and at the fractions 0, 0.5 and 1, and ``jit(value_and_grad)``;
medians over interleaved rounds, with the min-max; ``*`` marks the Pareto
front. ``--plot DIR`` draws each model's plane with ``jaxaot.viz.plot_pareto``.

Usage (from the repository root): ``python -m benchmarks.bench_budget [--small] [--only NAME ...]
[--rounds N] [--iters N] [--out FILE] [--plot DIR] [--fresh-process on|off|auto]``
(``--small``: CPU sizes and the models of ``SMALL_MODELS``, a few minutes on two cores; ``--only``
picks models of either size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxaot
from benchmarks import models as zoo_models
from benchmarks.bench_partitioners import input_sets
from benchmarks.harness import fmt_bytes, median_time, peak_bytes, report, result_path, table
from benchmarks.models import Draw, Model, layer_norm, rms_norm, rotary

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

    def loss(p, x):
        y, _ = lax.scan(layer, x, p)
        return jnp.mean(y.astype(jnp.float32) ** 2)

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
    return Model("llama_scanned", label, loss, make_args, (0, 1), dtype)


def postln_relu_block(batch: int, seq: int, width: int, heads: int, dtype: Any) -> Model:
    """A post-LN block (BERT's order): non-causal attention with ``heads`` heads, LayerNorm after each
    residual add, a ReLU MLP of width 4x; loss ``mean(y**2)`` in float32."""

    def loss(p, x):
        b, t, d = x.shape
        q, k, v = (a.reshape(b, t, heads, d // heads) for a in jnp.split(x @ p["qkv"], 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.asarray((d // heads) ** 0.5, x.dtype)
        a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
        x = layer_norm(x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, d) @ p["proj"], p["ln1"], p["b1"])
        x = layer_norm(x + jax.nn.relu(x @ p["fc"]) @ p["out"], p["ln2"], p["b2"])
        return jnp.mean(x.astype(jnp.float32) ** 2)

    def make_args(key):
        r = Draw(key)
        p = {"qkv": r.dense((width, 3 * width), dtype), "proj": r.dense((width, width), dtype),
             "ln1": r.near_one(width, dtype), "b1": r.small((width,), dtype),
             "fc": r.dense((width, 4 * width), dtype), "out": r.dense((4 * width, width), dtype, scale=0.5),
             "ln2": r.near_one(width, dtype), "b2": r.small((width,), dtype)}
        return p, r.normal((batch, seq, width), dtype)

    label = f"post-LN ReLU block, {heads} heads ({batch}x{seq}x{width}, {jnp.dtype(dtype).name})"
    return Model("postln_relu_block", label, loss, make_args, (0, 1), dtype)


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
        self.process_peak: int | None = None
        self.also: list[str] = []  # budgets whose plan is this one's
        self._i, self._sets, self._run = 0, sets, run

    def step(self) -> Any:
        self._i = (self._i + 1) % len(self._sets)
        return self._run(*self._sets[self._i])


def jax_step(model: Model, policy: Any) -> Callable[..., Any]:
    loss = model.loss if policy is None else jax.checkpoint(model.loss, policy=policy)
    return jax.jit(jax.value_and_grad(loss, argnums=model.argnums))


def jaxaot_step(model: Model, budget: float | int) -> Callable[..., Any]:
    pf = jaxaot.min_cut_rematerialization_partition(memory_budget=budget)
    return jaxaot.value_and_grad(jaxaot.aot_function(model.loss, partition_fn=pf), argnums=model.argnums)


def jax_program(name: str, model: Model, sets: list[tuple], policy: Any, spec: str) -> Program | None:
    step = jax_step(model, policy)
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
    vg = jaxaot_step(model, budget)
    try:
        low = vg.lower(*sets[0])
    except jaxaot.MemoryBudgetError as err:
        return f"REFUSED (smallest peak {fmt_bytes(err.smallest_peak)})"
    key = f"{low.forward}\n--\n{low.backward}"
    if key in seen:
        seen[key].also.append(name)
        return seen[key]
    jax.block_until_ready(vg(*sets[0]))
    prog = Program(name, "jaxaot", vg, sets, low.compile().peak_bytes, f"jaxaot:{budget!r}")
    seen[key] = prog
    return prog


def time_interleaved(progs: list[Program], rounds: int, iters: int) -> None:
    """Each round, each program in turn: the median of ``iters`` blocked steps."""
    for p in progs:
        median_time(p.step, warmup=2, iters=1, min_seconds=0)
    for _ in range(rounds):
        for p in progs:
            p.times.append(median_time(p.step, warmup=0, iters=iters, min_seconds=0))


# --------------------------------------------------------------------------- the process's peak (GPU)
def fresh_peak(model_name: str, size: str, spec: str) -> int | None:
    """``peak_bytes_in_use`` of a fresh process that builds ``spec``'s step, plans it and runs 3 steps."""
    cmd = [sys.executable, "-m", "benchmarks.bench_budget", "--fresh", model_name, spec, "--size", size]
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # the allocator holds what the step asks
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]).get("peak_bytes_in_use") if r.returncode == 0 and lines else None


def fresh_main(model_name: str, spec: str, size: str) -> None:
    model = all_models(size)[model_name]
    args = model.make_args(jax.random.key(0))
    kind, _, what = spec.partition(":")
    if kind == "jax":
        step = jax_step(model, None if what == "none" else policies(True)[what])
    else:
        step = jaxaot_step(model, json.loads(what) if what[:1].isdigit() else what)
    for _ in range(3):
        jax.block_until_ready(step(*args))
    stats = jax.devices()[0].memory_stats() or {}
    print(json.dumps({"peak_bytes_in_use": stats.get("peak_bytes_in_use")}))


# --------------------------------------------------------------------------- one model
def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _pareto(progs: list[Program]) -> set[int]:
    pts = [(id(p), p.peak, _median(p.times)) for p in progs if p.peak is not None]
    return {i for i, m, t in pts if not any(m2 <= m and t2 <= t and (m2, t2) != (m, t) for _, m2, t2 in pts)}


def run_model(model: Model, size: str, rounds: int, iters: int, fresh: bool, plot: str | None
              ) -> tuple[str, list[str]]:
    """The model's Pareto table and verdict table, and the verdicts."""
    args = model.make_args(jax.random.key(0))
    sets = input_sets(args)
    progs: list[Program] = []
    ref = jax_program("jit(value_and_grad)", model, sets, None, "jax:none")
    progs.append(ref)
    by_policy: dict[str, Program] = {}
    offload = any(m.kind == "pinned_host" for m in jax.devices()[0].addressable_memories())
    for name, pol in policies(offload).items():
        p = jax_program(name, model, sets, pol, f"jax:{name}")
        if p is not None:
            by_policy[name] = p
            progs.append(p)
    seen: dict[str, Program] = {}
    matched: dict[str, Program | str] = {}
    for name, p in by_policy.items():
        matched[name] = jaxaot_program(f"jaxaot at {name}'s peak", model, sets, p.peak, seen)
    for f in FRACTIONS:
        jaxaot_program(f"jaxaot fraction {f:g}", model, sets, f, seen)
    progs += list(seen.values())
    time_interleaved(progs, rounds, iters)
    if fresh:  # each policy and jaxaot at its peak, in a process of its own
        for p in {id(q): q for q in [*by_policy.values(), *matched.values()] if isinstance(q, Program)}.values():
            p.process_peak = fresh_peak(model.name, size, p.spec)
    front = _pareto(progs)
    rows = [["program", "kind", "compiled peak", "process peak", "time (ms)", "min-max", "x jit", "front", "same plan"]]
    for p in sorted(progs, key=lambda p: (p.peak or 0, _median(p.times))):
        t = _median(p.times)
        rows.append([p.name, p.kind, fmt_bytes(p.peak), fmt_bytes(p.process_peak), f"{t * 1e3:.3f}",
                     f"{min(p.times) * 1e3:.3f}-{max(p.times) * 1e3:.3f}", f"{t / _median(ref.times):.3f}",
                     "*" if id(p) in front else "", ", ".join(p.also)])
    verdicts = [["policy", "its peak", "jaxaot peak", "time ratio (min-max)", "verdict"]]
    for name, p in by_policy.items():
        j = matched[name]
        if isinstance(j, str):
            verdicts.append([name, fmt_bytes(p.peak), "-", "-", j])
            continue
        r = [a / b for a, b in zip(j.times, p.times)]
        fits = j.peak is not None and p.peak is not None and j.peak <= p.peak
        verdict = ("OVER" if not fits else "met" if _median(r) <= 1.0 else "within noise" if _median(r) <= NOISE
                   else "SLOWER")
        verdicts.append([name, fmt_bytes(p.peak), fmt_bytes(j.peak), f"{_median(r):.3f} ({min(r):.3f}-{max(r):.3f})",
                         verdict])
    if plot:
        from jaxaot import viz

        os.makedirs(plot, exist_ok=True)
        fig = viz.plot_pareto([(p.name.replace("jaxaot ", ""), p.peak, _median(p.times), p.kind) for p in progs
                               if p.peak is not None], title=model.label)
        fig.savefig(os.path.join(plot, f"budget_{model.name}.png"), dpi=120)
    text = f"## {model.name}: {model.label}\n\n{table(rows)}\n\n{table(verdicts)}"
    return text, [v[-1].split(" (")[0] for v in verdicts[1:]]


def summary(verdicts: list[str]) -> str:
    counts = {v: verdicts.count(v) for v in ("met", "within noise", "SLOWER", "OVER", "REFUSED")}
    return f"## summary: {len(verdicts)} policy/model pairs\n\n" + ", ".join(f"{k}: {n}" for k, n in counts.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes, the models of SMALL_MODELS")
    ap.add_argument("--only", nargs="*", default=None, help="model names (either size)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, help="a directory for each model's Pareto plot (PNG)")
    ap.add_argument("--fresh-process", choices=("on", "off", "auto"), default="auto",
                    help="measure each step's peak_bytes_in_use in a fresh process (auto: on GPUs)")
    ap.add_argument("--fresh", nargs=2, metavar=("MODEL", "SPEC"), help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = a.size or ("small" if a.small else "gpu")
    if a.fresh:
        fresh_main(*a.fresh, size)
        return
    models = all_models(size)
    names = a.only or (list(SMALL_MODELS) if a.small else list(models))
    rounds = a.rounds or (3 if a.small else 9)
    iters = a.iters or (3 if a.small else 5)
    fresh = a.fresh_process == "on" or (a.fresh_process == "auto" and jax.devices()[0].platform != "cpu")
    verdicts: list[str] = []

    def each():
        for name in names:
            text, found = run_model(models[name], size, rounds, iters, fresh, a.plot)
            verdicts.extend(found)
            yield text
        yield summary(verdicts)

    title = (f"bench_budget ({size} sizes, {rounds} interleaved rounds of {iters} steps; byte budget = each JAX "
             f"policy's compiled peak)")
    report(title, each(), a.out or str(result_path("budget")))


if __name__ == "__main__":
    main()
