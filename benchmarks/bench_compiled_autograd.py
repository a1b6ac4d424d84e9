"""Compiled autograd against eager JAX, per-step jit of vjp_fn, and a fully jitted step.

Workloads: an MLP, a small transformer block stack (both plain JAX) and a Flax
nnx CNN, each an eager training step ``loss, grads = value_and_grad(loss)(params, batch)``.

Methods, timed per step (median over interleaved rounds; spread = min..max of the round medians;
the sub-millisecond ones over 10x more steps per round):

* ``eager``: ``jax.value_and_grad`` run eagerly (``nnx.value_and_grad`` for the CNN);
* ``jit(vjp_fn)``: eager ``jax.vjp``, then ``jax.jit(vjp_fn)(1.0)``, a new jit each step;
* ``compiled``: ``jaxaot.compiled_value_and_grad`` after one warm-up step (for the CNN, on
  the nnx module itself);
* ``jit(vg)``: ``jax.jit(jax.value_and_grad(loss))``, the bound.

``recompiles`` counts XLA backend compiles during the timed rounds (``jax.monitoring``).

A compiled step is two parts, timed apart: *recording* the forward (Python runs it;
JAX operations are written down, not dispatched) and the cached *executable*, which
computes loss and gradients in one XLA program. The backward line compares that
executable's backward part (``executable - jit(loss)``) with the backward part of the
jitted step (``jit(vg) - jit(loss)``); the executable is timed on the functional loss
(for the CNN too), as ``jit(vg)`` is.

The executable alone is compiled through ``jaxaot.autograd.recorded.step`` (``record``,
``compile_step``), the module the compiled step itself uses; no face exports it.

Usage (from the repository root; CPU: ``--small``)::

    python -m benchmarks.bench_compiled_autograd [--small] [--rounds N] [--steps N] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import jaxaot
from benchmarks.harness import report
from jaxaot.autograd.recorded import step as compiled_step

_COMPILES = [0]


def _on_event(event: str, duration: float, **_: object) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


# --------------------------------------------------------------------------- workloads
def mlp(small: bool):
    sizes = [64, 128, 128, 128, 10] if small else [512, 1024, 1024, 1024, 10]
    keys = jax.random.split(jax.random.key(0), len(sizes) + 2)
    params = [(jax.random.normal(k, (a, b)) / a ** 0.5, jnp.zeros(b)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    x = jax.random.normal(keys[-2], (32 if small else 256, sizes[0]))
    y = jax.random.normal(keys[-1], (x.shape[0], sizes[-1]))

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.gelu(h @ w + b)
        w, b = params[-1]
        return jnp.mean((h @ w + b - y) ** 2)

    return loss, params, (x, y)


def transformer(small: bool):
    d, heads, layers, seq, batch = (32, 4, 2, 16, 4) if small else (256, 8, 4, 128, 16)
    keys = iter(jax.random.split(jax.random.key(1), 8 * layers + 4))
    dense = lambda a, b: jax.random.normal(next(keys), (a, b)) / a ** 0.5
    params = [{"qkv": dense(d, 3 * d), "o": dense(d, d), "up": dense(d, 4 * d), "down": dense(4 * d, d),
               "ln1": jnp.ones(d), "ln2": jnp.ones(d)} for _ in range(layers)]
    x = jax.random.normal(next(keys), (batch, seq, d))
    y = jax.random.normal(next(keys), (batch, seq, d))

    def norm(h, g):
        return g * (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)

    def loss(params, x, y):
        h = x
        for p in params:
            q, k, v = jnp.split(norm(h, p["ln1"]) @ p["qkv"], 3, axis=-1)
            split = lambda t: t.reshape(batch, seq, heads, d // heads)
            att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (d // heads) ** 0.5, -1)
            h = h + jnp.einsum("bhqk,bkhd->bqhd", att, split(v)).reshape(batch, seq, d) @ p["o"]
            h = h + jax.nn.gelu(norm(h, p["ln2"]) @ p["up"]) @ p["down"]
        return jnp.mean((h - y) ** 2)

    return loss, params, (x, y)


def nnx_cnn(small: bool):
    from flax import nnx

    c, size, batch = (8, 16, 8) if small else (64, 32, 64)

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(3, c, (3, 3), rngs=rngs)
            self.c2 = nnx.Conv(c, c, (3, 3), rngs=rngs)
            self.head = nnx.Linear(c, 10, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x))))
            return self.head(h.mean(axis=(1, 2)))

    model = CNN(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (batch, size, size, 3))
    y = jax.nn.one_hot(jnp.arange(batch) % 10, 10)

    def module_loss(model, x, y):
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(model(x)) * y, -1))

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x, y):  # the functional form, for the jit and vjp baselines
        return module_loss(nnx.merge(graphdef, params, rest), x, y)

    return loss, params, (x, y), module_loss, model, nnx.value_and_grad(module_loss)


# --------------------------------------------------------------------------- methods
def methods(loss, params, batch, module=None):
    eager_vg = jax.value_and_grad(loss)
    compiled_vg = jaxaot.compiled_value_and_grad(loss)
    if module is not None:  # the CNN: eager and compiled take the nnx module itself
        module_loss, model, nnx_vg = module
        eager = lambda: nnx_vg(model, *batch)
        compiled_m = jaxaot.compiled_value_and_grad(module_loss)
        compiled = lambda: compiled_m(model, *batch)
    else:
        eager = lambda: eager_vg(params, *batch)
        compiled = lambda: compiled_vg(params, *batch)

    def jit_vjp():
        value, vjp_fn = jax.vjp(lambda p: loss(p, *batch), params)
        return value, jax.jit(vjp_fn)(jnp.ones((), value.dtype))

    jit_vg, jit_fwd = jax.jit(jax.value_and_grad(loss)), jax.jit(loss)
    exe, leaves, args = step_executable(loss, params, batch)
    return {
        "eager": eager, "jit(vjp_fn)": jit_vjp, "compiled": compiled, "jit(vg)": lambda: jit_vg(params, *batch),
        "_executable": lambda: exe(leaves, args), "_jit_fwd": lambda: jit_fwd(params, *batch),
    }


def step_executable(loss, params, batch):
    """The executable ``compiled_value_and_grad`` runs for ``loss`` (recorded and compiled once, here)."""
    leaves, tree = jax.tree_util.tree_flatten((params,))
    recorded = compiled_step.record(lambda p: (loss(p, *batch), None), leaves, tree, eager=False)
    exe = compiled_step.compile_step(recorded.program, recorded.structure.key[2], (), leaves, recorded.args)
    return exe, leaves, recorded.args


#: Sub-millisecond methods, timed over this many times more steps per round (their medians feed differences).
_FAST, _FAST_REPEATS = ("jit(vg)", "_executable", "_jit_fwd"), 10


def time_rounds(fns: dict, rounds: int, steps: int) -> tuple[dict, dict]:
    """Per-method round medians (seconds per step) and backend compiles during the rounds."""
    for fn in fns.values():  # warm-up: compile what compiles once
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    medians = {k: [] for k in fns}
    compiles = {k: 0 for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            before, times = _COMPILES[0], []
            for _ in range(steps * (_FAST_REPEATS if name in _FAST else 1)):
                t = time.perf_counter()
                jax.block_until_ready(fn())
                times.append(time.perf_counter() - t)
            compiles[name] += _COMPILES[0] - before
            medians[name].append(statistics.median(times))
    return medians, compiles


def section(name: str, fns: dict, rounds: int, steps: int) -> str:
    medians, compiles = time_rounds(fns, rounds, steps)
    med = {k: statistics.median(v) for k, v in medians.items()}
    ms = lambda s: f"{s * 1e3:9.3f}"
    lines = [f"## {name}  ({rounds} interleaved rounds x {steps} steps; ms per step, median [min..max of rounds])",
             f"{'method':<14}{'median':>9}  {'spread':<22}{'vs eager':>9}{'recompiles':>11}"]
    for k in ("eager", "jit(vjp_fn)", "compiled", "jit(vg)"):
        spread = f"[{min(medians[k]) * 1e3:.3f}..{max(medians[k]) * 1e3:.3f}]"
        lines.append(f"{k:<14}{ms(med[k])}  {spread:<22}{med['eager'] / med[k]:8.2f}x{compiles[k]:>11}")
    speedup = med["eager"] / med["compiled"]
    lines.append(f"compiled step: recording {ms(max(med['compiled'] - med['_executable'], 0.0))} ms + executable "
                 f"{ms(med['_executable'])} ms (loss and gradients in one program)")
    jit_bwd = max(med["jit(vg)"] - med["_jit_fwd"], 1e-9)
    exe_bwd = max(med["_executable"] - med["_jit_fwd"], 0.0)
    ratio = exe_bwd / jit_bwd
    lines.append(f"backward: compiled step's backward part {ms(exe_bwd)} ms (executable - jit(loss)), jitted step's "
                 f"{ms(jit_bwd)} ms (jit(vg) - jit(loss)); ratio {ratio:.2f}x")
    lines.append(f"targets: compiled >= 5x eager: {'met' if speedup >= 5 else 'NOT met'} ({speedup:.2f}x); "
                 f"steady-state recompiles {compiles['compiled']}; "
                 f"backward within 1.2x: {'met' if ratio <= 1.2 else 'NOT met'} ({ratio:.2f}x)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized models and fewer rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rounds = args.rounds or (5 if args.small else 7)
    steps = args.steps or (5 if args.small else 10)

    def sections():
        for name, build in (("MLP", mlp), ("transformer", transformer)):
            loss, params, batch = build(args.small)
            yield section(name, methods(loss, params, batch), rounds, steps)
        loss, params, batch, module_loss, model, nnx_vg = nnx_cnn(args.small)
        yield section("Flax nnx CNN", methods(loss, params, batch, (module_loss, model, nnx_vg)), rounds, steps)
        s = jaxaot.compiled_autograd.stats()
        yield (f"compiled_autograd.stats(): compiles={s.compiles} hits={s.hits} fallbacks={len(s.fallbacks)}"
               + "".join(f"\n  fallback: {f}" for f in s.fallbacks))

    report("compiled autograd: eager forward, backward compiled once per structure", sections(), args.out)


if __name__ == "__main__":
    main()
