"""Sharding benchmark: jaxaot's split on a mesh against ``jax.jit(jax.value_and_grad)`` with the same shardings.

The model is the 12-layer GPT whose layers are stacked with ``lax.scan``
(``jaxaot._src.cli.demo_models.gpt_init`` / ``gpt_loss``, as in ``bench_partitioners.py``),
on a mesh over every device, in these layouts:

* **data parallel**: the batch split over ``data``, params replicated;
* **FSDP**: the batch split over ``data``, and each param split over ``data``
  along its largest dimension that the device count divides (replicated if none);
* **tensor parallel**: on a mesh ``("model",)``, the batch replicated and each block's
  products split Megatron-style (``qkv`` and ``fc1`` by output column, ``proj`` and
  ``fc2`` by input row; norms replicated);
* **data x tensor parallel** (4 or more devices, an even count): the same split over
  a ``model`` axis of 2, the batch over ``data``, the rest of the devices.

For each, three programs, from one run and checked against each other first
(gradients of the params, relative to the fused program's):

* ``jaxaot split``: ``f.forward`` then ``f.backward`` of
  ``aot_function(loss, partition_fn=min_cut_rematerialization_partition)``
  (its backward also computes the batch's gradient);
* ``jaxaot fused``: ``jaxaot.value_and_grad(f)`` (params only);
* ``jit(value_and_grad)``: ``jax.jit(jax.value_and_grad(loss))``, the reference.

Columns: residual bytes per device (the sum over ``f.forward``'s residual arrays
of their first addressable shard's bytes), the same less the saved inputs
(params and batch), and all residual bytes; per-device peak memory of the
compiled programs (``memory_analysis()``: the larger of forward and backward for
jaxaot, from ``f.lower(...).compile()``); the step time, the median of
``--rounds`` rounds (each the median of ``--iters`` steps, programs taking turns
round by round) with the min-max over rounds; and the time relative to
``jit(value_and_grad)``, the median (min-max) of the rounds' ratios.

A last section, **one-device mesh vs unsharded**, runs the same programs on a
mesh of one device (``NamedSharding(mesh, P())`` inputs) and on plain
arrays: the sharded path must cost nothing where there is nothing to shard.

Usage (from the repository root): ``python -m benchmarks.bench_sharding [--small] [--out FILE] [--iters N] [--rounds N]``
(``--small``: a CPU-sized GPT in f32; on the CPU, 8 host devices unless
``XLA_FLAGS`` already sets ``--xla_force_host_platform_device_count``).
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Before jax is imported: only the CPU backend reads it, GPU runs are unaffected.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxaot  # noqa: E402
from jaxaot._src.cli import demo_models as examples  # noqa: E402
from benchmarks.harness import fmt_bytes, median_time, report, table  # noqa: E402

#: (batch, seq, width, heads) and dtype of the 12-layer GPT; the batch must split over the devices.
SIZES = {"small": ((8, 64, 64, 4), jnp.float32), "full": ((8, 1024, 768, 12), jnp.bfloat16)}
#: Input sets each program cycles through (new buffers every step, as in training).
INPUT_SETS = 2
#: Largest relative error of a gradient against the fused program's before the run stops.
GRAD_TOL = {jnp.dtype(jnp.float32): 1e-3, jnp.dtype(jnp.bfloat16): 3e-2}


# --------------------------------------------------------------------------- model and layouts
def gpt(small: bool) -> tuple[Callable, dict, np.ndarray, Any]:
    """The loss, host params and host batch of the 12-layer scanned GPT, and its dtype."""
    (batch, seq, width, heads), dtype = SIZES["small" if small else "full"]
    params = jax.device_get(examples.gpt_init(jax.random.key(0), layers=12, width=width, heads=heads, dtype=dtype))
    x = np.asarray(jax.random.normal(jax.random.key(1), (batch, seq, width), dtype))

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return examples.gpt_loss(p, x, heads=heads)

    return loss, params, x, dtype


def fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """Split the largest dimension that ``n`` divides over 'data' (replicate if none does)."""
    dims = sorted((d for d in range(len(shape)) if shape[d] % n == 0 and shape[d] >= n), key=lambda d: -shape[d])
    if not dims or n == 1:
        return P()
    return P(*[("data" if d == dims[0] else None) for d in range(len(shape))])


def megatron_spec(name: str, shape: tuple[int, ...], n: int) -> P:
    """A stacked block param's tensor-parallel split over 'model' (``n`` devices): ``qkv`` and ``fc1`` by output
    column, ``proj`` and ``fc2`` by input row (replicated where ``n`` does not divide that dimension)."""
    dim = {"qkv": 2, "fc1": 2, "proj": 1, "fc2": 1}.get(name)
    if dim is None or shape[dim] % n:
        return P()
    return P(*[("model" if d == dim else None) for d in range(len(shape))])


def placed_sets(params: dict, x: np.ndarray, param_spec: Callable[[str, tuple], P] | None, mesh: Any,
                x_spec: P = P("data")) -> list[tuple]:
    """``INPUT_SETS`` (params, batch) pairs on ``mesh`` (``mesh=None``: plain, uncommitted arrays);
    ``param_spec(name, shape)``: a param's spec, by its last key."""
    sets = []
    for i in range(INPUT_SETS):
        scale = np.asarray(1 + 0.01 * i, x.dtype)
        p, xi = jax.tree.map(lambda a: a * scale, params), x * scale
        if mesh is None:
            sets.append((jax.tree.map(jnp.asarray, p), jnp.asarray(xi)))
        else:
            put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
            placed = jax.tree_util.tree_map_with_path(lambda path, a: put(a, param_spec(path[-1].key, a.shape)), p)
            sets.append((placed, put(xi, x_spec)))
    return sets


# --------------------------------------------------------------------------- programs
class Program:
    """One program of a comparison: ``step(params, x)`` is one training step; ``grads`` its param grads."""

    def __init__(self, name: str, step: Callable, grads: Callable, sets: list[tuple]):
        self.name, self.step, self.grads, self.sets = name, step, grads, sets
        self.residual_device = self.residual_device_computed = self.residual_total = self.peak = None
        self.rounds: list[float] = []
        self.ratios: list[float] = []
        self._i = 0

    def next_step(self) -> Any:
        """The step on the next input set."""
        self._i = (self._i + 1) % len(self.sets)
        return self.step(*self.sets[self._i])


def _peak(stats: dict | None) -> int | None:
    """Per-device peak bytes of one executable: XLA's ``peak_memory_in_bytes``, or its buffers' sum if larger.

    XLA:CPU's ``peak_memory_in_bytes`` leaves the temporary buffers out (the
    fused GPT step reports arguments + outputs, 4.9 MB, next to 74 MB of
    temporaries); arguments + outputs + temporaries - aliased is what its
    buffer assignment allocates.
    """
    if not stats:
        return None
    allocated = (stats.get("temp_size_in_bytes", 0) + stats.get("argument_size_in_bytes", 0)
                 + stats.get("output_size_in_bytes", 0) - stats.get("alias_size_in_bytes", 0))
    return max(stats.get("peak_memory_in_bytes") or 0, allocated)


def _program_peak(memory: dict) -> int | None:
    """The larger per-device peak of a split's forward and backward executables."""
    peaks = [p for p in (_peak(memory.get(k)) for k in ("forward", "backward")) if p is not None]
    return max(peaks, default=None)


def jaxaot_programs(label: str, loss: Callable, sets: list[tuple]) -> list[Program]:
    """The split (forward + backward) and fused (``jaxaot.value_and_grad``) steps of one min-cut aot_function."""
    f = jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition)
    one = jnp.ones((), jnp.float32)

    def split(p: Any, x: jax.Array) -> Any:
        _, res = f.forward(p, x)
        return f.backward(res, one)

    fused = jaxaot.value_and_grad(f)
    programs = [Program(f"jaxaot split{label}", split, lambda p, x: split(p, x)[0], sets),
                Program(f"jaxaot fused{label}", fused, lambda p, x: fused(p, x)[1], sets)]
    params, x = sets[0]
    _, res = f.forward(params, x)
    inputs = {id(a) for a in jax.tree.leaves((params, x))}
    per_device = [(id(r) in inputs, r.addressable_shards[0].data.nbytes) for r in res.arrays]
    split_prog, fused_prog = programs
    split_prog.residual_device = sum(b for _, b in per_device)
    split_prog.residual_device_computed = sum(b for is_input, b in per_device if not is_input)
    split_prog.residual_total = sum(r.nbytes for r in res.arrays)
    split_prog.peak = _program_peak(f.lower(params, x).compile().memory_analysis())
    # The fused step differentiates the params only: programs of their own (no per-device split of its residuals).
    fused_low = fused.lower(params, x)
    fused_prog.residual_total = fused_low.saved_bytes
    fused_prog.peak = _program_peak(fused_low.compile().memory_analysis())
    return programs


def jit_program(label: str, loss: Callable, sets: list[tuple]) -> Program:
    """``jax.jit(jax.value_and_grad(loss))``, the reference."""
    step = jax.jit(jax.value_and_grad(loss))
    prog = Program(f"jit(value_and_grad){label}", step, lambda p, x: step(p, x)[1], sets)
    stats = step.lower(*sets[0]).compile().memory_analysis()
    prog.peak = _peak({k: getattr(stats, k) for k in dir(stats) if k.endswith("_in_bytes")} if stats else None)
    return prog


# --------------------------------------------------------------------------- checks and timing
def check_grads(programs: list[Program], reference: Program, dtype: Any) -> dict[str, float]:
    """Each program's largest relative gradient error against ``reference`` (raises above ``GRAD_TOL``)."""
    want = [np.asarray(g, np.float32) for g in jax.tree.leaves(reference.grads(*reference.sets[0]))]
    errors = {}
    for prog in programs:
        got = [np.asarray(g, np.float32) for g in jax.tree.leaves(prog.grads(*prog.sets[0]))]
        err = max(float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-30)) for g, w in zip(got, want))
        if err > GRAD_TOL[jnp.dtype(dtype)]:
            raise AssertionError(f"{prog.name}: gradients differ from {reference.name}'s ({err:.2e})")
        errors[prog.name] = err
    return errors


def time_interleaved(programs: list[Program], reference: Program, *, rounds: int, iters: int) -> None:
    """Per program, each round's median step time and its ratio to ``reference`` in the same round."""
    for prog in programs:
        median_time(prog.next_step, warmup=2, iters=1)
    for _ in range(rounds):
        for prog in programs:
            prog.rounds.append(median_time(prog.next_step, warmup=0, iters=iters, min_seconds=0))
        for prog in programs:
            prog.ratios.append(prog.rounds[-1] / reference.rounds[-1])


def rows(programs: list[Program], errors: dict[str, float]) -> list[tuple]:
    """The table rows of ``programs``."""
    out = []
    for p in programs:
        out.append((p.name, fmt_bytes(p.residual_device), fmt_bytes(p.residual_device_computed),
                    fmt_bytes(p.residual_total), fmt_bytes(p.peak),
                    f"{statistics.median(p.rounds) * 1e3:.2f} ({min(p.rounds) * 1e3:.2f}-{max(p.rounds) * 1e3:.2f})",
                    f"{statistics.median(p.ratios):.3f} ({min(p.ratios):.3f}-{max(p.ratios):.3f})",
                    f"{errors.get(p.name, 0.0):.1e}"))
    return out


HEAD = ("program", "residuals/device", "less inputs", "residuals, all", "peak/device", "step ms (min-max)",
        "x jit (min-max)", "grad err")


def compare(title: str, groups: list[tuple[str, Callable, list[tuple]]], dtype: Any, *, rounds: int,
            iters: int) -> str:
    """One section: jaxaot and jit programs of every group, checked, then timed taking turns.

    ``groups``: (label, loss, input sets); ratios are to the first group's jit program.
    """
    programs, refs = [], []
    for label, loss, sets in groups:
        ref = jit_program(label, loss, sets)
        programs += [*jaxaot_programs(label, loss, sets), ref]
        refs.append(ref)
    errors = {}
    for ref in refs:
        group = [p for p in programs if p.sets is ref.sets]
        errors.update(check_grads(group, ref, dtype))
    time_interleaved(programs, refs[0], rounds=rounds, iters=iters)
    return f"## {title}\n" + table([HEAD, *rows(programs, errors)])


def main(argv: list[str] | None = None) -> str:
    """Run the sections and write the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU-sized GPT in f32 (default: the GPU size, bf16)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--iters", type=int, default=5, help="timed steps per program and round (median)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of interleaved timing")
    a = ap.parse_args(argv)
    jaxaot.config.tune_in_background = False  # steady-state steps: each signature's first call makes its choices
    loss, params, x, dtype = gpt(a.small)
    n = jax.device_count()
    if x.shape[0] % n:
        raise SystemExit(f"the batch ({x.shape[0]}) does not split over {n} devices")
    mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,))
    model = jax.make_mesh((n,), ("model",), axis_types=(AxisType.Auto,))
    one = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1])
    shape = "x".join(map(str, x.shape))
    kw = dict(rounds=a.rounds, iters=a.iters)
    sections = [
        lambda: compare(f"data parallel: batch over {n} devices, params replicated (gpt 12 layers, {shape}, "
                        f"{jnp.dtype(dtype).name})", [("", loss, placed_sets(params, x, lambda k, s: P(), mesh))],
                        dtype, **kw),
        lambda: compare(f"FSDP: batch and params over {n} devices (params split along their largest dim)",
                        [("", loss, placed_sets(params, x, lambda k, s: fsdp_spec(s, n), mesh))], dtype, **kw),
        lambda: compare(f"tensor parallel: each block's products split Megatron-style over {n} devices, batch "
                        "replicated", [("", loss, placed_sets(params, x, lambda k, s: megatron_spec(k, s, n), model,
                                                              P()))], dtype, **kw),
    ]
    if n >= 4 and n % 2 == 0 and x.shape[0] % (n // 2) == 0:
        grid = jax.make_mesh((n // 2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        sections.append(lambda: compare(
            f"data x tensor parallel: batch over {n // 2} devices, each block's products over 2",
            [("", loss, placed_sets(params, x, lambda k, s: megatron_spec(k, s, 2), grid))], dtype, **kw))
    sections.append(lambda: compare("one-device mesh vs unsharded (ratios to jit on plain arrays)",
                                    [(" [plain]", loss, placed_sets(params, x, None, None)),
                                     (" [1-device mesh]", loss, placed_sets(params, x, lambda k, s: P(), one))],
                                    dtype, **kw))
    note = (f"# {n} {jax.devices()[0].platform} devices; min-cut partitioner. Residual columns: f.forward's "
            "residuals (every input differentiated); the fused row's 'residuals, all' is its own params-only "
            "split. peak/device: the larger of forward and backward for jaxaot, max(peak_memory_in_bytes, "
            "arguments + outputs + temporaries - aliased) per executable. The split step also computes the "
            "batch's gradient. grad err: largest relative error of a param gradient against the same group's "
            "jit(value_and_grad).")
    return report("bench_sharding: jaxaot on a mesh vs jax.jit(jax.value_and_grad)",
                  itertools.chain([note], (s() for s in sections)), a.out)


if __name__ == "__main__":
    main()
