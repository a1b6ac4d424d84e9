"""Shared timing and reporting for the benchmarks: headers, interleaved timing, tables, results paths."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re
import signal
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import jax

from jaxaot._src.fusion import compiled_peak


RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def device_tag(devices: int = 1) -> str:
    """The device kind a results file is named after: ``cpu``, ``gpu_h100``, ``gpu_h200``, and for a
    benchmark over ``devices > 1`` devices, ``gpu_h200x2``, from the first device's platform and the
    first model-like word of its kind (``"NVIDIA H100 80GB HBM3"``: ``h100``)."""
    dev = jax.devices()[0]
    m = re.search(r"\b[a-z]+\d+[a-z]*\b", str(getattr(dev, "device_kind", "")).lower())
    tag = dev.platform if dev.platform == "cpu" or not m else f"{dev.platform}_{m.group(0)}"
    return tag + (f"x{devices}" if devices > 1 else "")


def result_path(bench: str, devices: int = 1) -> pathlib.Path:
    """``benchmarks/results/<bench>_<device tag>.txt``: where a benchmark's latest output is kept."""
    return RESULTS / f"{bench}_{device_tag(devices)}.txt"


def header(title: str) -> str:
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    return (
        f"# {title}\n"
        f"# date: {datetime.date.today().isoformat()}  machine: {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} cpus)  device: {dev.platform} {kind}\n"
        f"# jax {jax.__version__}  jaxlib {jax.lib.__version__ if hasattr(jax.lib, '__version__') else '?'}  "
        f"python {platform.python_version()}\n"
    )


class TimeUp(Exception):
    """A run's time limit came (``timeout``'s SIGTERM, after :func:`raise_on_sigterm`): a benchmark catches it
    and keeps what it measured."""


_TIME_UP = [False]


def raise_on_sigterm() -> None:
    """From now on the first SIGTERM raises :class:`TimeUp` in the main thread (a second ends the process), so a
    benchmark that ``timeout`` stops still writes its tables; ``benchmarks/run_gpu.sh`` keeps the file."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _TIME_UP[0] = True
        raise TimeUp(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def time_is_up() -> bool:
    """Whether :class:`TimeUp` was raised: what is left to measure is not begun."""
    return _TIME_UP[0]


def report(title: str, sections: Iterable[str], out: str | None = None) -> str:
    """Print a header and each section as it is produced; also write them all to ``out``."""
    parts = [header(title)]
    print(parts[0], flush=True)
    for section in sections:
        parts.append(section)
        print(section + "\n", flush=True)
    text = "\n\n".join(parts) + "\n"
    if out:
        pathlib.Path(out).write_text(text)
    return text


def median_time(fn: Callable[[], Any], *, warmup: int = 3, iters: int = 20, min_seconds: float = 0.2) -> float:
    """Median seconds per call; each call's result is blocked on."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    start = time.perf_counter()
    while len(times) < iters or (time.perf_counter() - start < min_seconds and len(times) < 10 * iters):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def loop_time(fn: Callable[[], Any], *, n: int = 200, repeats: int = 5) -> float:
    """Best-of-``repeats`` mean seconds per call over ``n`` back-to-back calls (for overheads)."""
    for _ in range(3):
        jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            r = fn()
        jax.block_until_ready(r)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def weighing(f: Any) -> bool:
    """Whether an ``aot_function``'s fused step is still weighed by the calls after its first (its choice not
    yet made: ``jaxaot.config.tune_in_background``); False for anything without ``cache_info``."""
    info = getattr(f, "cache_info", None)
    return info is not None and any(c.runs is None for e in info().entries for c in e.fused)


def provisional(f: Any, args: tuple) -> bool:
    """Whether an ``aot_function``'s step for ``args`` still runs an executable the byte-budget search compiled with
    cheaper options, its runtime compile going on on a worker (CPU); False for anything without ``lookup``."""
    from jaxaot._src.compile.cache import Provisional

    lookup = getattr(f, "lookup", None)
    if lookup is None:
        return False
    exes = lookup(args, {}).programs.executables.values()
    return any(isinstance(getattr(e, "executable", None), Provisional) and not e.executable.final.done() for e in exes)


def tree_nbytes(tree: Any) -> int:
    return sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(tree))


def table(rows: Sequence[Sequence[Any]]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def peak_bytes(compiled: Any) -> int | None:
    """Peak device memory of a compiled executable, where the backend reports it."""
    return compiled_peak(compiled)
