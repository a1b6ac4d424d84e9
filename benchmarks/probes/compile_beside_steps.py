"""Does a compile on a worker thread slow the steps that run meanwhile, or the program it compiles?

The fused step's variants compile on worker threads while the calls after the first run the
step (``jaxaot.config.tune_in_background``). This probe asks what that costs, with two plain
JAX programs of one ``bench_budget`` model: A, ``jit(value_and_grad)``; B, the same under
``jax.checkpoint(dots_saveable)`` per layer (other products, other fusions). It compiles A, then
B either alone (``idle``) or on a thread while this thread runs A's step back to back
(``busy``), and prints one JSON line: the two compiles' seconds, A's median step idle and
during B's compile, and B's median step after (so B's kernels, autotuned beside running steps
or not, are compared across modes). Run the modes alternately, each in a fresh process.

Usage (from the repository root)::

    python -m benchmarks.probes.compile_beside_steps idle|busy MODEL
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import jax

from benchmarks.bench_budget import all_models, jax_step


def _times(f, args, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("idle", "busy"))
    ap.add_argument("model")
    ap.add_argument("--size", default="gpu")
    a = ap.parse_args()
    m = all_models(a.size)[a.model]
    args = jax.block_until_ready(m.make_args(jax.random.key(0)))
    first = jax_step(m, None)
    second = jax_step(m, jax.checkpoint_policies.dots_saveable, per_layer=m.per_layer is not None)
    t = time.perf_counter()
    ca = first.lower(*args).compile()
    a_compile = time.perf_counter() - t
    jax.block_until_ready(ca(*args))
    idle = _times(ca, args, 10)
    box, during = {}, []

    def compile_second():
        t = time.perf_counter()
        box["exe"] = second.lower(*args).compile()
        box["seconds"] = time.perf_counter() - t

    if a.mode == "busy":
        thread = threading.Thread(target=compile_second)
        thread.start()
        while thread.is_alive():
            during += _times(ca, args, 1)
        thread.join()
    else:
        compile_second()
    cb = box["exe"]
    jax.block_until_ready(cb(*args))
    b_steps, a_steps = [], []
    for _ in range(5):
        b_steps += _times(cb, args, 4)
        a_steps += _times(ca, args, 4)
    ms = lambda xs: round(1e3 * statistics.median(xs), 3) if xs else None  # noqa: E731
    print(json.dumps(dict(mode=a.mode, model=a.model, a_compile_s=round(a_compile, 2),
                          b_compile_s=round(box["seconds"], 2), a_idle_ms=ms(idle), a_during_ms=ms(during),
                          steps_during=len(during), b_step_ms=ms(b_steps), a_after_ms=ms(a_steps))))


if __name__ == "__main__":
    main()
