"""Pipeline benchmark: simulated and measured step times of every schedule for a GPT cut into stages.

For a GPT (token embedding, pre-LN blocks, head, cross-entropy; ``--small``: CPU
sizes in f32, default: GPU sizes in bf16) it prints:

* **per-op times**: each stage's forward (F), input backward (B), weight
  backward (W) and fused backward (BW) executables, measured with every stage
  on *one* device (``Pipeline.measure_op_times``: median over runs of 4 back-to-back passes), for
  the model cut into 4 stages and, for the interleaved schedule, into 8
  half-size stages (2 per device);
* **simulated**: each schedule's step time and bubble fraction for 4, 8 and 16
  microbatches on 4 devices, from those op times (``jaxaot.parallel.simulate``;
  transfers cost 0, the microbatch size is fixed, so the global batch grows with
  the microbatch count);
* **measured**: each schedule's step time on 4 devices for 8 microbatches, as
  the median and min-max over rounds in which the schedules take turns (so
  that drift hits all alike), next to ``jax.jit(jax.value_and_grad)`` of the
  unpipelined model on one device, after a gradient check against it. On the
  CPU the devices are host devices sharing the same cores: the numbers show the
  runtime's shape (dispatch, transfers, overlap), not pipeline speed-ups.

Usage (from the repository root): ``python -m benchmarks.bench_pipeline [--small] [--out FILE] [--rounds N]``.
On the CPU, 8 host devices are forced (``XLA_FLAGS``) before jax is imported.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxaot.cli import demo_models  # noqa: E402
from jaxaot.parallel import OpTimes, Pipeline, Schedule, make_schedule, pipeline, simulate  # noqa: E402
from benchmarks.harness import fmt_bytes, report, table  # noqa: E402
from benchmarks.models import layer_norm  # noqa: E402
from benchmarks.pipeline_peer import timed_peer  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
NUM_DEVICES = 4
MICROBATCHES = (4, 8, 16)
MEASURED_MICROBATCHES = 8


# --------------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class Size:
    microbatch: int  # sequences per microbatch
    seq: int
    width: int
    heads: int
    layers: int
    vocab: int
    dtype: Any


SIZES = {"small": Size(microbatch=2, seq=32, width=64, heads=4, layers=8, vocab=128, dtype=jnp.float32),
         "gpu": Size(microbatch=4, seq=1024, width=1024, heads=16, layers=16, vocab=32768, dtype=jnp.bfloat16)}


def gpt_stage(params: dict, x: jax.Array, heads: int) -> jax.Array:
    """Embeds tokens on the first stage, runs this stage's blocks, projects to logits on the last."""
    if "tok" in params:
        x = params["tok"][x] + params["pos"]
    for block in params["blocks"]:
        x = demo_models.block_apply(block, x, heads=heads)
    if "head" in params:
        x = layer_norm(x, params["ln"]["scale"], params["ln"]["bias"]) @ params["head"]
    return x


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def gpt_params(key: jax.Array, size: Size, num_stages: int) -> list[dict]:
    keys = jax.random.split(key, size.layers + 3)
    blocks = [demo_models.block_init(k, width=size.width, heads=size.heads, dtype=size.dtype)
              for k in keys[:size.layers]]
    per = size.layers // num_stages
    params = [{"blocks": blocks[s * per:(s + 1) * per]} for s in range(num_stages)]
    emb = lambda k, shape: (jax.random.normal(k, shape) * 0.02).astype(size.dtype)  # noqa: E731
    params[0].update(tok=emb(keys[-3], (size.vocab, size.width)), pos=emb(keys[-2], (size.seq, size.width)))
    params[-1].update(ln={"scale": jnp.ones(size.width, size.dtype), "bias": jnp.zeros(size.width, size.dtype)},
                      head=emb(keys[-1], (size.width, size.vocab)))
    return params


def batch(key: jax.Array, size: Size, num_microbatches: int) -> tuple[jax.Array, jax.Array]:
    k1, k2 = jax.random.split(key)
    shape = (size.microbatch * num_microbatches, size.seq)
    return jax.random.randint(k1, shape, 0, size.vocab), jax.random.randint(k2, shape, 0, size.vocab)


def unpipelined(stages: list[Callable], num_microbatches: int) -> Callable:
    """``jit`` of the mean microbatch loss and its gradients on one device, a microbatch at a time.

    The microbatches run one after the other (``lax.scan`` accumulating
    ``value_and_grad``), as gradient accumulation does: the memory of one
    microbatch's activations, whatever the microbatch count.
    """

    def one(params, x, t):
        for fn, p in zip(stages, params):
            x = fn(p, x)
        return cross_entropy(x, t)

    def step(params, x, t):
        xs = x.reshape(num_microbatches, -1, *x.shape[1:])
        ts = t.reshape(num_microbatches, -1, *t.shape[1:])

        def body(acc, xt):
            loss, grads = jax.value_and_grad(one)(params, *xt)
            return jax.tree.map(jnp.add, acc, (loss, grads)), None

        zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        total, _ = jax.lax.scan(body, zero, (xs, ts))
        return jax.tree.map(lambda a: a / num_microbatches, total)

    return jax.jit(step)


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass
class Config:
    """One cut of the model: its stages, parameters and a batch."""

    num_stages: int
    stages: list[Callable]
    params: list[dict]
    inputs: jax.Array
    targets: jax.Array


def config(size: Size, num_stages: int, num_microbatches: int) -> Config:
    stage = functools.partial(gpt_stage, heads=size.heads)
    x, t = batch(jax.random.key(1), size, num_microbatches)
    return Config(num_stages, [stage] * num_stages, gpt_params(jax.random.key(0), size, num_stages), x, t)


def op_times(size: Size, num_stages: int) -> tuple[OpTimes, str]:
    """Per-stage op times with every stage on one device (microbatch count 1: one microbatch's shapes)."""
    c = config(size, num_stages, 1)
    step = pipeline(c.stages, cross_entropy, schedule="zero_bubble", num_microbatches=1,
                    devices=[jax.devices()[0]] * num_stages)
    times = step.measure_op_times(c.params, c.inputs, c.targets, repeats=21)
    rows = [("stage", "F ms", "B ms", "W ms", "BW ms", "B+W ms")]
    for s in range(num_stages):
        f, b, w, bw = (getattr(times, k)[s] * 1e3 for k in ("forward", "backward_input", "backward_weight",
                                                             "backward"))
        rows.append((s, f"{f:.3f}", f"{b:.3f}", f"{w:.3f}", f"{bw:.3f}", f"{b + w:.3f}"))
    return dataclasses.replace(times, transfer=0.0), table(rows)


def schedules_for(m: int, times4: OpTimes, times8: OpTimes) -> dict[str, tuple[Schedule, OpTimes]]:
    """name -> (schedule, the op times it is simulated with), for ``m`` microbatches.

    ``zero_bubble`` is the paper's (every backward split); ``zero_bubble tuned``
    splits as many as the simulator finds best for the measured op times.
    """
    out = {}
    for name in SCHEDULES:
        stages, times = (2 * NUM_DEVICES, times8) if name == "interleaved" else (NUM_DEVICES, times4)
        out[name] = (make_schedule(name, stages, m, NUM_DEVICES), times)
    out["zero_bubble tuned"] = (make_schedule("zero_bubble", NUM_DEVICES, m, NUM_DEVICES, op_times=times4), times4)
    return out


def split_count(schedule: Schedule) -> str:
    return f"{sum(a.op == 'W' for a in schedule.actions)}/{schedule.num_stages * schedule.num_microbatches} split"


def simulated(times4: OpTimes, times8: OpTimes) -> str:
    rows = [("schedule", "stages", "microbatches", "step ms", "bubble", "backwards")]
    by_name: dict[str, list] = {}
    for m in MICROBATCHES:
        for name, (sched, times) in schedules_for(m, times4, times8).items():
            sim = simulate(sched, times)
            by_name.setdefault(name, []).append((name, sched.num_stages, m, f"{sim.step_time * 1e3:.3f}",
                                                 f"{sim.bubble_fraction:.3f}", split_count(sched)))
    return table(rows + [r for rs in by_name.values() for r in rs])


def devices_for() -> tuple[list, str]:
    available = jax.devices()
    if len(available) >= NUM_DEVICES:
        return available[:NUM_DEVICES], f"{NUM_DEVICES} {available[0].platform} devices"
    return [available[0]] * NUM_DEVICES, f"all stages on one {available[0].platform} device (only {len(available)})"


def grad_error(grads: Any, want: Any) -> float:
    errs = [float(jnp.linalg.norm((g.astype(jnp.float32) - w.astype(jnp.float32)).ravel())
                  / (jnp.linalg.norm(w.astype(jnp.float32).ravel()) + 1e-30))
            for g, w in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want))]
    return max(errs)


def measured(size: Size, schedules: dict[str, tuple[Schedule, OpTimes]], *, rounds: int, tolerance: float,
             m: int = MEASURED_MICROBATCHES) -> str:
    devices, where = devices_for()
    sims = {name: simulate(sched, times).step_time for name, (sched, times) in schedules.items()}
    steps: dict[str, tuple[Pipeline, Config]] = {}
    checks: dict[str, tuple[float, float]] = {}
    for name, (sched, _) in schedules.items():
        c = config(size, sched.num_stages, m)
        step = pipeline(c.stages, cross_entropy, schedule=sched, num_microbatches=m, devices=devices)
        loss, grads = step(c.params, c.inputs, c.targets)
        ref_loss, ref_grads = unpipelined(c.stages, m)(c.params, c.inputs, c.targets)
        err = grad_error(grads, ref_grads)
        if err > tolerance or abs(float(loss) - float(ref_loss)) > tolerance * abs(float(ref_loss)):
            raise AssertionError(f"{name}: gradients differ from jax.value_and_grad's (max relative error {err:.2e})")
        checks[name] = (err, abs(float(loss) - float(ref_loss)))
        steps[name] = (step, c)
    c4 = steps["1f1b"][1]
    fused = unpipelined(c4.stages, m)
    runs: dict[str, Callable[[], Any]] = {name: functools.partial(step, c.params, c.inputs, c.targets)
                                          for name, (step, c) in steps.items()}
    runs["jit(grad accumulation), 1 device"] = functools.partial(fused, c4.params, c4.inputs, c4.targets)
    if len(set(devices)) == NUM_DEVICES:  # the plain-JAX peer's mesh needs distinct devices
        peer = "plain JAX shard_map GPipe"
        runs[peer], loss, grads = timed_peer(size, NUM_DEVICES, m, devices, c4.params, c4.inputs, c4.targets)
        ref_loss, ref_grads = fused(c4.params, c4.inputs, c4.targets)
        err = grad_error(grads, ref_grads)
        if err > tolerance or abs(float(loss) - float(ref_loss)) > tolerance * abs(float(ref_loss)):
            raise AssertionError(f"{peer}: gradients differ from jax.value_and_grad's (max relative error {err:.2e})")
        checks[peer] = (err, abs(float(loss) - float(ref_loss)))
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        jax.block_until_ready(fn())
    for _ in range(rounds):
        for name, fn in runs.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - t)
    rows = [("program", "step ms (median)", "min-max ms", "simulated ms", "peak live/stage", "peak residuals",
             "max grad rel err")]
    for name, xs in samples.items():
        step = steps.get(name, (None,))[0]
        peak = "-" if step is None else ",".join(map(str, step.last_peak_live))
        resid = "-"
        if step is not None:
            c = steps[name][1]
            resid = fmt_bytes(max(step.lower(c.params, c.inputs, c.targets).peak_residual_bytes))
        rows.append((name, f"{statistics.median(xs) * 1e3:.2f}", f"{min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f}",
                     f"{sims[name] * 1e3:.2f}" if name in sims else "-", peak, resid,
                     f"{checks[name][0]:.1e}" if name in checks else "-"))
    return (f"{m} microbatches of {size.microbatch} sequences; {where}; {rounds} interleaved rounds\n" + table(rows))


def main(argv: list[str] | None = None) -> str:
    global NUM_DEVICES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized model (f32)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds of the measured steps")
    ap.add_argument("--devices", type=int, default=4, help="devices = stages (interleaved: 2 per device)")
    ap.add_argument("--measured", default=str(MEASURED_MICROBATCHES),
                    help="comma-separated microbatch counts to measure (default 8)")
    a = ap.parse_args(argv)
    NUM_DEVICES = a.devices
    size = SIZES["small" if a.small else "gpu"]
    tolerance = 1e-4 if size.dtype == jnp.float32 else 3e-2

    def sections():
        yield (f"## model\nGPT: {size.layers} layers, width {size.width}, {size.heads} heads, seq {size.seq}, "
               f"vocab {size.vocab}, {jnp.dtype(size.dtype).name}; microbatch {size.microbatch} sequences; "
               f"{NUM_DEVICES} stages of {size.layers // NUM_DEVICES} layers (interleaved: {2 * NUM_DEVICES} stages "
               f"of {size.layers // (2 * NUM_DEVICES)}, 2 per device)\n"
               f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        times4, text4 = op_times(size, NUM_DEVICES)
        yield f"## per-op times, {NUM_DEVICES} stages, one device\n" + text4
        times8, text8 = op_times(size, 2 * NUM_DEVICES)
        yield f"## per-op times, {2 * NUM_DEVICES} stages, one device\n" + text8
        yield f"## simulated on {NUM_DEVICES} devices (transfers free)\n" + simulated(times4, times8)
        for m in (int(x) for x in a.measured.split(",")):
            yield (f"## measured, {m} microbatches\n"
                   + measured(size, schedules_for(m, times4, times8), rounds=a.rounds, tolerance=tolerance, m=m))

    return report("bench_pipeline: pipeline schedules, simulated and measured", sections(), a.out)


if __name__ == "__main__":
    main()
