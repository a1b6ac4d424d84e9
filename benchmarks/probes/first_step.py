"""Where a fresh process's first step goes: XLA compiles, counted and timed by who asked for them.

Runs one ``bench_budget`` spec's first step (trace, plan, compile, run) in this process and
prints its wall time, then every backend compile grouped by the jaxaot frames that led to it
(the innermost four), with their count and seconds, most expensive first.

Usage (from the repository root; run it in a fresh process per spec)::

    python -m benchmarks.probes.first_step MODEL SPEC [--size gpu|small|tiny] [--measure-defaults]

(SPEC as ``bench_budget``'s: ``jax:none``, ``jaxaot:1.0``, ``jaxaot:<bytes>``.) ``--measure-defaults``
makes a byte budget's search measure with the backend's own compiler options, as on accelerators
(on CPU it uses cheaper ones), so that on CPU too the runtime runs the chosen plan's measuring
executable; the line after the total says how many such executables the runtime took.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback

import jax
from jax._src import compiler  # a probe may reach into JAX: it counts the backend's compiles

from benchmarks.bench_budget import all_models, step_of
from jaxaot._src.partition import measured_executables
from jaxaot._src.partition.budget import step_peak

_seconds: collections.Counter = collections.Counter()
_counts: collections.Counter = collections.Counter()


def _counted(compile_fn):
    def wrapped(*args, **kwargs):
        frames = [f"{f.filename.split('jaxaot/_src/')[-1]}:{f.name}" for f in traceback.extract_stack()
                  if "jaxaot/_src" in f.filename]
        key = " < ".join(reversed(frames[-4:])) or "(outside jaxaot)"
        t = time.perf_counter()
        try:
            return compile_fn(*args, **kwargs)
        finally:
            _seconds[key] += time.perf_counter() - t
            _counts[key] += 1
    return wrapped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("spec")
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--measure-defaults", action="store_true",
                    help="a byte budget's search measures with the backend's own compiler options")
    a = ap.parse_args()
    if a.measure_defaults:
        step_peak.MEASURE_OPTIONS = {}
    name = "backend_compile_and_load" if hasattr(compiler, "backend_compile_and_load") else "backend_compile"
    setattr(compiler, name, _counted(getattr(compiler, name)))
    model = all_models(a.size)[a.model]
    args = jax.block_until_ready(model.make_args(jax.random.key(0)))
    step = step_of(model, a.spec)
    t = time.perf_counter()
    jax.block_until_ready(step(*args))
    wall = time.perf_counter() - t
    print(f"# {a.model} {a.spec} ({jax.devices()[0].device_kind}): first step {wall:.2f} s, "
          f"{sum(_counts.values())} compiles, {sum(_seconds.values()):.2f} s compiling")
    held = measured_executables.counts()
    print(f"# measuring executables: {held.kept} held by the search, {held.taken} taken by the runtime")
    for key, secs in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        print(f"{secs:8.2f} s {_counts[key]:4d}x  {key}")


if __name__ == "__main__":
    main()
