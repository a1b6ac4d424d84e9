"""Simulate every schedule from per-op times that a bench_pipeline run recorded (no device needed).

Reads the "per-op times, N stages, one device" table of a bench_pipeline result
file and prints each schedule's predicted step time and bubble fraction on N
devices (one stage per device; interleaved is left out, as it needs the 2N-stage
table) for 4, 8 and 16 microbatches, with B and W split (zero-bubble) and fused
(the others).

Usage: ``python benchmarks/simulate_from_results.py RESULTS_FILE STAGES [--out FILE]``.
"""

from __future__ import annotations

import argparse
import re
import sys

from jaxaot.parallel.builtin import make_schedule
from jaxaot.parallel.simulate import OpTimes, simulate

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import table  # noqa: E402


def op_times(text: str, stages: int) -> OpTimes:
    """The OpTimes of the ``stages``-stage table in a bench_pipeline report (seconds)."""
    block = text.split(f"## per-op times, {stages} stages, one device")[1].split("##")[0]
    rows = [list(map(float, line.split()[1:5])) for line in block.splitlines() if re.match(r"^\d+\s", line)]
    f, b, w, bw = (tuple(r[i] / 1e3 for r in rows) for i in range(4))
    return OpTimes(forward=f, backward_input=b, backward_weight=w, backward=bw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("stages", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    text = open(a.results).read()
    times = op_times(text, a.stages)
    rows = [("schedule", "stages", "microbatches", "step ms", "bubble")]
    for name in ("gpipe", "1f1b", "zero_bubble"):
        for m in (4, 8, 16):
            sim = simulate(make_schedule(name, a.stages, m), times)
            rows.append((name, a.stages, m, f"{sim.step_time * 1e3:.3f}", f"{sim.bubble_fraction:.3f}"))
    header = "".join(line + "\n" for line in text.splitlines()[:3])
    report = (f"{header}# simulated from the per-op times of {a.results.rsplit('/', 1)[-1]} "
              f"({a.stages} stages, one device), transfers free\n\n{table(rows)}\n")
    print(report)
    if a.out:
        open(a.out, "w").write(report)


if __name__ == "__main__":
    main()
