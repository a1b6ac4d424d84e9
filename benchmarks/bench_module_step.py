"""An eager Flax nnx training step through ``aot_module`` against the same step under ``nnx.jit``.

Per model, one eager training loop ``loss, grads = value_and_grad(loss_fn)(model, x, y);
optimizer.update(model, grads)`` (optax adam), in these variants:

* ``nnx.jit``: the whole step under ``nnx.jit`` (the reference of the first ratio);
* ``nnx.jit cached``: the same, through ``nnx.cached_partial`` (Flax's own overhead cut, the
  reference of the second ratio: the bar for the eager step);
* ``eager nnx``: plain Flax, eager ``nnx.value_and_grad`` and eager update;
* ``aot + nnx.vg``: ``aot_module``, eager ``nnx.value_and_grad`` (JAX's eager autodiff around it);
* ``aot + jaxaot.vg``: ``aot_module``, ``jaxaot.value_and_grad`` (one compiled step), eager update;
* ``aot + jaxaot.vg + jit upd``: the same, the update under ``nnx.cached_partial(nnx.jit(...))``;
* ``aot + jaxaot.vg + jaxaot opt``: the same, the optimizer a ``jaxaot._src.nn.Optimizer`` (the eager step);
* ``aot + nnx.vg + jaxaot opt``: ``nnx.value_and_grad`` with a ``jaxaot._src.nn.Optimizer``;
* ``aot + patched nnx.vg + jaxaot opt``: the same inside ``jaxaot.patch_value_and_grad()``;
* ``jaxaot.vg alone``: the loss and gradients only, no update.

Models vary norms, activations and dtypes: an MLP (BatchNorm, dropout, ReLU, f32), a pre-norm
transformer (RMSNorm, GELU, bf16 activations), a CNN (BatchNorm, SiLU), an MLP-Mixer (LayerNorm,
tanh, bf16 parameters) and a residual CNN (GroupNorm, ReLU).

Every timed variant first runs the same steps from the same initial model and batches as eager
nnx, and its loss sequence must match eager nnx's (relative tolerance per model: f32 tight, bf16
looser); a wrong variant stops the benchmark. Then the variants are timed in interleaved rounds,
alternating their order (median of per-round medians, spread = min..max of the rounds), on batches
rotating through a pool. A shared CPU is noisy: compare ratios within a run, not across runs.

Usage (from the repository root; CPU: ``--small``)::

    python -m benchmarks.bench_module_step [--small] [--rounds 7] [--steps 10] [--models SUBSTR ...]
        [--variants NAME ...] [--out FILE]
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
import optax
from flax import nnx

import jaxaot
from benchmarks.harness import report, result_path, table


# --------------------------------------------------------------------------- models
class MLP(nnx.Module):
    """ReLU MLP with batch norm and dropout (f32)."""

    def __init__(self, d_in: int, width: int, classes: int, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(d_in, width, rngs=rngs)
        self.bn = nnx.BatchNorm(width, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.l2 = nnx.Linear(width, width, rngs=rngs)
        self.l3 = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, x):
        x = self.drop(jax.nn.relu(self.bn(self.l1(x))))
        return self.l3(jax.nn.relu(self.l2(x)))


class Transformer(nnx.Module):
    """Pre-norm transformer blocks (RMSNorm, GELU, mean-pooled head), bf16 activations, 8 heads."""

    def __init__(self, d: int, heads: int, layers: int, classes: int, rngs: nnx.Rngs):
        dt = jnp.bfloat16
        self.blocks = nnx.List([nnx.Dict(
            n1=nnx.RMSNorm(d, rngs=rngs),
            att=nnx.MultiHeadAttention(heads, d, dtype=dt, decode=False, rngs=rngs),
            n2=nnx.RMSNorm(d, rngs=rngs),
            up=nnx.Linear(d, 4 * d, dtype=dt, rngs=rngs),
            down=nnx.Linear(4 * d, d, dtype=dt, rngs=rngs),
        ) for _ in range(layers)])
        self.head = nnx.Linear(d, classes, rngs=rngs)

    def __call__(self, x):
        for b in self.blocks:
            x = x + b["att"](b["n1"](x))
            x = x + b["down"](jax.nn.gelu(b["up"](b["n2"](x))))
        return self.head(jnp.mean(x, axis=1).astype(jnp.float32))


class CNN(nnx.Module):
    """Conv + batch norm + SiLU, twice, then a linear head (f32)."""

    def __init__(self, ch: int, classes: int, rngs: nnx.Rngs):
        self.c1 = nnx.Conv(3, ch, (3, 3), rngs=rngs)
        self.b1 = nnx.BatchNorm(ch, rngs=rngs)
        self.c2 = nnx.Conv(ch, 2 * ch, (3, 3), strides=2, rngs=rngs)
        self.b2 = nnx.BatchNorm(2 * ch, rngs=rngs)
        self.head = nnx.Linear(2 * ch, classes, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.silu(self.b1(self.c1(x)))
        x = jax.nn.silu(self.b2(self.c2(x)))
        return self.head(jnp.mean(x, axis=(1, 2)))


class Mixer(nnx.Module):
    """MLP-Mixer blocks (LayerNorm, tanh MLPs over tokens and channels), bf16 parameters and activations."""

    def __init__(self, tokens: int, d: int, layers: int, classes: int, rngs: nnx.Rngs):
        dt = jnp.bfloat16
        lin = functools.partial(nnx.Linear, dtype=dt, param_dtype=dt, rngs=rngs)
        self.blocks = nnx.List([nnx.Dict(
            n1=nnx.LayerNorm(d, dtype=dt, param_dtype=dt, rngs=rngs), t1=lin(tokens, 2 * tokens), t2=lin(2 * tokens, tokens),
            n2=nnx.LayerNorm(d, dtype=dt, param_dtype=dt, rngs=rngs), c1=lin(d, 2 * d), c2=lin(2 * d, d),
        ) for _ in range(layers)])
        self.head = nnx.Linear(d, classes, rngs=rngs)

    def __call__(self, x):
        for b in self.blocks:
            h = jnp.swapaxes(b["n1"](x), 1, 2)
            x = x + jnp.swapaxes(b["t2"](jnp.tanh(b["t1"](h))), 1, 2)
            x = x + b["c2"](jnp.tanh(b["c1"](b["n2"](x))))
        return self.head(jnp.mean(x, axis=1).astype(jnp.float32))


class ResNetGN(nnx.Module):
    """A stem and residual conv blocks with GroupNorm and ReLU, then a linear head (f32)."""

    def __init__(self, ch: int, blocks: int, classes: int, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, ch, (3, 3), rngs=rngs)
        self.blocks = nnx.List([nnx.Dict(
            c1=nnx.Conv(ch, ch, (3, 3), rngs=rngs), g1=nnx.GroupNorm(ch, num_groups=8, rngs=rngs),
            c2=nnx.Conv(ch, ch, (3, 3), rngs=rngs), g2=nnx.GroupNorm(ch, num_groups=8, rngs=rngs),
        ) for _ in range(blocks)])
        self.head = nnx.Linear(ch, classes, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.stem(x))
        for b in self.blocks:
            x = jax.nn.relu(x + b["g2"](b["c2"](jax.nn.relu(b["g1"](b["c1"](x))))))
        return self.head(jnp.mean(x, axis=(1, 2)))


#: name -> (model factory, batch(i) -> (x, y), relative tolerance of the loss check)
Models = dict[str, tuple[Callable[[], nnx.Module], Callable[[int], tuple], float]]
F32, BF16 = 1e-4, 2e-2


def models(small: bool) -> Models:
    """The benchmark's models, CPU sizes with ``small``."""
    def batches(shape, classes, dtype=jnp.float32):
        def make(i):
            k1, k2 = jax.random.split(jax.random.key(100 + i))
            return jax.random.normal(k1, shape, dtype), jax.random.randint(k2, shape[:1], 0, classes)
        return make

    if small:
        return {
            "MLP 784-512-512 bn+dropout, b128": (lambda: MLP(784, 512, 10, nnx.Rngs(0)), batches((128, 784), 10), F32),
            "transformer d128 h8 L2 bf16, b8x64": (lambda: Transformer(128, 8, 2, 10, nnx.Rngs(0)),
                                                    batches((8, 64, 128), 10, jnp.bfloat16), BF16),
            "CNN 32ch bn, b32 32x32": (lambda: CNN(32, 10, nnx.Rngs(0)), batches((32, 32, 32, 3), 10), F32),
            "mixer 64x128 ln+tanh L2 bf16, b32": (lambda: Mixer(64, 128, 2, 10, nnx.Rngs(0)),
                                                   batches((32, 64, 128), 10, jnp.bfloat16), BF16),
            "resnet 32ch gn 2 blocks, b16 32x32": (lambda: ResNetGN(32, 2, 10, nnx.Rngs(0)),
                                                    batches((16, 32, 32, 3), 10), F32),
        }
    return {
        "MLP 784-2048-2048 bn+dropout, b1024": (lambda: MLP(784, 2048, 10, nnx.Rngs(0)), batches((1024, 784), 10),
                                                F32),
        "transformer d512 h8 L4 bf16, b16x256": (lambda: Transformer(512, 8, 4, 10, nnx.Rngs(0)),
                                                  batches((16, 256, 512), 10, jnp.bfloat16), BF16),
        "CNN 64ch bn, b128 64x64": (lambda: CNN(64, 10, nnx.Rngs(0)), batches((128, 64, 64, 3), 10), F32),
        "MLP 784-512-512 bn+dropout, b128": (lambda: MLP(784, 512, 10, nnx.Rngs(0)), batches((128, 784), 10), F32),
        "mixer 256x512 ln+tanh L4 bf16, b64": (lambda: Mixer(256, 512, 4, 10, nnx.Rngs(0)),
                                                batches((64, 256, 512), 10, jnp.bfloat16), BF16),
        "resnet 64ch gn 4 blocks, b64 64x64": (lambda: ResNetGN(64, 4, 10, nnx.Rngs(0)),
                                                batches((64, 64, 64, 3), 10), F32),
    }


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


# --------------------------------------------------------------------------- variants
REFERENCE, CACHED, EAGER_STEP = "nnx.jit", "nnx.jit cached", "aot + jaxaot.vg + jaxaot opt"


def variants(factory: Callable[[], nnx.Module], names: list[str] | None = None) -> dict[str, Callable[[Any, Any], Any]]:
    """name -> step(x, y) -> loss, each on its own model and optimizer built from the same seed
    (only ``names`` when given; ``eager nnx``, the loss reference, always)."""

    def setup(aot: bool, opt_cls=nnx.Optimizer):
        m = factory()
        m = jaxaot.nn.aot_module(m) if aot else m
        return m, opt_cls(m, optax.adam(1e-3), wrt=nnx.Param)

    def jit_step(model, opt, x, y):
        loss, g = nnx.value_and_grad(loss_fn)(model, x, y)
        opt.update(model, g)
        return loss

    def jitted():
        m, o = setup(False)
        step = nnx.jit(jit_step)
        return lambda x, y: step(m, o, x, y)

    def cached():
        m, o = setup(False)
        return nnx.cached_partial(nnx.jit(jit_step), m, o)

    def eager(vg, aot: bool, jit_update: bool = False, update: bool = True, opt_cls=nnx.Optimizer):
        def build():
            m, o = setup(aot, opt_cls)
            upd = nnx.cached_partial(nnx.jit(lambda oo, mm, g: oo.update(mm, g)), o, m) if jit_update else None

            def run(x, y):
                loss, g = vg(loss_fn)(m, x, y)
                if update:
                    upd(g) if upd is not None else o.update(m, g)
                return loss
            return run
        return build

    builders = {
        REFERENCE: jitted,
        CACHED: cached,
        "eager nnx": eager(nnx.value_and_grad, aot=False),
        "aot + nnx.vg": eager(nnx.value_and_grad, aot=True),
        "aot + jaxaot.vg": eager(jaxaot.value_and_grad, aot=True),
        "aot + jaxaot.vg + jit upd": eager(jaxaot.value_and_grad, aot=True, jit_update=True),
        EAGER_STEP: eager(jaxaot.value_and_grad, aot=True, opt_cls=jaxaot._src.nn.Optimizer),
        "aot + nnx.vg + jaxaot opt": eager(nnx.value_and_grad, aot=True, opt_cls=jaxaot._src.nn.Optimizer),
        "aot + patched nnx.vg + jaxaot opt": eager(_patched_nnx_vg, aot=True, opt_cls=jaxaot._src.nn.Optimizer),
        "jaxaot.vg alone": eager(jaxaot.value_and_grad, aot=True, update=False),
    }
    unknown = set(names or ()) - set(builders)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(builders)}")
    wanted = [k for k in builders if names is None or k in names or k == "eager nnx"]
    return {k: builders[k]() for k in wanted}


def _patched_nnx_vg(fun):
    """``nnx.value_and_grad(fun)`` as user code inside ``jaxaot.patch_value_and_grad()`` gets it."""
    with jaxaot.patch_value_and_grad():
        return nnx.value_and_grad(fun)


def check(steps: dict, batch: Callable[[int], tuple], tol: float, n: int = 3) -> str:
    """Run ``n`` steps of every variant on the same batches; each loss sequence must match eager nnx's."""
    losses = {name: [float(fn(*batch(i))) for i in range(n)] for name, fn in steps.items()}
    ref = losses["eager nnx"]
    worst = {}
    for name, ls in losses.items():
        if name == "jaxaot.vg alone":  # no update: only its first step is comparable
            ls, r = ls[:1], ref[:1]
        else:
            r = ref
        worst[name] = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(ls, r))
        if not worst[name] < tol:
            raise AssertionError(f"{name}: losses {ls} differ from eager nnx's {r} (tolerance {tol:g})")
    return (f"losses vs eager nnx (max rel. diff over {n} steps, tolerance {tol:g}): "
            + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


def time_round(steps: dict, batch: Callable[[int], tuple], pool: int, per_round: int) -> dict[str, float]:
    out = {}
    for name, fn in steps.items():
        times = []
        for i in range(per_round):
            x, y = batch(i % pool)
            t = time.perf_counter()
            jax.block_until_ready(fn(x, y))
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    return out


def section(name: str, factory, batch_fn, tol: float, rounds: int, per_round: int, names: list[str] | None,
            pool: int = 4) -> tuple[str, dict[str, float]]:
    """The section's text, and each timed variant's median seconds per step."""
    steps = variants(factory, names)
    batches = [batch_fn(i) for i in range(pool)]
    ok = check(steps, lambda i: batches[i % pool], tol)
    if names is not None and "eager nnx" not in names:
        del steps["eager nnx"]  # the loss reference only
    for fn in steps.values():  # warm-up: compile everything
        for i in range(2):
            jax.block_until_ready(fn(*batches[i]))
    per = {k: [] for k in steps}
    for r in range(rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))  # interleaved, alternating order
        res = time_round({k: steps[k] for k in order}, lambda i: batches[i], pool, per_round)
        for k, v in res.items():
            per[k].append(v)
    med = {k: statistics.median(ts) for k, ts in per.items()}
    refs = [r for r in (REFERENCE, CACHED) if r in med]
    rows = [["variant", "ms/step", "spread", *(f"vs {r}" for r in refs)]]
    for k, ts in per.items():
        rows.append([k, f"{med[k] * 1e3:.2f}", f"{min(ts) * 1e3:.2f}..{max(ts) * 1e3:.2f}",
                     *(f"{med[k] / med[r]:.2f}x" for r in refs)])
    text = f"## {name}  ({rounds} interleaved rounds x {per_round} steps)\n{ok}\n\n" + table(rows)
    return text, med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CPU sizes")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", nargs="*", help="only the models whose name contains one of these")
    ap.add_argument("--variants", nargs="*", help="only these variants (eager nnx still checks the losses)")
    ap.add_argument("--out", help="default: benchmarks/results/module_step_<device>.txt")
    args = ap.parse_args()
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    chosen = {k: v for k, v in models(args.small).items() if not args.models or any(m in k for m in args.models)}
    summary: list[list[str]] = []

    def sections():
        for name, (factory, batch, tol) in chosen.items():
            text, med = section(name, factory, batch, tol, args.rounds, args.steps, args.variants)
            if CACHED in med and EAGER_STEP in med:
                summary.append([name, f"{med[CACHED] * 1e3:.2f}", f"{med[EAGER_STEP] * 1e3:.2f}",
                                f"{med[EAGER_STEP] / med[CACHED]:.2f}x"])
            yield text
        if summary:
            yield ("## the eager step (aot_module + jaxaot.value_and_grad + jaxaot._src.nn.Optimizer) vs "
                   "nnx.cached_partial(nnx.jit(step))\n\n"
                   + table([["model", "cached ms", "eager step ms", "ratio"], *summary]))

    report("eager nnx training step through aot_module vs nnx.jit", sections(),
           args.out or str(result_path("module_step")))


if __name__ == "__main__":
    main()
