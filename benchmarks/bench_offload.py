"""Offload benchmark: jaxaot's offloading planner against JAX's own offload policies.

The target: at the same device residual bytes, step time at most that of JAX's
offload policies, on the GPT (the 12-layer scanned GPT, and the GPT-2 block) and
the Llama block. Per model, interleaved in one run (as ``bench_planner.py``,
whose programs, timing and verdict this reuses):

* JAX, each under ``jax.checkpoint(loss, policy=...)``:

  - ``offload_dot_with_no_batch_dims`` (device -> pinned host);
  - ``save_and_offload_only_these_names``, the way MaxText's policies use it,
    on the loss with every matmul output named (``dot0``, ``dot1``, ... in
    program order; a scan body's names are the same each iteration):
    *qkv offloaded*: the projections before attention's first batched matmul
    go to host, the other matmuls without batch dimensions are saved;
    *mlp offloaded*: the largest matmul outputs without batch dimensions (the
    MLP's up projections) go to host, the other such matmuls are saved.

* jaxaot: the min-cut with ``offload=True`` (the device measured once,
  ``jaxaot.partition.DeviceModel.measure()``) at budgets 0, 0.5 and 1, and per JAX policy
  the largest budget whose plan keeps at most the policy's device bytes
  (bisection on ``device_saved_bytes``).

Each program runs split (forward, then backward: the residuals exist as arrays
and their device and host bytes are counted from them) and fused (one
executable: ``jax.jit(jax.value_and_grad(checkpoint(loss, policy)))`` against
``jaxaot.value_and_grad`` of the offloading ``aot_function``). Verdict per JAX
policy and mode: the fastest jaxaot budget keeping at most its device bytes,
as the median of the per-round time ratios; ``met`` at most 1.0, ``within
noise`` at most 1.02, else ``MISSED``.

Usage (from the repository root): ``python -m benchmarks.bench_offload [--small] [--only NAME] [--out FILE] [--rounds N]``
(``--small``: CPU sizes; the CPU has no separate host memory, so jaxaot
offloads nothing there unless ``--synthetic-link GBPS`` plans with a made-up
host link, which only checks that the programs run and agree).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

import jaxaot
from benchmarks import models as zoo_models
from benchmarks.bench_partitioners import INPUT_SETS, input_sets
from benchmarks.bench_planner import (Program, check_grads, float_grads, jax_program, jaxaot_programs, matched_budget,
                                      ratios, spread, time_interleaved)
from benchmarks.harness import fmt_bytes, report, table

MODELS = ("llama_block", "gpt2_block_2h", "gpt_scanned", "transformer_block")
BUDGETS = (0.0, 0.5, 1.0)
NOISE = 1.02


# --------------------------------------------------------------------------- named matmuls
def _dots(closed: Any) -> list:
    return [e for e in closed.jaxpr.eqns if e.primitive.name == "dot_general"]


def _batched(eqn: Any) -> bool:
    return bool(eqn.params["dimension_numbers"][1][0])


def _names(closed: Any) -> dict:
    return {e.outvars[0]: f"dot{i}" for i, e in enumerate(_dots(closed))}


def evaluate(closed: Any, args: Sequence[Any], names: dict, scans: dict) -> list:
    """Evaluate the closed jaxpr ``closed`` on ``args`` in the current trace, with ``checkpoint_name(names[v])``
    on each var of ``names`` and the scan eqns of ``scans`` (``id(eqn) -> body``) re-run through ``lax.scan``
    with that body (public JAX only: each eqn is bound as ``jax.core.eval_jaxpr`` binds it)."""
    jaxpr = closed.jaxpr
    env: dict = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, args))

    def read(v: Any) -> Any:
        return v.val if hasattr(v, "val") else env[v]  # a Literal holds its value

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        body = scans.get(id(eqn))
        if body is not None:
            outs = _run_scan(eqn, body, invals)
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) in older JAX, params now
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            outs = eqn.primitive.bind(*subfuns, *invals, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs):
            if type(v).__name__ != "DropVar":
                env[v] = checkpoint_name(x, names[v]) if v in names else x
    return [read(v) for v in jaxpr.outvars]


def _run_scan(eqn: Any, body: Callable, invals: list) -> list:
    """Re-run a scan eqn through ``lax.scan`` with a new ``body(*consts, *carry, *xs)``."""
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]

    def step(carry, x):
        outs = body(*consts, *carry, *x)
        return list(outs[:nk]), list(outs[nk:])

    carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"])
    return [*carry, *ys]


def _scan_bodies(closed: Any) -> dict:
    """``id(scan eqn) -> body function`` evaluating the body with its matmuls named."""
    out = {}
    for e in closed.jaxpr.eqns:
        if e.primitive.name == "scan":
            body = e.params["jaxpr"]
            out[id(e)] = lambda *a, body=body: evaluate(body, a, _names(body), _scan_bodies(body))
    return out


def named_dots(loss: Callable) -> tuple[Callable, list[tuple[str, bool, int]]]:
    """``loss`` with ``checkpoint_name("dot<k>")`` on each matmul's output, and ``(name, batched, bytes)`` per
    matmul (top level and top-level scan bodies, in program order; equal names share one entry)."""
    def named(*args):
        flat, tree = jax.tree_util.tree_flatten(args)
        closed = jax.make_jaxpr(lambda *f: loss(*jax.tree_util.tree_unflatten(tree, f)))(*flat)
        (out,) = evaluate(closed, flat, _names(closed), _scan_bodies(closed))
        return out

    def describe(*args) -> list:
        closed = jax.make_jaxpr(loss)(*args)
        found = {}
        for c in [closed, *[e.params["jaxpr"] for e in closed.jaxpr.eqns if e.primitive.name == "scan"]]:
            for i, e in enumerate(_dots(c)):
                a = e.outvars[0].aval
                found.setdefault(f"dot{i}", (f"dot{i}", _batched(e), a.size * a.dtype.itemsize))
        return list(found.values())

    return named, describe


def name_policies(dots: list[tuple[str, bool, int]]) -> dict[str, tuple[list, list]]:
    """policy name -> (names saved, names offloaded), MaxText-style (module docstring)."""
    plain = [(n, b) for n, batched, b in dots if not batched]
    first_batched = next((i for i, (_, batched, _) in enumerate(dots) if batched), len(dots))
    qkv = [n for n, batched, _ in dots[:first_batched] if not batched]
    biggest = max(b for _, b in plain)
    mlp = [n for n, b in plain if b == biggest]
    out = {}
    if qkv:
        out["qkv_offloaded"] = ([n for n, _ in plain if n not in qkv], qkv)
    out["mlp_offloaded"] = ([n for n, _ in plain if n not in mlp], mlp)
    return out


# --------------------------------------------------------------------------- programs
def fused_jax(name: str, loss: Callable, model: zoo_models.Model, sets: list, policy: Any) -> Program:
    step = jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=policy), argnums=model.argnums))
    return Program(name, "jax-fused", step, None, lambda args: float_grads(step(*args)[1]), sets, None,
                   policy=name)


def fused_jaxaot(split: Program, model: zoo_models.Model, sets: list) -> Program:
    """The fused step of ``split``'s own ``aot_function`` (same trace and partition, one executable)."""
    step = jaxaot.value_and_grad(split.aot, argnums=model.argnums)
    p = Program(split.name + " fused", "jaxaot-fused", step, None, lambda args: float_grads(step(*args)[1]),
                sets, split.device_bytes, split.host_bytes, budget=split.budget)
    p.same_as = split.same_as
    return p


def verdict(policy: Program, budgets: list[Program]) -> tuple[str, str]:
    """The fastest budget keeping at most the policy's device bytes, and how it compares."""
    fits = [(statistics.median(ratios(b.single, policy.single)), b) for b in budgets
            if b.device_bytes is not None and b.device_bytes <= policy.device_bytes]
    if not fits:
        return "MISSED", "no budget keeps as few device bytes"
    r, b = min(fits, key=lambda rb: rb[0])
    v = "met" if r <= 1.0 else ("within noise" if r <= NOISE else "MISSED")
    budgets_ = "/".join(f"{x:.3g}" for x in [b.budget, *b.same_as])
    return v, (f"min-cut {budgets_}: {b.device_bytes / max(policy.device_bytes, 1):.3f}x its device bytes "
               f"(+{fmt_bytes(b.host_bytes)} host) at {r:.3f}x its time")


def bench_model(model: zoo_models.Model, device_model: Any, *, rounds: int, iters: int, summary: list) -> str:
    t0 = time.perf_counter()
    sets = input_sets(model.make_args(jax.random.key(0)), INPUT_SETS)
    named, describe = named_dots(model.loss)
    cp = jax.checkpoint_policies
    policies: dict[str, tuple[Callable, Any]] = {
        "offload_dot_with_no_batch_dims": (model.loss, cp.offload_dot_with_no_batch_dims("device", "pinned_host"))}
    for name, (saved, host) in name_policies(describe(*sets[0])).items():
        policies[name] = (named, cp.save_and_offload_only_these_names(
            names_which_can_be_saved=saved, names_which_can_be_offloaded=host,
            offload_src="device", offload_dst="pinned_host"))
    split_jax, fused_jax_ = [], []
    for name, (loss, pol) in policies.items():
        m = zoo_models.Model(model.name, model.label, loss, model.make_args, model.argnums, model.dtype)
        split_jax.append(jax_program(f"checkpoint({name})", m, sets, pol, name))
        fused_jax_.append(fused_jax(name, loss, m, sets, pol))
        fused_jax_[-1].device_bytes, fused_jax_[-1].host_bytes = split_jax[-1].device_bytes, split_jax[-1].host_bytes
    extra = {}
    joint = jaxaot.partition.trace_joint(model.loss, *sets[0])
    for p in split_jax:
        b = matched_budget(model, sets[0], p.device_bytes, device_model=device_model, joint=joint)
        if b is not None and b not in BUDGETS:
            extra.setdefault(b, p.policy)
    split_aot = jaxaot_programs(model, sets, extra, budgets=BUDGETS, device_model=device_model)
    fused_aot = [fused_jaxaot(p, model, sets) for p in split_aot]
    # Controls: the same budgets planned without offloading, to price what offloading costs.
    plain_split = jaxaot_programs(model, sets, {}, budgets=BUDGETS)
    plain_fused = [fused_jaxaot(p, model, sets) for p in plain_split]
    plain = jax.jit(jax.value_and_grad(model.loss, argnums=model.argnums))
    ref = Program("jit(value_and_grad)", "fused", plain, None, lambda args: float_grads(plain(*args)[1]), sets, None)
    progs = [*split_jax, *split_aot, *plain_split, *fused_jax_, *fused_aot, *plain_fused, ref]
    bad = check_grads(progs, model, sets[0])
    setup = time.perf_counter() - t0
    time_interleaved(progs, rounds=rounds, iters=iters)

    rows = []
    for p in progs:
        byt = "-" if p.device_bytes is None else (
            fmt_bytes(p.device_bytes) + (f" +{fmt_bytes(p.host_bytes)} host" if p.host_bytes else ""))
        label = p.name + (f" (= {', '.join(f'{b:g}' for b in p.same_as)})" if p.same_as else "")
        rows.append((label, byt, f"{statistics.median(p.single) * 1e3:.3f}", spread(ratios(p.single, ref.single))))
    lines = [f"## {model.label}", table([("program", "residuals (device +host)", "step ms", "x jit(v&g) [IQR]"),
                                         *rows]), "", "verdicts (time: median over rounds of paired ratios):"]
    for mode, pols, aots in (("split", split_jax, split_aot), ("fused", fused_jax_, fused_aot)):
        for p in pols:
            v, detail = verdict(p, aots)
            lines.append(f"  {mode:<6} {p.policy:<32} {v:<13} {detail}")
            summary.append((model.name, f"{p.policy} ({mode})", v))
    lines.append("  offloading's price (same budget, time with offload / without; device bytes with / without):")
    for mode, aots, plains in (("split", split_aot, plain_split), ("fused", fused_aot, plain_fused)):
        for p in aots:
            q = next((q for q in plains if p.budget in (q.budget, *q.same_as)), None)
            if q is not None and p.host_bytes:
                lines.append(f"    {mode:<6} budget {p.budget:<6.3g} +{fmt_bytes(p.host_bytes)} host: "
                             f"{spread(ratios(p.single, q.single))}x the time, "
                             f"{p.device_bytes / max(q.device_bytes, 1):.3f}x the device bytes")
    for b in bad:
        lines.append(f"  GRADIENT MISMATCH against jit(value_and_grad): {b}")
    offl = [p for p in split_aot if p.host_bytes]
    lines.append(f"  jaxaot offloaded at {len(offl)} of {len(split_aot)} budgets; setup {setup:.0f} s, "
                 f"total {time.perf_counter() - t0:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--only", help="run only the models whose name contains this")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--synthetic-link", type=float, default=None,
                    help="plan with a made-up host link of this many GB/s (CPU: check the programs only)")
    a = ap.parse_args(argv)
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    device_model = jaxaot.partition.DeviceModel.measure()
    if a.synthetic_link:
        device_model = jaxaot.partition.DeviceModel(host_bandwidth=a.synthetic_link * 1e9, device_flops=device_model.device_flops,
                                          device_bandwidth=device_model.device_bandwidth)
    zoo = zoo_models.zoo("small" if a.small else "gpu")
    summary: list = []

    def sections() -> Iterator[str]:
        yield f"device model: {device_model}"
        for name in MODELS:
            if a.only and a.only not in name:
                continue
            yield bench_model(zoo[name], device_model, rounds=a.rounds, iters=a.iters, summary=summary)
        cols = list(dict.fromkeys(c for _, c, _ in summary))
        models_ = list(dict.fromkeys(m for m, _, _ in summary))
        got = {(m, c): v for m, c, v in summary}
        yield "## verdicts\n" + table([("model", *cols), *[(m, *[got.get((m, c), "-") for c in cols])
                                                           for m in models_]])

    return report("bench_offload: jaxaot's offload planner against JAX's offload policies",
                  sections(), a.out)


if __name__ == "__main__":
    main()
