"""Compiled autograd against eager JAX, per-step jit of vjp_fn, and a fully jitted step; what recording costs.

Workloads: an MLP (on CPU the 6 layers of width 64, batch 32, in two forms: Python looks at a
value every step, ``if h.mean() > 10``, or at none), a small transformer block stack (plain JAX)
and a Flax nnx CNN, each an eager training step ``loss, grads = value_and_grad(loss)(params, batch)``.

Methods, timed per step (median over interleaved rounds; spread = min..max of the round medians;
every method compared with ``jit(vg)`` over 10x more steps per round, as a training loop runs one
method step after step, each method's turn in a round after one untimed step):

* ``eager``: ``jax.value_and_grad`` run eagerly (``nnx.value_and_grad`` for the CNN);
* ``jit(vjp_fn)``: eager ``jax.vjp``, then ``jax.jit(vjp_fn)(1.0)``, a new jit each step;
* ``compiled``: ``jaxaot.compiled_value_and_grad`` after one warm-up step (for the CNN, on
  the nnx module itself): the forward is recorded every step;
* ``replay``: the same with ``replay=True``: a step whose guards hold runs the recorded step
  without the forward's Python (modules are not replayed: the CNN records every step);
* ``jit(vg)``: ``jax.jit(jax.value_and_grad(loss))``, the bound (for the MLP that looks at a
  value, of the same function with ``jnp.where`` in place of the Python branch).

``recompiles`` counts XLA backend compiles during the timed rounds (``jax.monitoring``).

A compiled step is two parts: *recording* the forward (Python runs it; JAX operations
are written down, not dispatched) and the cached *executable*, which computes loss and
gradients in one XLA program, started before the recording once two calls in a row ran
it (``jaxaot.config.start_steps_ahead``). The step line times the compiled step with the
setting off too (interleaved), and each part alone, back to back. The backward line
compares the executable's backward part (``executable - jit(loss)``) with the backward
part of the jitted step (``jit(vg) - jit(loss)``); the executable is timed on the
functional loss (for the CNN too), as ``jit(vg)`` is.

The last section measures what a recording costs, piece by piece, on the MLP that looks at a
value: array operators replayed from their templates (``x * 0.5``, ``x ** 3``, a NumPy scalar
times ``x``), a primitive, a jitted ``jax.numpy`` function, ``jax.nn.gelu``'s dtype promotion
and ``jax.nn.gelu``, against eager dispatch of an operator; the argument handling of one
call; the tape and its differentiated inputs; the MLP's forward under a recorder that writes
nothing down (JAX's and the user's Python alone) against its recording; the look's program
alone; the structure key (the trie's node, against building and hashing the whole key); the
compiled-step cache lookup; the step's dispatch (a one-element program, through the executable
and through ``jit``); the MLP's executable (run, and its dispatch alone: the host's share of it), its whole
step, and ``jit(value_and_grad)`` of it (the branch in ``jnp.where``), in the same rounds.

The executable alone is compiled through ``jaxaot._src.autograd.recorded.step`` (``record``,
``compile_step``), the module the compiled step itself uses; no face exports it.

Usage (from the repository root; CPU: ``--small``)::

    python -m benchmarks.bench_compiled_autograd [--small] [--rounds N] [--steps N] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.numpy import util as numpy_util  # a benchmark may reach into JAX: it times JAX's own promotion

import jaxaot
from benchmarks.harness import report
from jaxaot._src import compat
from jaxaot._src.autograd.recorded import call as call_module
from jaxaot._src.autograd.recorded import step as compiled_step
from jaxaot._src.autograd.recorded import structure as structure_module
from jaxaot._src.autograd.recorded import tape as tape_module

_COMPILES = [0]


def _on_event(event: str, duration: float, **_: object) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


# --------------------------------------------------------------------------- workloads
def mlp(small: bool, look: bool = False):
    """On CPU the 6 layers of width 64, batch 32 (gelu); ``look``: Python reads ``h.mean() > 10`` after the
    third layer every step (it is False for this data: the step's program is the same either way).

    Returns ``(loss, params, batch, loss without the Python branch, for jit)``."""
    sizes = [64] * 7 + [10] if small else [512, 1024, 1024, 1024, 10]
    keys = jax.random.split(jax.random.key(0), len(sizes) + 2)
    params = [(jax.random.normal(k, (a, b)) / a ** 0.5, jnp.zeros(b)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    x = jax.random.normal(keys[-2], (32 if small else 256, sizes[0]))
    y = jax.random.normal(keys[-1], (x.shape[0], sizes[-1]))

    def body(params, x, y, branch):
        h = x
        for i, (w, b) in enumerate(params[:-1]):
            h = jax.nn.gelu(h @ w + b)
            if i == 2:
                h = branch(h)
        w, b = params[-1]
        return jnp.mean((h @ w + b - y) ** 2)

    def python_branch(h):
        return 0.5 * h if h.mean() > 10.0 else h

    def traced_branch(h):
        return jnp.where(h.mean() > 10.0, 0.5 * h, h)

    if not look:
        loss = lambda params, x, y: body(params, x, y, lambda h: h)
        return loss, params, (x, y), loss
    return (lambda params, x, y: body(params, x, y, python_branch)), params, (x, y), (
        lambda params, x, y: body(params, x, y, traced_branch))


def transformer(small: bool):
    d, heads, layers, seq, batch = (32, 4, 2, 16, 4) if small else (256, 8, 4, 128, 16)
    keys = iter(jax.random.split(jax.random.key(1), 8 * layers + 4))
    dense = lambda a, b: jax.random.normal(next(keys), (a, b)) / a ** 0.5
    params = [{"qkv": dense(d, 3 * d), "o": dense(d, d), "up": dense(d, 4 * d), "down": dense(4 * d, d),
               "ln1": jnp.ones(d), "ln2": jnp.ones(d)} for _ in range(layers)]
    x = jax.random.normal(next(keys), (batch, seq, d))
    y = jax.random.normal(next(keys), (batch, seq, d))

    def norm(h, g):
        return g * (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)

    def loss(params, x, y):
        h = x
        for p in params:
            q, k, v = jnp.split(norm(h, p["ln1"]) @ p["qkv"], 3, axis=-1)
            split = lambda t: t.reshape(batch, seq, heads, d // heads)
            att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (d // heads) ** 0.5, -1)
            h = h + jnp.einsum("bhqk,bkhd->bqhd", att, split(v)).reshape(batch, seq, d) @ p["o"]
            h = h + jax.nn.gelu(norm(h, p["ln2"]) @ p["up"]) @ p["down"]
        return jnp.mean((h - y) ** 2)

    return loss, params, (x, y), loss


def nnx_cnn(small: bool):
    from flax import nnx

    c, size, batch = (8, 16, 8) if small else (64, 32, 64)

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(3, c, (3, 3), rngs=rngs)
            self.c2 = nnx.Conv(c, c, (3, 3), rngs=rngs)
            self.head = nnx.Linear(c, 10, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.c2(jax.nn.relu(self.c1(x))))
            return self.head(h.mean(axis=(1, 2)))

    model = CNN(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (batch, size, size, 3))
    y = jax.nn.one_hot(jnp.arange(batch) % 10, 10)

    def module_loss(model, x, y):
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(model(x)) * y, -1))

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x, y):  # the functional form, for the jit and vjp baselines
        return module_loss(nnx.merge(graphdef, params, rest), x, y)

    return loss, params, (x, y), module_loss, model, nnx.value_and_grad(module_loss)


# --------------------------------------------------------------------------- methods
def methods(loss, params, batch, jittable=None, module=None):
    """The timed methods on one workload (``jittable``: ``loss`` without its Python branch, for ``jit``)."""
    jittable = jittable or loss
    eager_vg = jax.value_and_grad(loss)
    compiled_vg = jaxaot.compiled_value_and_grad(loss)
    replay_vg = jaxaot.compiled_value_and_grad(loss, replay=True)
    if module is not None:  # the CNN: eager and compiled take the nnx module itself
        module_loss, model, nnx_vg = module
        eager = lambda: nnx_vg(model, *batch)
        compiled_m = jaxaot.compiled_value_and_grad(module_loss)
        replay_m = jaxaot.compiled_value_and_grad(module_loss, replay=True)
        compiled, replay = (lambda: compiled_m(model, *batch)), (lambda: replay_m(model, *batch))
    else:
        eager = lambda: eager_vg(params, *batch)
        compiled, replay = (lambda: compiled_vg(params, *batch)), (lambda: replay_vg(params, *batch))

    def jit_vjp():
        value, vjp_fn = jax.vjp(lambda p: loss(p, *batch), params)
        return value, jax.jit(vjp_fn)(jnp.ones((), value.dtype))

    jit_vg, jit_fwd = jax.jit(jax.value_and_grad(jittable)), jax.jit(jittable)
    def compiled_after():  # the same, its executable run after the recording
        with jaxaot.config.override(start_steps_ahead=False):
            return compiled()

    exe, leaves, args, record = step_executable(loss, params, batch)
    return {
        "eager": eager, "jit(vjp_fn)": jit_vjp, "compiled": compiled, "_compiled_after": compiled_after,
        "replay": replay, "jit(vg)": lambda: jit_vg(params, *batch),
        "_executable": lambda: exe(leaves, args), "_record": record, "_jit_fwd": lambda: jit_fwd(params, *batch),
    }


def step_executable(loss, params, batch):
    """The executable ``compiled_value_and_grad`` runs for ``loss`` (recorded and compiled once, here), its
    arguments, and a function recording the forward alone."""
    leaves, tree = jax.tree_util.tree_flatten((params,))
    forward = lambda p: (loss(p, *batch), None)  # noqa: E731
    recorded = compiled_step.record(forward, leaves, tree, eager=False)
    exe, _ = compiled_step.compile_step(recorded.program, recorded.structure.key[2], (), leaves, recorded.args)

    def record():
        compiled_step.record(forward, leaves, tree, eager=False)

    return exe, leaves, recorded.args, record


#: The methods compared with ``jit(vg)`` (and their parts), timed over this many times more steps per round: the
#: first steps after another method's run slower (caches cold), which a training loop's steps do not.
_FAST, _FAST_REPEATS = ("jit(vg)", "_executable", "_jit_fwd", "replay", "compiled", "_compiled_after"), 10


def time_rounds(fns: dict, rounds: int, steps: int) -> tuple[dict, dict]:
    """Per-method round medians (seconds per step) and backend compiles during the rounds."""
    for fn in fns.values():  # warm-up: compile what compiles once
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    medians = {k: [] for k in fns}
    compiles = {k: 0 for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn())  # one step untimed: the first after another method's is the coldest
            before, times = _COMPILES[0], []
            for _ in range(steps * (_FAST_REPEATS if name in _FAST else 1)):
                t = time.perf_counter()
                jax.block_until_ready(fn())
                times.append(time.perf_counter() - t)
            compiles[name] += _COMPILES[0] - before
            medians[name].append(statistics.median(times))
    return medians, compiles


def section(name: str, fns: dict, rounds: int, steps: int, replayed: bool = True) -> str:
    medians, compiles = time_rounds(fns, rounds, steps)
    med = {k: statistics.median(v) for k, v in medians.items()}
    ms = lambda s: f"{s * 1e3:9.3f}"
    lines = [f"## {name}  ({rounds} interleaved rounds x {steps} steps; ms per step, median [min..max of rounds])",
             f"{'method':<14}{'median':>9}  {'spread':<22}{'vs eager':>9}{'vs jit(vg)':>11}{'recompiles':>11}"]
    for k in ("eager", "jit(vjp_fn)", "compiled", "replay", "jit(vg)"):
        spread = f"[{min(medians[k]) * 1e3:.3f}..{max(medians[k]) * 1e3:.3f}]"
        lines.append(f"{k:<14}{ms(med[k])}  {spread:<22}{med['eager'] / med[k]:8.2f}x"
                     f"{med[k] / med['jit(vg)']:10.2f}x{compiles[k]:>11}")
    speedup, record_ratio = med["eager"] / med["compiled"], med["compiled"] / med["jit(vg)"]
    replay_ratio = med["replay"] / med["jit(vg)"]
    lines.append(f"compiled step: {ms(med['compiled'])} ms with its executable started ahead, "
                 f"{ms(med['_compiled_after'])} ms run after its recording "
                 f"[{min(medians['_compiled_after']) * 1e3:.3f}..{max(medians['_compiled_after']) * 1e3:.3f}]; "
                 f"its recording alone {ms(med['_record'])} ms, its executable alone {ms(med['_executable'])} ms "
                 "(back to back; loss and gradients in one program)")
    jit_bwd = max(med["jit(vg)"] - med["_jit_fwd"], 1e-9)
    exe_bwd = max(med["_executable"] - med["_jit_fwd"], 0.0)
    ratio = exe_bwd / jit_bwd
    lines.append(f"backward: compiled step's backward part {ms(exe_bwd)} ms (executable - jit(loss)), jitted step's "
                 f"{ms(jit_bwd)} ms (jit(vg) - jit(loss)); ratio {ratio:.2f}x")
    met = lambda ok: "met" if ok else "NOT met"
    replay_goal = (f"replay within 1.3x of jit(vg): {met(replay_ratio <= 1.3)} ({replay_ratio:.2f}x)" if replayed
                   else "replay: not applicable (module arguments record every step)")
    lines.append(f"goals: compiled >= 5x eager: {met(speedup >= 5)} ({speedup:.2f}x); recording within 3x of jit(vg): "
                 f"{met(record_ratio <= 3)} ({record_ratio:.2f}x); {replay_goal}; steady-state recompiles "
                 f"{compiles['compiled'] + compiles['replay']}; backward within 1.2x: {met(ratio <= 1.2)} ({ratio:.2f}x)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- recording costs
def _per_unit(fn: Callable[[], Any], base: Callable[[], Any] | None, units: int, reps: int) -> float:
    """Seconds per unit of ``fn`` (less ``base``, the same without the units), median of ``reps`` calls; ``units``
    0: the seconds of ``fn``'s call alone, its outputs waited for after the clock stops (a dispatch)."""
    def med(f):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = f()
            if units:
                jax.block_until_ready(out)
            times.append(time.perf_counter() - t)
            jax.block_until_ready(out)
        return statistics.median(times)

    if units == 0:
        return med(fn)

    return max(med(fn) - (med(base) if base is not None else 0.0), 0.0) / units


def _chain(op: Callable[[Any], Any], x: Any, n: int) -> Callable[[], Any]:
    """Record ``n`` applications of ``op`` on a fresh tape (lazy: nothing runs)."""
    def run():
        tape = tape_module.Tape(eager=False)
        with compat.set_current_trace(tape.trace):
            y = tape.diff_input(x)
            for _ in range(n):
                y = op(y)
        compat.invalidate(tape.trace)
    return run


class NullRecorder:
    """A recorder that writes nothing down: each operation gives tracers of its output avals (memoized), each
    look a false ``bool``. The forward's Python under it is JAX's and the user's alone, the floor of a
    recording (what the tape adds is the rest)."""

    eager = False

    def __init__(self, avals: dict) -> None:
        self.trace = compat.RecordingTrace(self)
        self.avals = avals  #: operation -> its output avals, kept by the caller from one recorder to the next

    def tracer(self, aval: Any) -> Any:
        return compat.RecordingTracer(self.trace, aval, 0)

    def known(self, vid: int) -> Any:
        return None

    def force(self, vid: int, how: str = "value", look: bool = True) -> Any:
        return np.bool_(False) if how == "bool" else np.float32(0.0)

    def primitive(self, prim: Any, args: Any, params: dict) -> list:
        avals = [compat.typeof(a) for a in args]
        key = (prim, *avals, *params.items())
        out = self.avals.get(key)
        if out is None:
            out = self.avals[key] = compat.abstract_eval(prim, avals, params)[0]
        return [self.tracer(a) for a in out]

    def call(self, name: str, fn: Any, x: Any, args: tuple, kwargs: dict | None) -> Any:
        key = (fn, x.aval, *(compat.typeof(a) if isinstance(a, jax.Array) else (type(a), a) for a in args))
        out = self.avals.get(key)
        if out is None:
            out = self.avals[key] = fn(x, *args, **(kwargs or {})).aval
        return self.tracer(out)

    def stage_value(self, val: Any) -> Any:
        return self.tracer(compat.typeof(val))


def _null_forward(forward: Callable, leaves: list, tree: Any) -> Callable[[], Any]:
    """``forward`` on the leaves, under a :class:`NullRecorder` (one per call)."""
    avals, memo = [compat.typeof(x) for x in leaves], {}

    def run():
        null = NullRecorder(memo)
        with compat.set_current_trace(null.trace):
            forward(*jax.tree_util.tree_unflatten(tree, [null.tracer(a) for a in avals]))
        compat.invalidate(null.trace)
    return run


def recording_costs(rounds: int) -> str:
    """The per-piece cost table (module docstring) on the CPU MLP that looks at a value."""
    loss, params, batch, jittable = mlp(True, look=True)
    jit_vg = jax.jit(jax.value_and_grad(jittable))
    x = jnp.ones((32, 64))
    n = 64
    leaves, tree = jax.tree_util.tree_flatten((params,))
    forward = lambda p: (loss(p, *batch), None)  # noqa: E731
    recorded = compiled_step.record(forward, leaves, tree, eager=False)
    exe, _ = compiled_step.executable(recorded, (), leaves, lambda s: "benchmark")
    tape = recorded.tape
    outputs = recorded.structure.key[2]
    look = next(lk.plan for lk in tape.looks if lk.plan is not None)
    tiny = jaxaot.compiled_value_and_grad(lambda w: jnp.sum(w * w))
    w1, tiny_jit = jnp.ones(()), jax.jit(jax.value_and_grad(lambda w: jnp.sum(w * w)))
    tiny_rec = compiled_step.record(lambda w: (jnp.sum(w * w), None), [w1], jax.tree_util.tree_structure((w1,)), False)
    tiny_exe, _ = compiled_step.executable(tiny_rec, (), [w1], lambda s: "benchmark")
    tiny(w1)
    step_vg = jaxaot.compiled_value_and_grad(loss)
    half = np.float32(0.5)

    def full_key():
        key = (tuple(tape.inputs), tuple(tape.eqn_key(i) for i in range(len(tape.ops))), tuple(outputs))
        return hash(key), structure_module.interned(structure_module.Structure(key, None, kind="forward"))

    def inputs():
        fresh = tape_module.Tape(eager=False)
        with compat.set_current_trace(fresh.trace):
            fresh.diff_inputs(leaves, [compat.typeof(v) for v in leaves])
        compat.invalidate(fresh.trace)

    none = _chain(lambda y: y, x, 0)
    rows = {
        "operator x * 0.5, recorded (template)": (_chain(lambda y: y * 0.5, x, n), none, n),
        "x ** 3, recorded (template: integer_pow)": (_chain(lambda y: y ** 3, x, n), none, n),
        "np.float32(0.5) * x, recorded (template)": (_chain(lambda y: half * y, x, n), none, n),
        "primitive lax.tanh, recorded": (_chain(jax.lax.tanh, x, n), none, n),
        "jitted jnp.tanh, recorded": (_chain(jnp.tanh, x, n), none, n),
        "promote_args_inexact of a recorded value": (
            _chain(lambda y: numpy_util.promote_args_inexact("gelu", y)[0], x, n), none, n),
        "jax.nn.gelu (11 operations), recorded": (_chain(jax.nn.gelu, x, n), none, n),
        "operator x * 0.5, eager dispatch": (lambda: [x * 0.5 for _ in range(n)][-1], None, n),
        "argument handling of a call": (lambda: call_module.Call((params, *batch), {}, (0,), (params,), {0}), None, 1),
        "a tape and its 14 differentiated inputs": (inputs, None, 1),
        "the MLP's forward, nothing written down": (_null_forward(forward, leaves, tree), None, 1),
        "recording the MLP (one look)": (lambda: compiled_step.record(forward, leaves, tree, False), None, 1),
        "look: its compiled program, alone": (lambda: look.run(tape.values, tape.parent), None, 1),
        "structure key: the trie's node": (lambda: tape_module.structure(tape, outputs), None, 1),
        "structure key: whole key built, hashed": (full_key, None, 1),
        "compiled-step cache lookup (hit)": (
            lambda: compiled_step.executable(recorded, (), leaves, lambda s: ""), None, 1),
        "step dispatch, executable (1-element program)": (lambda: tiny_exe([w1], []), None, 1),
        "step dispatch, jit (1-element program)": (lambda: tiny_jit(w1), None, 1),
        "whole step, 1-element program": (lambda: tiny(w1), None, 1),
        "the MLP's step executable": (lambda: exe(leaves, recorded.args), None, 1),
        "the MLP's step executable, its dispatch alone": (lambda: exe(leaves, recorded.args), None, 0),
        "the MLP's whole recorded step": (lambda: step_vg(params, *batch), None, 1),
        "jit(value_and_grad) of the MLP (jnp.where)": (lambda: jit_vg(params, *batch), None, 1),
    }
    per = {k: [] for k in rows}
    for _ in range(rounds):
        for k, (fn, base, units) in rows.items():
            per[k].append(_per_unit(fn, base, units, 30 if units > 1 else 200))
    lines = [f"## recording costs, CPU MLP that looks at a value  ({rounds} interleaved rounds; us, median "
             "[min..max of rounds])",
             f"{'piece':<48}{'median':>10}  spread"]
    for k, v in per.items():
        lines.append(f"{k:<48}{statistics.median(v) * 1e6:10.2f}  [{min(v) * 1e6:.2f}..{max(v) * 1e6:.2f}]")
    lines.append(f"the MLP's recording: {len(tape.ops)} operations, {len(tape.looks)} look")
    return "\n".join(lines)


#: The sections ``--only`` picks from: the MLP with a look and without, the transformer, the CNN, and (with
#: ``--small``) the recording's cost table.
SECTIONS = ("mlp_look", "mlp", "transformer", "cnn", "costs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="CPU-sized models and fewer rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=SECTIONS, help="the sections to run")
    args = ap.parse_args()
    rounds = args.rounds or (5 if args.small else 7)
    steps = args.steps or (5 if args.small else 10)

    def sections():
        for key, name, look in (("mlp_look", "MLP, Python looks at a value each step", True),
                                ("mlp", "MLP, no look", False)):
            if key in args.only:
                loss, params, batch, jittable = mlp(args.small, look)
                yield section(name, methods(loss, params, batch, jittable), rounds, steps)
        if "transformer" in args.only:
            loss, params, batch, _ = transformer(args.small)
            yield section("transformer", methods(loss, params, batch), rounds, steps)
        if "cnn" in args.only:
            loss, params, batch, module_loss, model, nnx_vg = nnx_cnn(args.small)
            yield section("Flax nnx CNN", methods(loss, params, batch, module=(module_loss, model, nnx_vg)), rounds,
                          steps, replayed=False)
        s = jaxaot.compiled_autograd.stats()
        yield (f"compiled_autograd.stats(): compiles={s.compiles} hits={s.hits} replays={s.replays} "
               f"fallbacks={len(s.fallbacks)}" + "".join(f"\n  fallback: {f}" for f in s.fallbacks))
        if args.small and "costs" in args.only:
            yield recording_costs(rounds)

    report("compiled autograd: eager forward, backward compiled once per structure", sections(), args.out)


if __name__ == "__main__":
    main()
