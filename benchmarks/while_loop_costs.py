"""The while-loop benchmark's cost tables (``python -m benchmarks.bench_while_loop --costs``).

* Steps run: a 40-step loop's ``jit(grad)`` with ``max_steps=N`` for N = 512, 4096, 16384 against
  ``lax.scan(length=40)``: the gradient's time should follow the 40 steps, not N. Each N also runs
  with one stack of N rows (``jaxaot.config.stack_segments = False``, the GPU's choice).
* Small bodies: ``checkpoints=k`` on a 2-element linear ODE of 600 steps, k = 10 and 90, against
  Equinox's ``while_loop(kind="checkpointed")`` (the loop diffrax and optimistix use) in the same run.

Both tables also time ``lax.scan`` with one ``jax.debug.callback``: a bounded loop's overflow check
is one host callback per call, which on a CPU sets the floor of a small gradient's time.

Every variant is compiled first, then timed in interleaved rounds (medians, min-max spread).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxaot
from jaxaot._src.loops import while_loop


def _compiled(fn: Callable, args: tuple, one_stack: bool = False) -> tuple[Any, float]:
    """``(compiled, temporaries MiB)``; ``one_stack`` traces with one stack of max_steps rows."""
    with jaxaot.config.override(**({"stack_segments": False} if one_stack else {})):
        compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    return compiled, compiled.memory_analysis().temp_size_in_bytes / 2**20


def _timed(compiled: dict, args: tuple, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in compiled}
    for _ in range(rounds):
        for name, c in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[name].append(time.perf_counter() - t0)
    return times


def _row(name: str, ts: list[float], base: float, extra: str) -> str:
    t = statistics.median(ts)
    return (f"{name:44s} {t * 1e3:9.3f} {min(ts) * 1e3:7.3f}-{max(ts) * 1e3:<8.3f} {t / base:7.2f} {extra}")


def steps_run_table(rounds: int, batch: int = 16, width: int = 64, steps: int = 40,
                    bounds: tuple[int, ...] = (512, 4096, 16384)) -> list[str]:
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w, b = jax.random.normal(k[0], (width, width)) / jnp.sqrt(width), jax.random.normal(k[1], (width,)) * 0.1
    x = jax.random.normal(k[2], (batch, width))

    def step(c):
        return c + 0.05 * jnp.tanh(c @ w + b)

    def loss(x, n, bound):
        out = while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1])), (0, x), max_steps=bound)
        return jnp.sum(out[1] ** 2)

    args = (x, jnp.int32(steps))

    def scan_grad(x):
        return jax.grad(lambda x: jnp.sum(lax.scan(lambda c, _: (step(c), None), x, None, length=steps)[0] ** 2))(x)

    built = {f"lax.scan(length={steps})": _compiled(lambda x, n: scan_grad(x), args)}
    # the floor of a bounded loop's gradient here: its overflow check is one host callback per call
    built["lax.scan + one jax.debug.callback"] = _compiled(
        lambda x, n: (jax.debug.callback(lambda v: None, n), scan_grad(x))[1], args)
    for bound in bounds:
        built[f"jaxaot max_steps={bound}"] = _compiled(lambda x, n, bound=bound: jax.grad(loss)(x, n, bound), args)
        built[f"jaxaot max_steps={bound}, one stack"] = _compiled(lambda x, n, bound=bound: jax.grad(loss)(x, n, bound),
                                                                  args, one_stack=True)
    times = _timed({name: c for name, (c, _) in built.items()}, args, rounds)
    base = statistics.median(times[f"lax.scan(length={steps})"])
    lines = [f"# steps run: jit(grad) of a {steps}-step loop (x <- x + 0.05 tanh(x W + b), batch {batch}, "
             f"width {width}) with max_steps=N; 'one stack': N rows stacked (no CPU segments)",
             f"{'variant':44s} {'grad ms':>9s} {'spread ms':>16s} {'x scan':>7s} {'temp MiB':>9s}"]
    lines += [_row(name, times[name], base, f"{mib:9.2f}") for name, (_, mib) in built.items()]
    segmented = [statistics.median(times[f"jaxaot max_steps={bound}"]) for bound in bounds]
    lines.append(f"# max_steps from {bounds[0]} to {bounds[-1]}: the gradient's time varies "
                 f"{max(segmented) / min(segmented):.2f}x; medians of {rounds} interleaved rounds")
    return lines


def small_body_table(rounds: int, steps: int = 600, ks: tuple[int, ...] = (10, 90)) -> list[str]:
    a = jnp.array([[0.0, 1.0], [-1.0, -0.1]])

    def step(x, p):
        return x + 0.01 * (a @ x) * p

    def loss(p, x, **kw):
        return jnp.sum(while_loop(lambda c: c[0] < steps, lambda c: (c[0] + 1, step(c[1], p)), (0, x), **kw)[1])

    def loss_equinox(p, x, k):
        import equinox as eqx
        return jnp.sum(eqx.internal.while_loop(lambda c: c[0] < steps, lambda c: (c[0] + 1, step(c[1], p)), (0, x),
                                               kind="checkpointed", checkpoints=k, max_steps=None)[1])

    args = (jnp.float32(1.0), jnp.array([1.0, 0.0]))
    fns = {f"lax.scan(length={steps})": lambda p, x: jax.grad(
        lambda p: jnp.sum(lax.scan(lambda c, _: (step(c, p), None), x, None, length=steps)[0]))(p)}
    fns["lax.scan + one jax.debug.callback"] = lambda p, x: (jax.debug.callback(lambda v: None, p),
                                                              fns[f"lax.scan(length={steps})"](p, x))[1]
    for k in ks:
        fns[f"jaxaot checkpoints={k}"] = lambda p, x, k=k: jax.grad(loss)(p, x, checkpoints=k)
        fns[f"jaxaot max_steps={steps}, checkpoints={k}"] = lambda p, x, k=k: jax.grad(loss)(
            p, x, max_steps=steps, checkpoints=k)
        fns[f"equinox checkpointed, k={k}"] = lambda p, x, k=k: jax.grad(loss_equinox)(p, x, k)
    built = {name: _compiled(fn, args) for name, fn in fns.items()}
    times = _timed({name: c for name, (c, _) in built.items()}, args, rounds)
    base = statistics.median(times[f"lax.scan(length={steps})"])
    lines = [f"# small body: a 2-element linear ODE, {steps} steps, jit(grad) against Equinox's checkpointed loop",
             f"{'variant':44s} {'grad ms':>9s} {'spread ms':>16s} {'x scan':>7s} {'x equinox':>9s}"]
    for name in built:
        k = next((k for k in ks if name.endswith(f"={k}")), None)
        ref = statistics.median(times[f"equinox checkpointed, k={k}"]) if k else float("nan")
        lines.append(_row(name, times[name], base, f"{statistics.median(times[name]) / ref:9.2f}"))
    lines.append(f"# medians of {rounds} interleaved rounds")
    return lines
