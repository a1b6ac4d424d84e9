"""A fresh process's first step of a fraction, and the calls after it until the fused step's choice is made.

With ``jaxaot.config.tune_in_background`` on (``bg``) the first call returns once the fused step
compiles and the calls that follow make the variant and fused-or-split choices; off (``fg``) the
first call makes them. Prints one JSON line: the first step's seconds, the calls and seconds
until the choice was made, the median step while weighing and after, and the choice (layouts,
order, barrier, residuals derived again, what runs, why). Run the modes alternately, each in a
fresh process.

Usage (from the repository root)::

    python -m benchmarks.probes.tuning bg|fg MODEL FRACTION [--size gpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

import jaxaot
from benchmarks.bench_budget import all_models
from benchmarks.harness import weighing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("bg", "fg"))
    ap.add_argument("model")
    ap.add_argument("fraction", type=float)
    ap.add_argument("--size", default="gpu")
    a = ap.parse_args()
    m = all_models(a.size)[a.model]
    args = jax.block_until_ready(m.make_args(jax.random.key(0)))
    with jaxaot.config.override(tune_in_background=a.mode == "bg"):
        pf = jaxaot.partition.min_cut_rematerialization_partition(memory_budget=a.fraction)
        f = jaxaot.aot_function(m.loss, partition_fn=pf)
        vg = jaxaot.value_and_grad(f, argnums=m.argnums)
        t = time.perf_counter()
        jax.block_until_ready(vg(*args))
        first = time.perf_counter() - t
        while_weighing: list[float] = []
        while weighing(f) and len(while_weighing) < 5000:
            s = time.perf_counter()
            jax.block_until_ready(vg(*args))
            while_weighing.append(time.perf_counter() - s)
        decided = time.perf_counter() - t
        after = []
        for _ in range(20):
            s = time.perf_counter()
            jax.block_until_ready(vg(*args))
            after.append(time.perf_counter() - s)
    (c,) = f.cache_info().entries[0].fused
    ms = lambda xs: round(1e3 * statistics.median(xs), 3) if xs else None  # noqa: E731
    print(json.dumps(dict(mode=a.mode, model=a.model, budget=a.fraction, first_s=round(first, 2),
                          calls=len(while_weighing), decided_s=round(decided, 2), step_ms_while=ms(while_weighing),
                          step_ms_after=ms(after),
                          choice=[c.layouts, c.order, c.barrier, len(c.rederived), c.runs, c.why])))


if __name__ == "__main__":
    main()
