"""Where a fresh process's first step goes: XLA compiles, counted and timed by who asked for them.

Runs one ``bench_budget`` spec's first step (trace, plan, compile, run) in this process and
prints its wall time, then every backend compile grouped by the jaxaot frames that led to it
(the innermost four; on a worker thread, its two and the submitting thread's three), with
their count and seconds, most expensive first. Compiles on workers overlap, so their seconds
add up to more than the wall time they took.

With ``--wall``, a thread samples the main thread's jaxaot frames every few milliseconds and prints
where its wall time went (the innermost two frames, waiting for a worker's compile included), and each
group of compiles' first start and last end: the first step's critical path.

With ``--peaks`` (a backend reporting ``memory_stats``), a thread samples the device's
``peak_bytes_in_use`` while the step runs and prints each rise with the jaxaot frames the main
thread was in at the time, so the plan-time work that raises the process peak above the
step's compiled peak is named.

Usage (from the repository root; run it in a fresh process per spec)::

    python -m benchmarks.probes.first_step MODEL SPEC [--size gpu|small|tiny] [--wall] [--peaks] [--measure-defaults]

(SPEC as ``bench_budget``'s: ``jax:none``, ``jaxaot:1.0``, ``jaxaot:<bytes>``.) ``--measure-defaults``
makes a byte budget's search measure with the backend's own compiler options, as on accelerators
(on CPU it uses cheaper ones), so that on CPU too the runtime runs the chosen plan's measuring
executable; the line after the total says how many such executables the runtime took.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
import traceback

import jax
from jax._src import compiler  # a probe may reach into JAX: it counts the backend's compiles

from benchmarks.bench_budget import all_models, step_of
from jaxaot._src import allowance, workers
from jaxaot._src.partition import measured_executables
from jaxaot._src.partition.budget import step_peak

_seconds: collections.Counter = collections.Counter()
_counts: collections.Counter = collections.Counter()
_spans: dict[str, list[float]] = {}  # compile group -> [first start, last end] (perf_counter)


_origin = threading.local()  # on a compile thread: the jaxaot frames of the thread that handed it its work


def _jaxaot_frames(stack) -> list[str]:
    return [f"{f.filename.split('jaxaot/_src/')[-1]}:{f.name}" for f in stack
            if "jaxaot/_src" in f.filename and not f.filename.endswith("workers.py")]


def _carrying(submit):
    """``workers.submit`` whose work, on its thread, knows the frames that submitted it."""
    def wrapped(fn, *args, **kwargs):
        frames = getattr(_origin, "frames", []) + _jaxaot_frames(traceback.extract_stack()[:-1])

        def run(*a, **k):
            _origin.frames = frames
            try:
                return fn(*a, **k)
            finally:
                _origin.frames = []
        return submit(run, *args, **kwargs)
    return wrapped


#: Frames that hand a compile over, left out of the submitting thread's (they say nothing of who asked).
_PASSING = ("step_peak.py:start_peak", "step_peak.py:program_peak", "search.py:start", "search.py:measure")


def _counted(compile_fn):
    def wrapped(*args, **kwargs):
        origin, here = getattr(_origin, "frames", []), _jaxaot_frames(traceback.extract_stack())
        origin = [f for f in origin if not f.endswith(_PASSING)]
        frames = origin[-3:] + here[-2:] if origin else here[-4:]  # on a compile thread: who handed it over
        key = " < ".join(reversed(frames)) or "(outside jaxaot)"
        t = time.perf_counter()
        try:
            return compile_fn(*args, **kwargs)
        finally:
            end = time.perf_counter()
            _seconds[key] += end - t
            _counts[key] += 1
            span = _spans.setdefault(key, [t, end])
            span[0], span[1] = min(span[0], t), max(span[1], end)
    return wrapped


def _frames(frame) -> str:
    names = [f"{f.filename.split('jaxaot/_src/')[-1]}:{f.name}" for f in traceback.extract_stack(frame)
             if "jaxaot/_src" in f.filename]
    return " < ".join(reversed(names[-4:])) or "(outside jaxaot)"


class PeakSampler(threading.Thread):
    """Samples ``peak_bytes_in_use`` of ``device`` and keeps each rise with the main thread's frames."""

    def __init__(self, device) -> None:
        super().__init__(daemon=True)
        self.device, self.main = device, threading.main_thread().ident
        self.rises: list[tuple[int, int, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        last = (self.device.memory_stats() or {}).get("peak_bytes_in_use", 0)
        while not self.done.is_set():
            stats = self.device.memory_stats() or {}
            peak = stats.get("peak_bytes_in_use", 0)
            if peak > last:
                frame = sys._current_frames().get(self.main)
                self.rises.append((peak, stats.get("bytes_in_use", 0), _frames(frame) if frame else "?"))
                last = peak
            time.sleep(0.0005)


class WallSampler(threading.Thread):
    """Counts the main thread's innermost two jaxaot frames every ``interval`` seconds: where its wall time goes."""

    def __init__(self, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.main, self.interval = threading.main_thread().ident, interval
        self.seen: collections.Counter = collections.Counter()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            frame = sys._current_frames().get(self.main)
            names = ([f"{f.filename.split('jaxaot/_src/')[-1]}:{f.name}" for f in traceback.extract_stack(frame)
                      if "jaxaot/_src" in f.filename] if frame else [])
            self.seen[" < ".join(reversed(names[-2:])) or "(outside jaxaot)"] += 1
            time.sleep(self.interval)

    def report(self, wall: float, start: float) -> list[str]:
        total = max(sum(self.seen.values()), 1)
        lines = ["# the main thread's wall time, by its innermost jaxaot frames (share of the first step)"]
        lines += [f"{wall * n / total:8.2f} s {100 * n / total:5.1f}%  {key}" for key, n in self.seen.most_common(14)]
        lines.append("# compiles by group: first start and last end, seconds after the first step began")
        lines += [f"{a - start:7.2f} - {b - start:7.2f}  {key}" for key, (a, b) in sorted(_spans.items(),
                                                                                       key=lambda kv: kv[1][0])]
        return lines


def _log_timings() -> list[str]:
    """Wraps the op timings so each logs its eqn, planned bytes, the byte limit and the device peak after it."""
    from jaxaot._src.partition.costs import op_profile, op_scaling

    lines: list[str] = []
    run_timing = op_profile.run_timing

    def logged(timing, device, repeats=3):
        before = (device.memory_stats() or {}).get("bytes_in_use", 0)
        try:
            return run_timing(timing, device, repeats)
        finally:
            stats = device.memory_stats() or {}
            eqn = timing.eqn
            held = [op_profile.held_bytes(e) for e in (timing.one, timing.many)]
            lines.append(f"  {eqn.primitive.name:24s} {op_scaling.footprint(eqn) / 2**20:8.1f} MiB x {timing.copies}"
                         f" (x{timing.factor:.2f})  limit {allowance.current_limit()}  compiled one/chain "
                         f"{[round((h or 0) / 2**20, 1) for h in held]} MiB  in use before "
                         f"{before / 2**20:8.1f} MiB  peak after {stats.get('peak_bytes_in_use', 0) / 2**20:8.1f} MiB"
                         f"  {eqn.params.get('preferred_element_type', '')} "
                         f"{[f'{v.aval.dtype}{list(v.aval.shape)}' for v in (*eqn.invars, *eqn.outvars)]}")

    op_profile.run_timing = logged
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("spec")
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--peaks", action="store_true", help="sample the device's peak memory and name its rises")
    ap.add_argument("--wall", action="store_true", help="sample where the main thread's wall time goes")
    ap.add_argument("--measure-defaults", action="store_true",
                    help="a byte budget's search measures with the backend's own compiler options")
    a = ap.parse_args()
    if a.measure_defaults:
        step_peak.MEASURE_OPTIONS = {}
    name = "backend_compile_and_load" if hasattr(compiler, "backend_compile_and_load") else "backend_compile"
    setattr(compiler, name, _counted(getattr(compiler, name)))
    workers.submit = _carrying(workers.submit)
    model = all_models(a.size)[a.model]
    args = jax.block_until_ready(model.make_args(jax.random.key(0)))
    step = step_of(model, a.spec)
    sampler = PeakSampler(jax.devices()[0]) if a.peaks else None
    timings = _log_timings() if a.peaks else []
    before = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    if sampler is not None:
        sampler.start()
    walls = WallSampler() if a.wall else None
    if walls is not None:
        walls.start()
    t = time.perf_counter()
    jax.block_until_ready(step(*args))
    wall = time.perf_counter() - t
    if walls is not None:
        walls.done.set()
        walls.join()
    print(f"# {a.model} {a.spec} ({jax.devices()[0].device_kind}): first step {wall:.2f} s, "
          f"{sum(_counts.values())} compiles, {sum(_seconds.values()):.2f} s compiling")
    held = measured_executables.counts()
    print(f"# measuring executables: {held.kept} held by the search, {held.taken} taken by the runtime")
    for key, secs in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        print(f"{secs:8.2f} s {_counts[key]:4d}x  {key}")
    if walls is not None:
        print("\n".join(walls.report(wall, t)))
    if sampler is not None:
        time.sleep(0.01)
        sampler.done.set()
        sampler.join()
        compiled = step.lower(*args).compile()
        peak = compiled.peak_bytes if hasattr(compiled, "peak_bytes") else compiled.memory_analysis().peak_memory_in_bytes
        final = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        if final is None:
            print("# this backend reports no peak_bytes_in_use")
            return
        print(f"# process peak {final} B after the first step ({final / peak:.3f}x the step's compiled peak "
              f"{peak} B); {before} B before it (the inputs)")
        big = [r for r in sampler.rises if r[0] > 1.01 * peak] or sampler.rises[-12:]
        for pk, inuse, where in big:
            print(f"  peak {pk / 2**20:9.1f} MiB ({pk / peak:.3f}x)  in use {inuse / 2**20:9.1f} MiB  {where}")
        print("# op timings: eqn, bytes per copy x copies (shrunk by), the byte limit, the device peak after")
        print("\n".join(timings))


if __name__ == "__main__":
    main()
