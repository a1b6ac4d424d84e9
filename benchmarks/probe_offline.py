"""Prototype: a bounded (max_steps=N) checkpointed while loop as nested checkpointed scans.

Every scan has a trip count known at compile time, so the GPU never waits on a
loop predicate; steps past the loop's end are masked (``where``), whole chunks past
it are skipped by ``lax.cond``. Memory: the sum of the level sizes in carries.
A diagnostic for the design, timed against ``lax.scan`` and ``checkpoints=k``.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jaxaot.loops.api import while_loop  # noqa: E402


def levels(n: int, k: int) -> list[int]:
    for depth in range(1, 64):
        c = math.ceil(n ** (1 / depth))
        sizes = [c] * depth
        for i in range(depth):  # shrink while the product still covers n
            while sizes[i] > 1 and math.prod(sizes) // sizes[i] * (sizes[i] - 1) >= n:
                sizes[i] -= 1
        if sum(sizes) <= k:
            return sizes
    raise ValueError


def bounded(cond, body, init, n_max: int, k: int, skip: str = "top", sizes=None, unroll: int = 1,
            safe_input: bool = True, count: bool = True):
    sizes = sizes or levels(n_max, k)
    safe = jax.tree.map(lax.stop_gradient, init)

    def step(state, _):
        x, active, i = state
        live = active & cond(x)
        go = live & (i < n_max) if count else live
        x_in = jax.tree.map(lambda a, s: jnp.where(go, a, s), x, safe) if safe_input else x
        y = body(x_in)
        return (jax.tree.map(lambda a, b: jnp.where(go, a, b), y, x), live, i + go.astype(jnp.int32)), None

    def run(depth, state):
        if depth == len(sizes) - 1:
            return lax.scan(step, state, None, length=sizes[depth], unroll=unroll)[0]
        inner = jax.checkpoint(lambda s: run(depth + 1, s), prevent_cse=False)

        def chunk(s, _):
            if skip == "all" or (skip == "top" and depth == 0):
                return lax.cond(s[1] & cond(s[0]), inner, lambda t: t, s), None
            return inner(s), None
        return lax.scan(chunk, state, None, length=sizes[depth])[0]

    x, active, _ = run(0, (init, jnp.bool_(True), jnp.int32(0)))
    return x


DT = 0.05


def stepf(x, w, b):
    return x + DT * jnp.tanh(x @ w + b)


def main():
    small = "--small" in sys.argv
    batch, width, n, k = (32, 128, 200, 20) if small else (256, 1024, 2000, 40)
    kw, kx = jax.random.split(jax.random.key(0))
    w = jax.random.normal(kw, (width, width), jnp.float32) / width ** 0.5
    b = jnp.zeros((width,), jnp.float32)
    x = jax.random.normal(kx, (batch, width), jnp.float32)
    nn = jnp.int32(n)

    def scan_loss(w, b, x, n_):
        return jnp.sum(lax.scan(lambda c, _: (stepf(c, w, b), None), x, None, length=n)[0] ** 2)

    def ck_loss(w, b, x, n_):
        return jnp.sum(while_loop(lambda c: c[0] < n_, lambda c: (c[0] + 1, stepf(c[1], w, b)),
                                  (jnp.int32(0), x), checkpoints=k)[1] ** 2)

    def off_loss(w, b, x, n_, **kw):
        return jnp.sum(bounded(lambda c: c[0] < n_, lambda c: (c[0] + 1, stepf(c[1], w, b)),
                               (jnp.int32(0), x), n, k, **kw)[1] ** 2)

    g = lambda f, **kw: jax.jit(lambda *a: jax.grad(f, argnums=(0, 1, 2))(*a, **kw))  # noqa: E731
    cases = {"grad lax.scan": g(scan_loss), f"grad checkpoints={k}": g(ck_loss),
             }
    big = (20, 10, 10) if not small else (10, 5, 4)
    eq = (12, 13, 13) if not small else (6, 6, 6)
    cases[f"offline {big} (as built)"] = g(off_loss, sizes=big)
    cases[f"offline {big} no safe input"] = g(off_loss, sizes=big, safe_input=False)
    cases[f"offline {big} no safe input, no count"] = g(off_loss, sizes=big, safe_input=False, count=False)
    cases[f"offline {big} unroll 2"] = g(off_loss, sizes=big, unroll=2)
    cases[f"offline {big} unroll 10"] = g(off_loss, sizes=big, unroll=big[-1])
    cases[f"offline {eq}"] = g(off_loss, sizes=eq)
    cases[f"offline {eq} unroll full"] = g(off_loss, sizes=eq, unroll=eq[-1])
    args = (w, b, x, nn)
    ref = cases["grad lax.scan"](*args)
    comp, mem = {}, {}
    for name, f in cases.items():
        c = f.lower(*args).compile()
        comp[name] = c
        out = c(*args)
        err = max(float(jnp.linalg.norm(a - r) / jnp.linalg.norm(r)) for a, r in zip(out, ref))
        m = c.memory_analysis()
        mem[name] = (m.temp_size_in_bytes / 2**20 if m else float("nan"), err)
    # a shorter run: n = N/4 with the same programs (chunks past the end skipped)
    short = (w, b, x, jnp.int32(n // 4))
    times = {name: [] for name in comp}
    times_short = {name: [] for name in comp}
    for r in range(7):
        for name, c in comp.items():
            for a, t in ((args, times), (short, times_short)):
                t0 = time.perf_counter()
                jax.block_until_ready(c(*a))
                t[name].append(time.perf_counter() - t0)
    base = statistics.median(times["grad lax.scan"])
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, batch {batch} width {width} n {n} k {k}")
    print(f"{'case':44s} {'ms':>8s} {'x scan':>7s} {'spread':>17s} {'ms n/4':>8s} {'temp MiB':>9s} {'rel err':>9s}")
    for name in comp:
        med = statistics.median(times[name])
        print(f"{name:44s} {med * 1e3:8.2f} {med / base:7.2f} {min(times[name]) * 1e3:8.2f}-"
              f"{max(times[name]) * 1e3:8.2f} {statistics.median(times_short[name]) * 1e3:8.2f} "
              f"{mem[name][0]:9.1f} {mem[name][1]:9.1e}")


if __name__ == "__main__":
    main()
