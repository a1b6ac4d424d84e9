"""Pipeline benchmark: the compiled pipeline executor against its simulators, the Python executor and a peer.

For a GPT (token embedding, pre-LN blocks, head, cross-entropy; ``--small``: CPU
sizes in f32, default: GPU sizes in bf16) cut into one stage per device
(interleaved: two half-size stages per device) it prints:

* **per-pass times**: each stage's forward (F), input backward (B), weight
  backward (W) and fused backward (BW) as the compiled step inlines them,
  each timed in a compiled loop on one device
  (``Pipeline.measure_op_times(source="compiled")``), for the model cut into
  ``--devices`` stages (from a zero-bubble step, whose backwards are split) and
  into twice as many (from the interleaved step; its backwards are fused);
* **simulated**: each schedule's step time for 4, 8 and 16 microbatches from
  those times, in the lockstep model of the compiled step
  (``jaxaot._src.parallel.simulator.simulate_lockstep``: every tick lasts its slowest
  pass) and in the asynchronous event model (``jaxaot._src.parallel.simulator``,
  whose bubble fraction is the schedule's ideal idle share); transfers cost 0,
  the microbatch size is fixed, so the global batch grows with the microbatch
  count;
* **measured**, per microbatch count of ``--measured`` (default 8 and 16):
  every schedule's compiled step (one ``shard_map`` program on a ``("stage",)``
  mesh, or ``("stage", "data")`` with ``--data N``; parameters packed once with
  ``step.shard_params``), the same schedule on the Python executor
  (``executor="python"``, one device per stage), the plain-JAX ``shard_map``
  GPipe peer (``benchmarks/pipeline_peer.py``) and ``jit`` of gradient
  accumulation on one device (``unpipelined``), all timed in the same
  interleaved rounds (each round: the median of a few steps). Per program: the
  median step time, the min-max over rounds and the largest deviation from the
  median in percent; for compiled steps also the lockstep-simulated time and
  measured / simulated, the event-simulated bubble, the speedup over
  ``unpipelined`` next to the target ``0.9 x devices x (1 - bubble)``, the
  compiled per-device peak bytes (``step.peak_bytes``) next to the SPMD ideal
  (``step.lower(...).ideal_peak_bytes``: the largest device's parameters and
  gradients, peak live microbatches x the largest stage's record, one message
  each way) and the schedule's peak live microbatches per stage. Every program's loss and gradients are checked
  against ``unpipelined`` first. A last list says which of the goals hold:
  compiled within 10% of the lockstep simulation, zero-bubble at least 5%
  faster than 1F1B (at 16 microbatches), speedup at least the target, faster
  than the peer, every round within 5% of the median, every compiled peak within
  1.25x of its ideal.

With ``--data N`` each microbatch holds ``N`` times the sequences, split over
the data axis, so every device's share is the ``--small`` / GPU microbatch; the
speedup target then counts ``devices x N`` devices, the Python executor runs on
the first data column (one device per stage) and the peer on a ``("stage",)``
mesh of the same devices.

On the CPU the devices are host devices sharing the machine's cores: the
numbers show that everything runs and agrees, not pipeline speed-ups.

``--profile SCHEDULE`` instead traces a few compiled steps of one schedule and
prints each device's kernel time per tick by kind: compute, copies, fills,
collectives (:mod:`benchmarks.pipeline_profile`).

Usage (from the repository root): ``python -m benchmarks.bench_pipeline [--small] [--out FILE] [--rounds N]
[--devices D] [--data N] [--measured 8,16] [--profile SCHEDULE]``. On the CPU, 8 host devices are forced (``XLA_FLAGS``) before jax
is imported.
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
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from jaxaot._src.cli import demo_models  # noqa: E402
from jaxaot._src.parallel import OpTimes, Schedule, make_schedule, pipeline, simulate  # noqa: E402
from jaxaot._src.parallel.simulator import simulate_lockstep  # noqa: E402
from benchmarks.harness import fmt_bytes, report, table  # noqa: E402
from benchmarks.models import layer_norm  # noqa: E402
from benchmarks.pipeline_peer import timed_peer  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
NUM_DEVICES = 4
DATA = 1  # the data axis' size (--data)
MICROBATCHES = (4, 8, 16)
MEASURED_MICROBATCHES = "8,16"
STEPS_PER_ROUND = 3
UNPIPELINED = "jit(grad accumulation), 1 device"
PEER = "plain JAX shard_map GPipe"


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


def make_mesh() -> Mesh:
    """The compiled steps' mesh: ``NUM_DEVICES`` x ``DATA`` distinct devices, axes ``("stage",)`` or
    ``("stage", "data")``."""
    need, available = NUM_DEVICES * DATA, jax.devices()
    if len(available) < need:
        raise SystemExit(f"the compiled executor needs {need} distinct devices ({NUM_DEVICES} stages x {DATA} data "
                         f"shards), JAX has {len(available)}: pass fewer --devices or a smaller --data")
    devices = np.array(available[:need])
    if DATA == 1:
        return Mesh(devices, ("stage",))
    return Mesh(devices.reshape(NUM_DEVICES, DATA), ("stage", "data"))


def stage_devices(mesh: Mesh) -> list:
    """One device per stage coordinate (the first data shard's): where the Python executor and the peer run."""
    return list(mesh.devices.reshape(NUM_DEVICES, -1)[:, 0])


def op_times(size: Size, mesh: Mesh, num_stages: int) -> tuple[OpTimes, str]:
    """Per-stage pass times of the compiled step, each pass in a compiled loop on one device.

    ``num_stages == NUM_DEVICES``: the passes of a zero-bubble step, whose backwards are split, so B and W are
    timed too; otherwise those of the interleaved step (fused backwards: B and W show as "-"). The passes see
    one device's share of a microbatch, whatever the microbatch count.
    """
    m = NUM_DEVICES
    name = "zero_bubble" if num_stages == NUM_DEVICES else "interleaved"
    c = config(size, num_stages, m)
    step = pipeline(c.stages, cross_entropy, schedule=make_schedule(name, num_stages, m, NUM_DEVICES),
                    num_microbatches=m, mesh=mesh)
    times = step.measure_op_times(c.params, c.inputs, c.targets, repeats=11, source="compiled")
    split = name == "zero_bubble"
    rows = [("stage", "F ms", "B ms", "W ms", "BW ms", "B+W ms")]
    for s in range(num_stages):
        f, b, w, bw = (getattr(times, k)[s] * 1e3 for k in ("forward", "backward_input", "backward_weight",
                                                             "backward"))
        rows.append((s, f"{f:.3f}", *((f"{b:.3f}", f"{w:.3f}") if split else ("-", "-")), f"{bw:.3f}",
                     f"{b + w:.3f}" if split else "-"))
    text = f"passes of the compiled {name!r} step\n" + table(rows)
    return dataclasses.replace(times, transfer=0.0), text


def schedules_for(m: int, times4: OpTimes, times8: OpTimes) -> dict[str, tuple[Schedule, OpTimes]]:
    """name -> (schedule, the op times it is simulated with), for ``m`` microbatches.

    ``zero_bubble`` is the paper's (every backward split); ``zero_bubble tuned``
    splits as many as the event simulator finds best for the measured op times.
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
    rows = [("schedule", "stages", "microbatches", "lockstep ms", "event ms", "event bubble", "backwards")]
    by_name: dict[str, list] = {}
    for m in MICROBATCHES:
        for name, (sched, times) in schedules_for(m, times4, times8).items():
            sim = simulate(sched, times)
            lock = simulate_lockstep(sched, times)
            by_name.setdefault(name, []).append((name, sched.num_stages, m, f"{lock.step_time * 1e3:.3f}",
                                                 f"{sim.step_time * 1e3:.3f}", f"{sim.bubble_fraction:.3f}",
                                                 split_count(sched)))
    return table(rows + [r for rs in by_name.values() for r in rs])


def grad_error(grads: Any, want: Any) -> float:
    """The largest relative error (2-norm) over the leaves; both trees are fetched to the host first."""
    errs = []
    for g, w in zip(jax.tree_util.tree_leaves(jax.device_get(grads)), jax.tree_util.tree_leaves(jax.device_get(want))):
        g, w = np.asarray(g, np.float32).ravel(), np.asarray(w, np.float32).ravel()
        errs.append(float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-30)))
    return max(errs)


def checked(name: str, got: tuple[Any, Any], want: tuple[Any, Any], tolerance: float) -> float:
    """The gradients' largest relative error against ``unpipelined``'s; raises where loss or gradients differ."""
    (loss, grads), (ref_loss, ref_grads) = got, want
    err = grad_error(grads, ref_grads)
    loss, ref_loss = float(loss), float(ref_loss)
    if err > tolerance or abs(loss - ref_loss) > tolerance * abs(ref_loss):
        raise AssertionError(f"{name}: loss {loss} or gradients differ from jax.value_and_grad's {ref_loss} "
                             f"(max relative error {err:.2e})")
    return err


@dataclasses.dataclass
class Program:
    """One timed program of the measured table and what is known of it besides its times."""

    name: str
    executor: str
    run: Callable[[], Any]
    err: float
    lockstep: float | None = None  # seconds
    bubble: float | None = None  # the event simulation's
    peak: int | None = None  # compiled per-device peak bytes
    ideal: int | None = None  # the SPMD ideal per device
    live: str = "-"


def timed_rounds(programs: list[Program], rounds: int, per_round: int) -> dict[str, list[float]]:
    """Per program, one time per round: the median of ``per_round`` steps; the programs take turns each round."""
    for p in programs:
        jax.block_until_ready(p.run())
    samples: dict[str, list[float]] = {key(p): [] for p in programs}
    for _ in range(rounds):
        for p in programs:
            steps = []
            for _ in range(per_round):
                t = time.perf_counter()
                jax.block_until_ready(p.run())
                steps.append(time.perf_counter() - t)
            samples[key(p)].append(statistics.median(steps))
    return samples


def key(p: Program) -> str:
    return f"{p.name} ({p.executor})"


def measured(size: Size, mesh: Mesh, schedules: dict[str, tuple[Schedule, OpTimes]], *, rounds: int,
             tolerance: float, m: int) -> str:
    devices = stage_devices(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    refs: dict[int, tuple[Callable, Any]] = {}  # stage count -> (unpipelined, its loss and gradients)

    def reference(c: Config) -> Any:
        if c.num_stages not in refs:
            fn = unpipelined(c.stages, m)
            refs[c.num_stages] = (fn, fn(c.params, c.inputs, c.targets))
        return refs[c.num_stages][1]

    compiled: list[Program] = []
    python: list[Program] = []
    for name, (sched, times) in schedules.items():
        c = config(size, sched.num_stages, m)
        want = reference(c)
        step = pipeline(c.stages, cross_entropy, schedule=sched, num_microbatches=m, mesh=mesh)
        packed = step.shard_params(c.params, c.inputs, c.targets)
        x, t = jax.device_put((c.inputs, c.targets), replicated)
        loss, grads = step(packed, x, t)
        err = checked(f"{name} (compiled)", (loss, step.unshard_params(grads)), want, tolerance)
        compiled.append(Program(name, "compiled", functools.partial(step, packed, x, t), err,
                                lockstep=simulate_lockstep(sched, times).step_time,
                                bubble=simulate(sched, times).bubble_fraction,
                                peak=step.peak_bytes(packed, x, t),
                                ideal=step.lower(packed, x, t).ideal_peak_bytes,
                                live=",".join(map(str, sched.peak_live_microbatches()))))
        py = pipeline(c.stages, cross_entropy, schedule=sched, num_microbatches=m, devices=devices, executor="python")
        where = sched.stage_device()
        placed = [jax.device_put(p, py.devices[where[s]]) for s, p in enumerate(c.params)]
        xp = jax.device_put(c.inputs, py.devices[where[0]])
        tp = jax.device_put(c.targets, py.devices[where[len(placed) - 1]])
        err = checked(f"{name} (python)", py(placed, xp, tp), want, tolerance)
        python.append(Program(name, "python", functools.partial(py, placed, xp, tp), err,
                              live=",".join(map(str, py.last_peak_live))))
    c4 = config(size, NUM_DEVICES, m)
    fused, want = refs[NUM_DEVICES]
    others = [Program(UNPIPELINED, "jit", functools.partial(fused, c4.params, c4.inputs, c4.targets), 0.0)]
    run, loss, grads = timed_peer(size, NUM_DEVICES, m, devices, c4.params, c4.inputs, c4.targets)
    others.insert(0, Program(PEER, "jit", run, checked(PEER, (loss, grads), want, tolerance)))
    programs = compiled + python + others
    samples = timed_rounds(programs, rounds, STEPS_PER_ROUND)
    med = {k: statistics.median(v) for k, v in samples.items()}
    spread = {k: max(abs(x - med[k]) for x in v) / med[k] * 100 for k, v in samples.items()}
    base = med[key(others[-1])]
    total = NUM_DEVICES * DATA

    rows = [("program", "executor", "step ms", "min-max ms", "±%", "lockstep ms", "meas/sim", "bubble",
             "speedup", "target", "peak/device", "ideal/device", "peak/ideal", "peak live/stage", "grad err")]
    for p in programs:
        k = key(p)
        xs = samples[k]
        target = None if p.bubble is None or p.executor != "compiled" else 0.9 * total * (1 - p.bubble)
        rows.append((p.name, p.executor, f"{med[k] * 1e3:.2f}", f"{min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f}",
                     f"{spread[k]:.1f}",
                     "-" if p.lockstep is None else f"{p.lockstep * 1e3:.2f}",
                     "-" if p.lockstep is None else f"{med[k] / p.lockstep:.2f}",
                     "-" if p.bubble is None else f"{p.bubble:.3f}",
                     f"{base / med[k]:.2f}x", "-" if target is None else f"{target:.2f}x",
                     fmt_bytes(p.peak) if p.peak is not None else "-",
                     fmt_bytes(p.ideal) if p.ideal is not None else "-",
                     f"{p.peak / p.ideal:.2f}" if p.peak and p.ideal else "-", p.live,
                     "-" if p.name == UNPIPELINED else f"{p.err:.1e}"))

    cm = {p.name: med[key(p)] for p in compiled}
    fastest = min(cm, key=cm.get)
    ratio = {p.name: med[key(p)] / p.lockstep for p in compiled}
    zb = {n: cm[n] / cm["1f1b"] for n in ("zero_bubble", "zero_bubble tuned")}
    peer = med[key(others[0])]
    short = [p.name for p in compiled if base / cm[p.name] < 0.9 * total * (1 - p.bubble)]
    noisy = [key(p) for p in programs if spread[key(p)] > 5]
    heavy = [p.name for p in compiled if p.peak and p.ideal and p.peak > 1.25 * p.ideal]
    mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    goals = [
        f"- compiled within 10% of the lockstep simulation: {mark(all(0.9 <= r <= 1.1 for r in ratio.values()))} "
        f"(measured / simulated {min(ratio.values()):.2f}-{max(ratio.values()):.2f})",
        f"- zero-bubble at least 5% faster than 1F1B (judged at 16 microbatches): "
        f"{mark(min(zb.values()) <= 0.95)} (compiled time / 1F1B's: paper's {zb['zero_bubble']:.3f}, "
        f"tuned {zb['zero_bubble tuned']:.3f})",
        f"- speedup over {UNPIPELINED} at least 0.9 x {total} x (1 - bubble): {mark(not short)}"
        + (f" (short: {', '.join(short)})" if short else ""),
        f"- faster than the plain-JAX peer: {mark(cm[fastest] < peer)} (fastest compiled: {fastest}, "
        f"{cm[fastest] / peer:.2f}x the peer's time; compiled gpipe {cm['gpipe'] / peer:.2f}x)",
        f"- every round within 5% of its median: {mark(not noisy)}"
        + (f" (wider: {', '.join(noisy)})" if noisy else ""),
        f"- compiled per-device peak within 1.25x of the SPMD ideal: {mark(not heavy)}"
        + (f" (above: {', '.join(heavy)})" if heavy else ""),
    ]
    mesh_text = " x ".join(f"{n}={s}" for n, s in mesh.shape.items())
    head = (f"{m} microbatches of {size.microbatch} sequences; compiled: mesh {mesh_text} of "
            f"{mesh.devices.flat[0].platform} devices, packed params; python and the peer: {NUM_DEVICES} devices, "
            f"one per stage; {rounds} interleaved rounds of {STEPS_PER_ROUND} steps each (a round's time: their "
            f"median); ±%: the largest deviation of a round from the median; speedup: {UNPIPELINED}'s time / "
            "the program's; "
            f"bubble: the event simulation's; target: 0.9 x {total} devices x (1 - bubble)")
    return head + "\n" + table(rows) + "\ngoals (GPU runs; on the CPU only a shape check)\n" + "\n".join(goals)


def profiled(size: Size, mesh: Mesh, name: str, m: int, steps: int) -> str:
    """The per-tick breakdown of one compiled schedule's step (``--profile``; :mod:`benchmarks.pipeline_profile`)."""
    from benchmarks.pipeline_profile import profile

    times4, _ = op_times(size, mesh, NUM_DEVICES)
    times8 = times4 if name != "interleaved" else op_times(size, mesh, 2 * NUM_DEVICES)[0]
    sched, times = schedules_for(m, times4, times8)[name]
    c = config(size, sched.num_stages, m)
    step = pipeline(c.stages, cross_entropy, schedule=sched, num_microbatches=m, mesh=mesh)
    packed = step.shard_params(c.params, c.inputs, c.targets)
    x, t = jax.device_put((c.inputs, c.targets), NamedSharding(mesh, PartitionSpec()))
    ticks = step._compiled.tick_plan.num_ticks
    peak = step.peak_bytes(packed, x, t)
    ideal = step.lower(packed, x, t).ideal_peak_bytes
    return (f"{name}, {m} microbatches, compiled peak {fmt_bytes(peak) if peak else '-'} / device, SPMD ideal "
            f"{fmt_bytes(ideal)}\n"
            + profile(functools.partial(step, packed, x, t), steps=steps, ticks=ticks,
                      lockstep=simulate_lockstep(sched, times).step_time))


def main(argv: list[str] | None = None) -> str:
    global NUM_DEVICES, DATA
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized model (f32)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds of the measured steps")
    ap.add_argument("--devices", type=int, default=4, help="devices along the stage axis = stages "
                    "(interleaved: 2 per device)")
    ap.add_argument("--data", type=int, default=1, help="devices along a data axis: a (stage, data) mesh of "
                    "devices x N; each microbatch holds N times the sequences (default 1: a (stage,) mesh)")
    ap.add_argument("--measured", default=MEASURED_MICROBATCHES,
                    help=f"comma-separated microbatch counts to measure (default {MEASURED_MICROBATCHES})")
    ap.add_argument("--profile", metavar="SCHEDULE", choices=(*SCHEDULES, "zero_bubble tuned"),
                    help="only profile this schedule's compiled step (a jax.profiler trace of a few steps, with the "
                    "device time per tick by kind), at the first --measured microbatch count")
    ap.add_argument("--profile-steps", type=int, default=5, help="steps traced by --profile")
    a = ap.parse_args(argv)
    NUM_DEVICES, DATA = a.devices, a.data
    per_device = SIZES["small" if a.small else "gpu"]
    size = dataclasses.replace(per_device, microbatch=per_device.microbatch * DATA)
    tolerance = 1e-4 if size.dtype == jnp.float32 else 3e-2
    mesh = make_mesh()
    cpu = jax.devices()[0].platform == "cpu"

    def sections():
        if a.profile:
            m = int(a.measured.split(",")[0])
            yield f"## profile of the compiled step\n" + profiled(size, mesh, a.profile, m, a.profile_steps)
            return
        yield (f"## model\nGPT: {size.layers} layers, width {size.width}, {size.heads} heads, seq {size.seq}, "
               f"vocab {size.vocab}, {jnp.dtype(size.dtype).name}; microbatch {size.microbatch} sequences"
               + (f" ({per_device.microbatch} per data shard)" if DATA > 1 else "") + "; "
               f"{NUM_DEVICES} stages of {size.layers // NUM_DEVICES} layers (interleaved: {2 * NUM_DEVICES} stages "
               f"of {size.layers // (2 * NUM_DEVICES)}, 2 per device); mesh {dict(mesh.shape)}\n"
               + (f"CPU: the {jax.device_count()} host devices share this machine's {os.cpu_count()} cores, so the "
                  "times are a shape check (everything runs, agrees and is reported), not pipeline speed-ups.\n"
                  if cpu else "")
               + f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        times4, text4 = op_times(size, mesh, NUM_DEVICES)
        yield f"## per-pass times, {NUM_DEVICES} stages, compiled loops on one device\n" + text4
        times8, text8 = op_times(size, mesh, 2 * NUM_DEVICES)
        yield f"## per-pass times, {2 * NUM_DEVICES} stages, compiled loops on one device\n" + text8
        yield (f"## simulated on {NUM_DEVICES} devices (transfers free; lockstep: the compiled step's ticks, "
               "event: asynchronous)\n" + simulated(times4, times8))
        for m in (int(x) for x in a.measured.split(",")):
            yield (f"## measured, {m} microbatches\n"
                   + measured(size, mesh, schedules_for(m, times4, times8), rounds=a.rounds, tolerance=tolerance,
                              m=m))

    return report("bench_pipeline: the compiled pipeline executor, simulated and measured", sections(), a.out)


if __name__ == "__main__":
    main()
