"""The compiled step of a recorded forward: ``jit(value_and_grad(replay))``, compiled once per structure.

:func:`record` runs the forward under a :class:`~.tape.Tape`; its structure picks
an executable from the cache (:mod:`.step_cache`) that replays the tape and returns
loss, auxiliary outputs and gradients (post-accumulate hooks applied), the
backward a fully jitted step has. Values Python looked at were computed by
programs of their own (:mod:`.force`) and may differ from the compiled ones in
the last bits, as eager and jitted JAX do.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded import force as F
from jaxaot._src.autograd.recorded.ahead import EFFECTFUL
from jaxaot._src.autograd.recorded import param_hooks as PH
from jaxaot._src.autograd.recorded import tape as T
from jaxaot._src.autograd.recorded.replay import guarded_looks
from jaxaot._src.autograd.recorded.step_cache import CACHE, Compiled
from jaxaot._src.autograd.recorded.structure import Structure
from jaxaot._src.loops import note_remedy


class Recorded(NamedTuple):
    """One recorded step: its program and structure, the runtime arguments, and the forward's other outputs."""

    structure: Structure
    args: list
    rest_tree: Any
    rest: list          #: leaves of the forward's other outputs; None where the step returns the value
    rest_vids: tuple    #: their value numbers, for the leaves that are recorded values
    tape: T.Tape        #: the tape (:mod:`.replay` judges what the recording depended on)
    seconds: float = 0.0  #: how long recording took
    looked: int = 0     #: how many of the structure's outputs, last, are values Python looked at

    @property
    def program(self) -> T.Program:
        """The recorded operations and inputs (made on demand: only a compile needs them)."""
        return T.freeze(self.tape)


def record(forward: Callable[..., tuple], diff_leaves: Sequence[Any], diff_tree: Any, eager: bool,
           arg_leaves: Sequence[Any] | None = None, diff_avals: Sequence[Any] | None = None,
           trie: Any = None, ahead: Any = None, placement: tuple = ()) -> Recorded:
    """Run ``forward(*diff)`` under a fresh tape; it returns ``(loss, rest)``.

    ``rest`` (auxiliary outputs, module state) may hold recorded values: the
    step returns them, concrete. With ``arg_leaves`` (the other arguments' arrays), the recording is
    *guarded* (:mod:`.replay`): those arrays reach the forward as recorded values too, as
    ``forward(*diff, arg_values=[...])``, the tape keeps what a replay needs, and the step returns the
    values Python looked at after the forward's other outputs (:func:`~.replay.confirms`). ``diff_avals``: the
    differentiated leaves' avals, when the caller has them; ``trie``: the root of the structure trie to
    record in (:class:`~.structure.Node`; by default the process-wide one); ``ahead``: the step started
    ahead of this recording (:class:`~.ahead.Started`), whose outputs may give the values Python looks at;
    ``placement``: where the call's committed arrays live (:func:`~.call.placement`).

    The step returns the values Python looked at after the forward's other outputs: in a guarded
    recording those a replay checks, else the scalars a program of their own computed (a step started
    ahead gives them to the next recording).
    """
    tape = T.Tape(eager, guarded=arg_leaves is not None, trie=trie, ahead=ahead, placement=placement)
    try:
        with C.set_current_trace(tape.trace):
            avals = diff_avals if diff_avals is not None else [C.typeof(x) for x in diff_leaves]
            tracers = tape.diff_inputs(diff_leaves, avals)
            diff = jax.tree_util.tree_unflatten(diff_tree, tracers)
            if arg_leaves is None:
                loss, rest = forward(*diff)
            else:
                loss, rest = forward(*diff, arg_values=[tape.arg_input(x) for x in arg_leaves])
            loss_vid = tape.output(loss)
            leaves, rest_tree = jax.tree_util.tree_flatten(rest)
            vids, kept = [], []
            for leaf in leaves:
                if type(leaf) is C.RecordingTracer and leaf._trace is tape.trace:
                    vids.append(leaf.vid)
                    kept.append(None)
                else:
                    kept.append(leaf)
    finally:
        C.invalidate(tape.trace)
        # A tracer that escaped keeps the trace and, through it, the tape; the tape lets go of the trace, so a
        # finished recording is no cycle: refcounting frees it, and the arrays it holds, as the step returns.
        tape.trace = None
        if tape.started:  # plans started ahead that this recording never asked for
            F.unused(tape.started)
    looked = [look.vid for look in (guarded_looks(tape) if tape.guarded else computed_scalars(tape))]
    structure = T.structure(tape, (loss_vid, *vids, *looked))
    return Recorded(structure, tape.args, rest_tree, kept, tuple(vids), tape, looked=len(looked))


def computed_scalars(tape: T.Tape) -> list:
    """The looks at scalars that a program of their own computed (:mod:`.force`), in order."""
    return [look for look in tape.looks if look.plan is not None and look.plan.exe is not None
            and look.value is not None]


def look_outputs(recorded: Recorded, host: int = 0) -> dict:
    """Where the step of ``recorded`` returns the values its looks' plans computed: plan -> ``(index among the
    step's recorded outputs (the forward's other outputs first), index of its copy in pinned host memory or
    None)``; ``host``: how many such copies the step returns (:func:`host_copies`), of its last outputs."""
    outs = recorded.structure.key[2][1:]
    copied = outs[len(outs) - host:] if host else []
    out = {}
    for look in recorded.tape.looks:
        if look.plan is not None and look.vid in outs:
            j = copied.index(look.vid) if look.vid in copied else None
            out[look.plan] = ((outs.index(look.vid), None) if j is None
                              else (len(outs) - host + j, len(outs) + j))
    return out


def host_copies(recorded: Recorded, diff: Sequence[Any]) -> int:
    """How many values the step also returns in the host's pinned memory: the values Python looked at, off a
    CPU (none on a CPU, whose device memory is the host's). A replay reads them there, several times faster
    than from device memory (``docs/benchmarks.md``, compiled autograd)."""
    if not recorded.looked:
        return 0
    device = next((d for x in (*diff, *recorded.args) if isinstance(x, jax.Array) for d in x.devices()), None)
    return recorded.looked if device is not None and _copies_to_host(device) else 0


def _copies_to_host(device: Any) -> bool:
    """Whether programs on ``device`` copy their looked-at values to pinned host memory (:func:`host_copies`)."""
    return device.platform in HOST_COPY_PLATFORMS and _has_pinned_host(device)


@functools.cache
def _has_pinned_host(device: Any) -> bool:
    """Whether ``device`` addresses pinned host memory (asked once per device)."""
    try:
        return any(m.kind == "pinned_host" for m in device.addressable_memories())
    except Exception:  # noqa: BLE001 - a backend without memory kinds
        return False


#: Platforms whose steps return the values Python looked at in pinned host memory too (:func:`host_copies`).
HOST_COPY_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})


def compile_step(program: T.Program, outputs: Sequence[int], planned: Sequence[Any], diff: Sequence[Any],
                 args: Sequence[Any], host: int = 0) -> tuple[Any, dict]:
    """The executable ``(diff leaves, args) -> (loss, recorded outputs, grads)`` of ``program``, and the
    seconds spent tracing it (``trace_step``: the replay under ``value_and_grad``) and in XLA (``compile_step``).
    With ``host``, the recorded outputs end with a copy of the last ``host`` of them in pinned host memory."""
    loss_vid, rest = outputs[0], list(outputs[1:])

    def step(diff, args):
        def loss(diff):
            env = T.replay(program, diff, args)
            return env[loss_vid], [env[v] for v in rest]

        (value, outs), grads = jax.value_and_grad(loss, has_aux=True)(diff)
        if planned:
            grads = PH.apply(planned, diff, grads)
        if host:
            outs = [*outs, *(jax.device_put(o, jax.memory.Space.Host) for o in outs[len(outs) - host:])]
        return value, outs, grads

    t = time.perf_counter()
    try:
        traced = jax.jit(step).trace(list(diff), list(args))
    except ValueError as err:
        note_remedy(err)
        raise
    lowered = traced.lower()
    t_lower = time.perf_counter()
    exe = lowered.compile()
    if traced.jaxpr.effects:
        EFFECTFUL.add(exe)
    return exe, {"trace_step": t_lower - t, "compile_step": time.perf_counter() - t_lower}


def run(recorded: Recorded, planned: Sequence[Any], diff: Sequence[Any],
        reason: Callable[[Structure], str]) -> tuple[Any, Any, list, Compiled | None]:
    """``(loss, rest, grads, compiled)`` from the cached executable of ``recorded`` (compiled on a miss:
    ``compiled`` then says why, ``reason(structure)``, and what it cost; None on a hit)."""
    exe, compiled = executable(recorded, planned, diff, reason)
    value, outs, grads = exe(list(diff), recorded.args)
    return value, outputs(recorded.rest, recorded.rest_tree, outs), list(grads), compiled


def executable(recorded: Recorded, planned: Sequence[Any], diff: Sequence[Any],
               reason: Callable[[Structure], str]) -> tuple[Any, Compiled | None]:
    """The cached executable of ``recorded`` (compiled on a miss: see :func:`run`)."""
    structure = recorded.structure
    host = host_copies(recorded, diff)
    key = ("step", structure.token, tuple(planned), host)
    return CACHE.get(key, structure,
                     lambda: compile_step(recorded.program, structure.key[2], planned, diff, recorded.args, host),
                     lambda: reason(structure))


def call(exe: Any, structure: Structure, diff: Sequence[Any], args: Sequence[Any]) -> tuple:
    """``exe(diff, args)``, the step of ``structure``. Under ``jax.debug_nans`` or ``jax.debug_infs`` a NaN or Inf
    the executable made is, as under ``jit``, the ``FloatingPointError`` of the operation that made it: the
    step's program runs again op by op, its gradient too."""
    try:
        return exe(list(diff), args)
    except C.InternalFloatingPointError:
        program, loss_vid = structure.jaxpr, structure.key[2][0]
        try:
            jax.value_and_grad(lambda d: T.replay(program, d, args)[loss_vid])(list(diff))
        except C.InternalFloatingPointError as e:  # a jitted call inside the program, bound as a primitive
            raise FloatingPointError(f"invalid value ({e.ty}) encountered in {e.name}") from None
        raise FloatingPointError(
            "the compiled step produced a NaN or Inf that running its operations one by one does not reproduce "
            "(XLA's fusion or precision differs): look at its outputs.") from None


def outputs(kept: Sequence[Any], tree: Any, outs: Sequence[Any]) -> Any:
    """The forward's other outputs: the step's ``outs`` where ``kept`` has None, the kept leaves elsewhere."""
    it = iter(outs)
    return jax.tree_util.tree_unflatten(tree, [next(it) if leaf is None else leaf for leaf in kept])
