"""Reverse-mode gradient of a while loop: jaxaot's memory modes against lax.scan and equinox.

A tanh-MLP ODE, ``x <- x + dt * tanh(x @ W + b)``, run for a trip count that is a
run-time value (batch 256, width 1024, 2000 steps by default). For each variant
it times ``jit(grad(loss))`` (median of several runs) and reads the compiled
program's memory use from ``compiled.memory_analysis()``; ratios are against
``lax.scan`` with the length known at trace time, the ideal. equinox's
checkpointed and bounded while loops are included when equinox is importable.
The variants are compiled first and then timed in interleaved rounds (medians,
min-max spread). A second table gives compile time and StableHLO size of a
``checkpoints=k`` gradient against k.

``--costs`` runs the cost tables of :mod:`benchmarks.while_loop_costs` instead: a 40-step loop's
gradient against ``max_steps`` (the time must follow the steps run), and ``checkpoints=k`` on a
small body against Equinox's checkpointed loop.

``--long`` runs the long-loop table instead: 10,000 and 100,000 steps with the
offline schedule's snapshots in host memory (``checkpoint_memory="host"``)
against the same schedule on the device and, where it fits, ``lax.scan``;
device and host bytes come from the compiled programs' memory analysis, and the
allocator's peak is read after each host-memory run (it must not grow with n).

The revolve counts and the offline schedules' level sizes come from ``jaxaot._src.loops.revolve`` and
``jaxaot._src.loops.offline`` (the schedules the loops run; the loops face exports the loop itself);
the online schedule's block size (steps per predicate check) from ``jaxaot._src.loops.checkpointed``.
The table's last column is each variant's first gradient (lowering, compiling, one run).

The compile table puts the offline mode (``max_steps=N, checkpoints=k``, k = 3, 10, 40) next to
``max_steps=N`` alone on the same loop, for the ODE's small body and for a large one
(:func:`large_step`, about 400 eqns): the first gradient (tracing, lowering, compiling, one run)
and the compile alone, medians of fresh compiles (``jax.clear_caches()`` and the offline
schedule's trace-time tables cleared between), round robin over the variants, and each one's
ratio to ``max_steps``'s.

Usage (from the repository root)::

    python -m benchmarks.bench_while_loop            # the GPU benchmark
    python -m benchmarks.bench_while_loop --small    # a quick CPU run, written to benchmarks/results/
    python -m benchmarks.bench_while_loop --long     # 100,000 steps, host-memory snapshots (GPU)
    python -m benchmarks.bench_while_loop --costs    # steps run and small bodies (CPU), to benchmarks/results/
    python -m benchmarks.bench_while_loop --compile-only --small   # the compile table alone
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.harness import result_path
from jaxaot._src.loops import checkpointed, dynamic_capacity, offline, revolve, schedule_tables, while_loop

plan, plan_host = offline.plan, offline.plan_host
revolve_counts, worst_ratio = revolve.revolve_counts, revolve.worst_ratio

DT = 0.05


def step(x, w, b):
    return x + DT * jnp.tanh(x @ w + b)


def large_step(x, w, b):
    """A larger body: three matmuls of the carry, each followed by a chain of elementwise ops on the
    rows' means (about 400 eqns): cheap to run, long to compile, as a small physics step is."""
    for j in range(w.shape[0]):
        h = jnp.tanh(x @ w[j] + b)
        s = jnp.mean(h, axis=1)
        for i in range(16):
            s = s + 0.01 * jnp.sin(s * (1.0 + 0.1 * i)) - 0.001 * s * s * s
        x = x + DT * (h * s[:, None] - x)
    return x


def loss_scan(w, b, x, n_static: int, step_fn: Callable = step):
    return jnp.sum(lax.scan(lambda c, _: (step_fn(c, w, b), None), x, None, length=n_static)[0] ** 2)


def loss_jaxaot(w, b, x, n, step_fn: Callable = step, **kw):
    out = while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step_fn(c[1], w, b)), (jnp.int32(0), x), **kw)
    return jnp.sum(out[1] ** 2)


def loss_equinox(w, b, x, n, kind: str, max_steps: int, checkpoints: int | None):
    import equinox as eqx

    out = eqx.internal.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], w, b)), (jnp.int32(0), x),
                                  kind=kind, max_steps=max_steps, checkpoints=checkpoints)
    return jnp.sum(out[1] ** 2)


def variants(steps: int, k: int) -> dict[str, Callable[..., Any]]:
    capacity = 1 << (steps - 1).bit_length()  # what the runtime's doubling would settle on

    def dynamic(w, b, x, n):
        with dynamic_capacity(capacity):
            return jax.grad(loss_jaxaot, argnums=(0, 1, 2))(w, b, x, n)

    out = {
        "lax.scan (known length)": lambda w, b, x, n: jax.grad(loss_scan, argnums=(0, 1, 2))(w, b, x, steps),
        f"jaxaot max_steps={steps}": lambda w, b, x, n: jax.grad(loss_jaxaot, argnums=(0, 1, 2))(
            w, b, x, n, max_steps=steps),
        f"jaxaot checkpoints={k}": lambda w, b, x, n: jax.grad(loss_jaxaot, argnums=(0, 1, 2))(
            w, b, x, n, checkpoints=k),
        f"jaxaot dynamic capacity={capacity}": dynamic,
        f"jaxaot max_steps={steps} checkpoints={k} (offline)": lambda w, b, x, n: jax.grad(
            loss_jaxaot, argnums=(0, 1, 2))(w, b, x, n, max_steps=steps, checkpoints=k),
    }
    if plan(steps, k * 3 // 5) is not None:  # less memory: compare its temp MiB with checkpoints=k's
        out[f"jaxaot max_steps={steps} checkpoints={k * 3 // 5} (offline)"] = lambda w, b, x, n: jax.grad(
            loss_jaxaot, argnums=(0, 1, 2))(w, b, x, n, max_steps=steps, checkpoints=k * 3 // 5)
    try:
        import equinox  # noqa: F401
    except ImportError:
        return out
    out[f"equinox checkpointed k={k}"] = lambda w, b, x, n: jax.grad(loss_equinox, argnums=(0, 1, 2))(
        w, b, x, n, "checkpointed", None, k)
    out[f"equinox bounded max_steps={steps}"] = lambda w, b, x, n: jax.grad(loss_equinox, argnums=(0, 1, 2))(
        w, b, x, n, "bounded", steps, None)
    return out


def _peak_bytes(compiled: Any) -> tuple[float, float]:
    """(temporaries, temporaries + arguments + outputs) in MiB, if the backend says."""
    try:
        m = compiled.memory_analysis()
        temp = m.temp_size_in_bytes
        total = temp + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
        return temp / 2**20, total / 2**20
    except Exception:  # pragma: no cover - not every backend reports memory
        return float("nan"), float("nan")


def compile_variant(fn: Callable, args: tuple) -> tuple[Any, Any, float]:
    """``(compiled, outputs, first-gradient seconds)``: lowering, compiling and the first run."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    out = jax.block_until_ready(compiled(*args))  # warm-up
    return compiled, out, time.perf_counter() - t0


def interleaved_times(compiled: dict[str, Any], args: tuple, repeats: int) -> dict[str, list[float]]:
    """Round-robin timing: every variant runs once per round, so drift in the
    machine's speed (clocks, other jobs) spreads over all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in compiled}
    for _ in range(repeats):
        for name, c in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[name].append(time.perf_counter() - t0)
    return times


def program_size_vs_k(ks: list[int], steps: int = 20) -> list[str]:
    """First-call compile time and StableHLO size of ``grad`` of a scalar
    ``checkpoints=k`` loop, for each k (the target: flat in k)."""
    lines = [f"# compile time and program size of grad(checkpoints=k), a {steps}-step scalar loop",
             f"{'k':>6s} {'lower+compile s':>16s} {'StableHLO chars':>16s}"]
    for k in ks:
        f = jax.grad(lambda x, k=k: while_loop(lambda c: c[0] < steps, lambda c: (c[0] + 1, jnp.sin(c[1])),
                                               (0, x), checkpoints=k)[1])
        t0 = time.perf_counter()
        lowered = jax.jit(f).lower(1.0)
        text = lowered.as_text()
        lowered.compile()
        lines.append(f"{k:6d} {time.perf_counter() - t0:16.2f} {len(text):16d}")
    return lines


def _first_gradient(fn: Callable, args: tuple) -> tuple[float, float]:
    """``(first gradient s, compile s)`` of ``jit(fn)`` from cold caches: tracing, lowering,
    compiling and one run, and the compile alone."""
    jax.clear_caches()
    for table in (schedule_tables.stored_steps, schedule_tables.split_points, schedule_tables.split_table):
        table.cache_clear()  # the offline schedule's trace-time tables count as tracing
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t0, t2 - t1


def compile_vs_max_steps(lengths: list[int], ks: list[int], repeats: int, batch: int, width: int,
                         large_lengths: list[int]) -> list[str]:
    """The first gradient of ``max_steps=N, checkpoints=k`` against ``max_steps=N`` alone on the same
    loop (the trip count N - 3, a run-time value), for the ODE's body and :func:`large_step`."""
    keys = jax.random.split(jax.random.PRNGKey(2), 5)
    bodies = {
        "small": (step, jax.random.normal(keys[0], (width, width)) / jnp.sqrt(width),
                  jax.random.normal(keys[1], (width,)) * 0.1, jax.random.normal(keys[2], (batch, width)), lengths),
        "large": (large_step, jax.random.normal(keys[3], (3, 64, 64)) / 8, jnp.zeros((64,)) + 0.1,
                  jax.random.normal(keys[4], (64, 64)), large_lengths),
    }
    lines = [f"# first gradient (tracing, lowering, compiling, one run) and compile alone, against max_steps=N "
             f"alone; medians of {repeats} fresh compiles, round robin",
             f"# small: the ODE above, batch {batch}, width {width}; large: large_step, a 64x64 carry, "
             f"{_eqns(large_step, bodies['large'])} eqns; trip count N - 3",
             f"{'body':6s} {'N':>5s} {'variant':30s} {'schedule':>16s} {'first s':>8s} {'x max_steps':>11s} "
             f"{'compile s':>9s} {'x max_steps':>11s}"]
    for name, (fn, w, b, x, ns) in bodies.items():
        for n in ns:
            grad = jax.grad(functools.partial(loss_jaxaot, step_fn=fn), argnums=(0, 1, 2))
            variants = {f"max_steps={n}": dict(max_steps=n)}
            variants.update({f"max_steps={n} checkpoints={k}": dict(max_steps=n, checkpoints=k) for k in ks})
            times: dict[str, list] = {v: [] for v in variants}
            args = (w, b, x, jnp.int32(n - 3))
            for _ in range(repeats):
                for v, kw in variants.items():
                    times[v].append(_first_gradient(lambda w, b, x, m, kw=kw: grad(w, b, x, m, **kw), args))
            base = [statistics.median(t[i] for t in times[f"max_steps={n}"]) for i in (0, 1)]
            for v, kw in variants.items():
                first, comp = (statistics.median(t[i] for t in times[v]) for i in (0, 1))
                lines.append(f"{name:6s} {n:5d} {v:30s} {_schedule(kw):>16s} {first:8.2f} {first / base[0]:11.2f} "
                             f"{comp:9.2f} {comp / base[1]:11.2f}")
    return lines


def _eqns(fn: Callable, body: tuple) -> int:
    return len(jax.make_jaxpr(fn)(body[3], body[1], body[2]).jaxpr.eqns)


def _schedule(kw: dict) -> str:
    """The reverse mode a variant runs here: the stack, nested scans (their plan) or the binomial schedule."""
    if "checkpoints" not in kw:
        return "stack"
    sizes = plan(kw["max_steps"], kw["checkpoints"])
    if sizes is not None and offline.schedule() == "nested":
        return "nested " + "x".join(map(str, sizes))
    return "binomial"


def per_evaluation(times: dict, base: float, steps: int, k: int) -> list[str]:
    """Time per body evaluation against scan's (scan: n forward + n VJPs), and the floor a
    run-time trip count sets on the GPU: one predicate read per while-loop iteration."""
    counts = revolve_counts(steps, k, block=checkpointed.online_block())
    online = (counts.forward + counts.vjps,
              f"revolve forward + VJPs, blocks of {counts.block}, {counts.checks} predicate checks")
    sizes = plan(steps, k)
    binomial = ("no nested plan fits: the bounded " if sizes is None else "the bounded binomial schedule: ") + online[1]
    evals = {f"jaxaot checkpoints={k}": online,
             f"jaxaot max_steps={steps} checkpoints={k} (offline)":
                 ((len(sizes) + 1) * steps, f"{len(sizes)} forward + 1 VJP per step, plan {sizes}")
                 if sizes and offline.schedule() == "nested" else (online[0], binomial)}
    lines = ["", "# cost per body evaluation, against lax.scan's (2 x steps evaluations)"]
    for name, (n_eval, what) in evals.items():
        if name in times:
            t = statistics.median(times[name])
            lines.append(f"{name:40s} {n_eval:6d} evaluations ({what}): {t / n_eval / (base / (2 * steps)):.2f}x")
    empty = jax.jit(lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 1.0),
                                             (jnp.int32(0), jnp.float32(0)))[1])
    jax.block_until_ready(empty(jnp.int32(steps)))
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(empty(jnp.int32(steps)))
        ts.append(time.perf_counter() - t0)
    lines.append(f"# a run-time trip count's floor: lax.while_loop with an empty body, "
                 f"{statistics.median(ts) / steps * 1e6:.2f} us per iteration")
    return lines


def header() -> str:
    dev = jax.devices()[0]
    return (f"# while_loop reverse-mode benchmark, {datetime.datetime.now().isoformat(timespec='seconds')}\n"
            f"# machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs), "
            f"device: {dev.platform} {getattr(dev, 'device_kind', '')}\n"
            f"# jax {jax.__version__}, python {platform.python_version()}\n")


def run(batch: int, width: int, steps: int, k: int, repeats: int, ks: list[int]) -> str:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    w = jax.random.normal(keys[0], (width, width)) / jnp.sqrt(width)
    b = jax.random.normal(keys[1], (width,)) * 0.1
    x = jax.random.normal(keys[2], (batch, width))
    args = (w, b, x, jnp.int32(steps))
    lines = [header(), f"# batch {batch}, width {width}, steps {steps} (a run-time trip count), checkpoints {k}\n",
             f"{'variant':48s} {'grad ms':>10s} {'x scan':>8s} {'temp MiB':>10s} {'total MiB':>10s} {'rel err':>10s}"]
    compiled, outs, failed, first = {}, {}, [], {}
    for name, fn in variants(steps, k).items():
        try:
            compiled[name], outs[name], first[name] = compile_variant(fn, args)
        except Exception as err:  # keep the table going; say why a variant is missing
            failed.append(f"{name:40s} failed: {type(err).__name__}: {str(err)[:80]}")
    times = interleaved_times(compiled, args, repeats)
    base = statistics.median(times["lax.scan (known length)"])
    ref = outs["lax.scan (known length)"]
    lines[-1] += f" {'spread ms':>12s} {'first s':>8s}"
    for name, c in compiled.items():
        t = statistics.median(times[name])
        temp, total = _peak_bytes(c)
        # relative: gradients of a 2000-step ODE loop are large, so absolute errors mislead
        err = max(float(jnp.linalg.norm((a - r).ravel()) / (jnp.linalg.norm(r.ravel()) + 1e-30))
                  for a, r in zip(outs[name], ref))
        spread = f"{min(times[name]) * 1e3:.2f}-{max(times[name]) * 1e3:.2f}"
        lines.append(f"{name:48s} {t * 1e3:10.2f} {t / base:8.2f} {temp:10.1f} {total:10.1f} {err:10.2e} {spread:>12s}"
                     f" {first[name]:8.2f}")
    lines += failed
    lines.append(f"# medians of {repeats} interleaved rounds; spread: min-max; first s: the first gradient "
                 f"(lowering, compiling, one run)")
    lines += per_evaluation(times, base, steps, k)
    lines.append("")
    lines += program_size_vs_k(ks)
    lines.append("")
    lines.append("# revolve counts: forward body evaluations (VJPs not counted) vs the optimum r*n - C(k+r, r-1)")
    for n, kk in ((steps, k), (1000, 10)):
        for block in sorted({1, checkpointed.online_block()}):
            c = revolve_counts(n, kk, block=block)
            lines.append(f"n={n:5d} k={kk:3d} block={block}: forward {c.forward:7d}  optimum {c.optimum:7d}  "
                         f"ratio {c.ratio:.3f}  (+{c.vjps} VJPs: {c.forward + c.vjps} body evaluations in all; "
                         f"{c.checks} predicate checks)")
    # The forward does not know n: the worst trip count matters, not one lucky n.
    for kk in sorted({2, 10, 40, k}):
        worst, n_worst = worst_ratio(kk, first=100, last=3000)
        lines.append(f"k={kk:3d}, every n in 100..3000: worst ratio {worst:.3f} (at n={n_worst})")
    return "\n".join(lines) + "\n"


def _memory(compiled: Any) -> tuple[float, float]:
    """(device temporaries, host temporaries) of a compiled program, in MiB."""
    m = compiled.memory_analysis()
    return m.temp_size_in_bytes / 2**20, getattr(m, "host_temp_size_in_bytes", 0) / 2**20


def _host_shapes(compiled: Any) -> int:
    """Shapes in the optimized HLO laid out in host memory (XLA's memory space 5)."""
    try:
        return compiled.as_text().count("S(5)")
    except Exception:  # pragma: no cover - not every backend prints HLO
        return -1


def _allocator_peak() -> float:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use", float("nan")) / 2**20


def damped_step(x, w, b):
    """A contracting ODE step: 10,000-step trajectories stay comparable across programs (the
    undamped one is chaotic over that many steps, so rounding differences grow to O(1))."""
    return x + DT * (jnp.tanh(x @ w + b) - x)


def long_run(batch: int, width: int, lengths: list[int], k: int, repeats: int, scan_limit: int) -> str:
    """The long-loop table: host-memory snapshots against the device schedule and lax.scan,
    on the damped ODE (:func:`damped_step`)."""
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    w = jax.random.normal(keys[0], (width, width)) / jnp.sqrt(width)
    b = jax.random.normal(keys[1], (width,)) * 0.1
    x = jax.random.normal(keys[2], (batch, width))
    carry_mib = batch * width * 4 / 2**20
    lines = [header(), f"# long loops: x <- x + dt (tanh(x W + b) - x), batch {batch}, width {width} "
             f"(carry {carry_mib:.1f} MiB), k={k} snapshots",
             f"{'n':>7s} {'variant':34s} {'plan':>16s} {'compile s':>9s} {'grad ms':>10s} {'spread ms':>17s} "
             f"{'dev temp MiB':>12s} {'host MiB':>9s} {'S(5)':>5s} {'alloc peak MiB':>14s} {'rel err':>9s}"]
    grad = jax.grad(functools.partial(loss_jaxaot, step_fn=damped_step), argnums=(0, 1, 2))
    grad_scan = jax.grad(functools.partial(loss_scan, step_fn=damped_step), argnums=(0, 1, 2))
    host_name = "jaxaot offline, host snapshots"

    def variants_for(n: int) -> dict:
        fns = {host_name: (lambda w, b, x, m: grad(w, b, x, m, max_steps=n, checkpoints=k, checkpoint_memory="host"),
                           plan_host(n, k)),
               "jaxaot offline, device snapshots": (lambda w, b, x, m: grad(w, b, x, m, max_steps=n, checkpoints=k),
                                                    plan(n, k))}
        if n <= scan_limit:
            fns["lax.scan (known length)"] = (
                lambda w, b, x, m: grad_scan(w, b, x, n), (n,))
        return fns

    def build(n: int, name: str, fn: Callable, sizes: Any, done: dict) -> None:
        t0 = time.perf_counter()
        try:
            c, out, _ = compile_variant(fn, (w, b, x, jnp.int32(n)))
        except Exception as err:  # keep the table going; say why a variant is missing
            lines.append(f"{n:7d} {name:34s} failed: {type(err).__name__}: {str(err)[:100]}")
            return
        done[name] = (c, out, sizes, time.perf_counter() - t0, _allocator_peak())

    # Host-snapshot programs first, shortest loop first: the allocator's peak only grows, so a
    # flat peak across their rows shows device memory that does not grow with n.
    built: dict[int, dict] = {n: {} for n in lengths}
    for n in lengths:
        fn, sizes = variants_for(n)[host_name]
        build(n, host_name, fn, sizes, built[n])
    for n in lengths:
        for name, (fn, sizes) in variants_for(n).items():
            if name != host_name:
                build(n, name, fn, sizes, built[n])
        done = built[n]
        if not done:
            continue
        times = interleaved_times({name: v[0] for name, v in done.items()}, (w, b, x, jnp.int32(n)), repeats)
        ref = done.get("lax.scan (known length)", next(iter(done.values())))[1]
        for name, (c, out, sizes, t_compile, peak) in done.items():
            t = statistics.median(times[name])
            temp, host = _memory(c)
            err = max(float(jnp.linalg.norm((a - r).ravel()) / (jnp.linalg.norm(r.ravel()) + 1e-30))
                      for a, r in zip(out, ref))
            spread = f"{min(times[name]) * 1e3:.1f}-{max(times[name]) * 1e3:.1f}"
            lines.append(f"{n:7d} {name:34s} {str(sizes):>16s} {t_compile:9.1f} {t * 1e3:10.1f} {spread:>17s} "
                         f"{temp:12.1f} {host:9.1f} {_host_shapes(c):5d} {peak:14.1f} {err:9.2e}")
    lines.append(f"# medians of {repeats} interleaved rounds per n; rel err against lax.scan where it ran, else "
                 f"against the first row; alloc peak: the allocator's peak so far, read after each compile+first run "
                 f"(host-snapshot rows are built first); "
                 f"S(5): shapes the optimized HLO places in host memory")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="quick CPU sizes; writes benchmarks/results/")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--checkpoints", type=int, default=None, help="k (default 40; 1000 with --long)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ks", default="2,10,100,1000", help="k values of the program-size table")
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--long", action="store_true", help="the long-loop table (host-memory snapshots)")
    p.add_argument("--lengths", default="10000,100000", help="trip counts of the long-loop table")
    p.add_argument("--scan-limit", type=int, default=10000, help="longest loop lax.scan runs in --long")
    p.add_argument("--compile-lengths", default="300,2000", help="N of the compile table, the ODE's body")
    p.add_argument("--compile-large-lengths", default="300,1000", help="N of the compile table, large_step")
    p.add_argument("--compile-ks", default="3,10,40", help="k of the compile table's offline rows")
    p.add_argument("--compile-repeats", type=int, default=3, help="fresh compiles per variant (medians)")
    p.add_argument("--compile-only", action="store_true", help="the compile table alone")
    p.add_argument("--costs", action="store_true", help="the cost tables: steps run, small bodies")
    a = p.parse_args(argv)

    def compile_table() -> list[str]:
        return compile_vs_max_steps([int(v) for v in a.compile_lengths.split(",")],
                                    [int(v) for v in a.compile_ks.split(",")], a.compile_repeats, a.batch, a.width,
                                    [int(v) for v in a.compile_large_lengths.split(",")])

    def emit(text: str, final: bool = True) -> None:
        """Print ``text`` (when ``final``) and write it where it goes: a run cut short keeps its finished tables."""
        if final:
            print(text)
        out = a.out or (str(result_path("while_loop")) if a.small else None)
        if out:
            os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
            with open(out, "w") as f:
                f.write(text)

    if a.costs:
        from benchmarks import while_loop_costs

        rounds = max(a.repeats, 30)
        a.out = a.out or str(result_path("while_loop_costs"))
        a.small = False
        emit(header() + "\n".join([*while_loop_costs.steps_run_table(rounds), "",
                                    *while_loop_costs.small_body_table(rounds)]) + "\n")
    elif a.long:
        if a.small:
            a.batch, a.width = 16, 64
            a.out = a.out or str(result_path("while_loop_long"))
        a.small = False
        emit(long_run(a.batch, a.width, [int(v) for v in a.lengths.split(",")], a.checkpoints or 1000, a.repeats,
                      a.scan_limit))
    elif a.compile_only:
        if a.small:
            a.batch, a.width = 16, 64
        a.small = False  # written only with --out
        emit(header() + "\n".join(compile_table()) + "\n")
    else:
        if a.small:
            a.batch, a.width, a.steps, a.checkpoints, a.repeats, a.ks = 16, 64, 200, 16, 5, "2,10,100"
        text = run(a.batch, a.width, a.steps, a.checkpoints or 40, a.repeats, [int(v) for v in a.ks.split(",")])
        print(text, flush=True)
        emit(text, final=False)
        emit(text + "\n" + "\n".join(compile_table()) + "\n")

if __name__ == "__main__":
    main()
