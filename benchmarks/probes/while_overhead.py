"""Where the time of a ``checkpoints=k`` while-loop gradient goes: the per-iteration trip-count wait.

Same loop as ``bench_while_loop.py`` (batch 256, width 1024, 2000 steps, k=40).
Times, interleaved (median of rounds, min-max):

* per-iteration cost of a dynamic while loop with an empty body (the trip-count sync);
* forward only: ``lax.scan``, ``lax.while_loop`` (run-time n), and jaxaot's
  ``checkpoints=k`` forward with its snapshots (``jax.vjp`` returning the residuals);
* the whole gradient: ``lax.scan``, ``max_steps``, ``checkpoints=k``.

Writes the optimized HLO of the ``checkpoints=k`` gradient to ``$OUT/ckpt_hlo.txt``
(count the kernels per loop body), and, with ``--flags``, runs again in a child process
per XLA flag set (command buffers around while loops).

With ``--trace``, each gradient also runs under ``jax.profiler.trace``: its device time (the
sum of its kernels), kernel launches per call and its most expensive kernels, so the wall time
splits into device work and the gaps between kernels (launches, predicate waits).

With ``--body-ops``, it only compiles the ``checkpoints=k`` gradient and prints the top-level ops
of each while loop's body in its optimized HLO, by kind (on a GPU each is a kernel launch per
iteration); on other platforms the loops are lowered as on a GPU (``blocked_loops`` and
``online_block=GPU_BLOCK``). ``--hlo FILE`` counts a saved HLO text (``ckpt_hlo.txt``) instead.
``--looped`` keeps the blocks' steps in a loop (``jaxaot.config.unroll_blocks=False``; they are unrolled by default).

Usage (from the repository root)::

    python -m benchmarks.probes.while_overhead [--flags] [--trace] [--looped] [--small] [--n 2000] [--k 40] [--rounds 7]
    python -m benchmarks.probes.while_overhead --body-ops [--small] [--hlo FILE] [--looped]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

import jaxaot
from jaxaot.loops import while_loop

DT = 0.05
FLAG_SETS = {
    "default": "",
    "cmdbuf+while": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
                    "--xla_gpu_graph_min_graph_size=1",
}


def step(x, w, b):
    return x + DT * jnp.tanh(x @ w + b)


def cases(n_static: int, k: int):
    def scan_loss(w, b, x, n):
        return jnp.sum(lax.scan(lambda c, _: (step(c, w, b), None), x, None, length=n_static)[0] ** 2)

    def jl(w, b, x, n, **kw):
        return jnp.sum(while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], w, b)),
                                  (jnp.int32(0), x), **kw)[1] ** 2)

    def lax_fwd(w, b, x, n):
        return jnp.sum(lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], w, b)),
                                      (jnp.int32(0), x))[1] ** 2)

    def empty(w, b, x, n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 1.0), (jnp.int32(0), jnp.float32(0)))[1]

    def ckpt_fwd(w, b, x, n):
        out, vjp = jax.vjp(lambda w, b, x: jl(w, b, x, n, checkpoints=k), w, b, x)
        return out, vjp

    g = lambda f, **kw: (lambda w, b, x, n: jax.grad(f, argnums=(0, 1, 2))(w, b, x, n, **kw))  # noqa: E731
    return {
        "empty dynamic while (n iters)": empty,
        "fwd lax.scan": lambda w, b, x, n: jnp.sum(lax.scan(lambda c, _: (step(c, w, b), None), x, None,
                                                            length=n_static)[0] ** 2),
        "fwd lax.while_loop": lax_fwd,
        f"fwd checkpoints={k} (+snapshots)": ckpt_fwd,
        "grad lax.scan": g(scan_loss),
        f"grad max_steps={n_static}": g(jl, max_steps=n_static),
        f"grad checkpoints={k}": g(jl, checkpoints=k),
    }


def kernels(compiled: dict, args: tuple, calls: int = 3, top: int = 12) -> str:
    """Each gradient's device time and kernel launches per call, from a profiler trace, and its
    ``top`` kernels by device time."""
    from benchmarks.probes.kernel_times import _trace  # noqa: PLC0415 - only with --trace
    out = []
    for name, c in compiled.items():
        if not name.startswith("grad"):
            continue
        events, lines = _trace(c, args, calls)
        if not events:
            out.append(f"### {name}: no kernel events; device lines seen: {', '.join(lines) or 'none'}")
            continue
        busy = sum(map(sum, events.values())) / calls
        out.append(f"### {name}: device {busy * 1e3:.2f} ms/call, {sum(map(len, events.values())) / calls:.0f} "
                   f"kernels/call")
        for kname, ts in sorted(events.items(), key=lambda kv: -sum(kv[1]))[:top]:
            out.append(f"  {kname[:60]:60s} {sum(ts) / calls * 1e3:9.3f} ms {len(ts) / calls:8.0f} calls "
                       f"{sum(ts) / len(ts) * 1e6:7.2f} us each")
    return "\n".join(out)


def run(batch: int, width: int, n: int, k: int, rounds: int, label: str, trace: bool = False) -> str:
    key = jax.random.key(0)
    kw, kx = jax.random.split(key)
    w = jax.random.normal(kw, (width, width), jnp.float32) / width ** 0.5
    b = jnp.zeros((width,), jnp.float32)
    x = jax.random.normal(kx, (batch, width), jnp.float32)
    args = (w, b, x, jnp.int32(n))
    compiled, compile_seconds = {}, {}
    for name, fn in cases(n, k).items():
        t = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(*args).compile()
        compile_seconds[name] = time.perf_counter() - t
        jax.block_until_ready(compiled[name](*args))
        if name.startswith("grad checkpoints") and os.environ.get("OUT") and label == "default":
            with open(os.path.join(os.environ["OUT"], "ckpt_hlo.txt"), "w") as f:
                f.write(compiled[name].as_text())
    times = {name: [] for name in compiled}
    for r in range(rounds):
        for name, c in (compiled.items() if r % 2 == 0 else reversed(compiled.items())):
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[name].append(time.perf_counter() - t0)
    lines = [f"## flags: {label}  ({jax.devices()[0].device_kind}, jax {jax.__version__}, n={n}, k={k})",
             f"{'case':40s} {'ms':>9s} {'us/iter':>9s} {'spread ms':>18s} {'compile s':>9s}"]
    for name, ts in times.items():
        med = statistics.median(ts) * 1e3
        lines.append(f"{name:40s} {med:9.2f} {med * 1e3 / n:9.2f} {min(ts) * 1e3:8.2f}-{max(ts) * 1e3:8.2f} "
                     f"{compile_seconds[name]:9.2f}")
    if trace:
        lines.append(kernels(compiled, args))
    return "\n".join(lines)


#: HLO instructions that launch nothing: tuple plumbing, constants, views.
_FREE_OPS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def _computations(text: str) -> dict:
    """Each computation of an HLO module's text: its instructions as ``(opcode, line)``."""
    comps, cur = {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            cur = comps.setdefault(head.group(1), [])
        elif line.startswith("}"):
            cur = None
        elif cur is not None:
            op = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = .+? ([\w\-]+)\(", line)
            if op:
                cur.append((op.group(1), line))
    return comps


def body_ops(text: str) -> str:
    """A table of each while loop's body: its trip count where XLA knows it, and its top-level ops
    by kind (the condition's in the last column)."""
    comps = _computations(text)
    rows = [f"{'while body':44s} {'trip':>5s} {'ops':>4s}  by kind; condition"]
    for name, ops in comps.items():
        for op, line in ops:
            if op != "while":
                continue
            body, cond = (re.search(rf"{key}=%?([\w.\-]+)", line).group(1) for key in ("body", "condition"))
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            kinds = collections.Counter(o for o, _ in comps[body] if o not in _FREE_OPS)
            cond_ops = sum(o not in _FREE_OPS for o, _ in comps[cond])
            rows.append(f"{body[:44]:44s} {trip.group(1) if trip else '-':>5s} {sum(kinds.values()):4d}  "
                        f"{dict(sorted(kinds.items()))}; {cond_ops}")
    return "\n".join(rows)


def compiled_gradient_hlo(batch: int, width: int, n: int, k: int) -> str:
    """The optimized HLO of the ``checkpoints=k`` gradient, its loops lowered as on a GPU."""
    import jaxaot  # noqa: PLC0415
    from jaxaot._src.loops.checkpointed import GPU_BLOCK  # noqa: PLC0415 - the GPU's block size
    w, b, x = jnp.eye(width), jnp.zeros((width,)), jnp.ones((batch, width))
    grad = cases(n, k)[f"grad checkpoints={k}"]
    with jaxaot.config.override(blocked_loops=True, online_block=GPU_BLOCK):
        return jax.jit(grad).lower(w, b, x, jnp.int32(n)).compile().as_text()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", action="store_true", help="also run under each XLA flag set, in child processes")
    ap.add_argument("--child", default="default")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--k", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--trace", action="store_true", help="device time and kernels per gradient (profiler)")
    ap.add_argument("--body-ops", action="store_true", help="only the ops per while body of the gradient's HLO")
    ap.add_argument("--hlo", help="with --body-ops: count this saved HLO text instead of compiling")
    ap.add_argument("--looped", action="store_true", help="keep the blocks' steps of checkpoints=k loops in a loop")
    args = ap.parse_args()
    if args.looped:
        jaxaot.config.unroll_blocks = False
        print("# the blocks' steps in a loop (jaxaot.config.unroll_blocks=False)", flush=True)
    batch, width = (32, 128) if args.small else (256, 1024)
    if args.body_ops:
        if args.hlo:
            with open(args.hlo) as f:
                text = f.read()
        else:
            text = compiled_gradient_hlo(batch, width, args.n, args.k)
        print(body_ops(text), flush=True)
        return
    print(run(batch, width, args.n, args.k, args.rounds, args.child, args.trace), flush=True)
    if args.flags:
        for label, flags in FLAG_SETS.items():
            if label == "default":
                continue
            env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
            cmd = [sys.executable, "-m", "benchmarks.probes.while_overhead", "--child", label, "--n", str(args.n), "--k", str(args.k),
                   "--rounds", str(args.rounds)] + (["--small"] if args.small else [])
            cmd += ["--looped"] if args.looped else []
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
            print(res.stdout if res.returncode == 0 else f"## flags: {label}: failed\n{res.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
