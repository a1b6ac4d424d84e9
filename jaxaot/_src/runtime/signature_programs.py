"""The stage driver: the programs and executables of one input signature, built the first time each is needed.

:class:`SignaturePrograms` holds a signature's traced primal program, its inference
executable and, per differentiated mask, a :class:`~jaxaot._src.runtime.TrainingPrograms`;
each stage runs once, lazily, under its lock, and records its time. It is the
interface the other stages use; the class says what they may call and read.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.compile import Compiler, cached_compile, start_compile
from jaxaot.errors import InvalidValueError, XlaCompileError
from jaxaot._src.runtime import shardings as S
from jaxaot._src.runtime.debug_nans import CheckedExecutable
from jaxaot._src.runtime.options import Options, prune_outputs
from jaxaot._src.runtime.signature import Signature
from jaxaot._src.runtime.training import TrainingPrograms
from jaxaot._src.tracing import lacks_derivative, trace_primal


class SignaturePrograms:
    """The primal program and inference executable of one signature, and its training programs.

    Made by the :class:`~jaxaot.AOTFunction` on a signature's first call
    (:meth:`AOTFunction.lookup <jaxaot.AOTFunction.lookup>` returns it, compiling nothing).

    What other stages (export, pipeline stages, the fused step through its ``TrainingLike``
    and ``ProgramsLike`` protocols) may use: call ``training(mask)`` (default: every inexact
    input) and ``compile(name, compiler, closed, avals, aliased, pending)``, a program of their own
    cached under ``name`` in ``executables`` (``start_compile(compiler, closed, avals, aliased)``
    begins it on a worker); read, never write, ``signature``, ``in_avals``,
    ``primal``, ``out_tree``, ``output_is_input``, ``computed_outputs``, ``sharded``, ``mesh``,
    ``executables``, ``compiled`` and ``times``, and call ``splice(leaves, computed)``. On a
    :class:`~jaxaot._src.runtime.TrainingPrograms`: read ``programs``, ``options``, ``mask``,
    ``name_suffix``, ``joint``, ``partition``, ``out_avals``, ``num_aux`` and ``placement`` (a
    loop-capacity rebuild replaces the last five: read them again after a forward); call ``forward(leaves,
    concrete)``, ``backward(residuals, cotangents)``, ``backward_avals()``, ``forward_exe`` /
    ``backward_exe``, ``start_split_compiles()`` / ``drop_split_compiles()``, ``unit_cotangents(leaf)``
    and ``input_grads_tree(grads)``. Everything else is the runtime's own.

    Attributes:
      signature: the :class:`~jaxaot._src.runtime.signature.Signature`.
      in_avals: the input leaves' ``ShapeDtypeStruct`` (shardings kept).
      primal: the flat primal program; ``out_tree`` its output structure.
      output_is_input: per output, the input it returns unchanged (or None);
        such outputs skip the executables.
      sharded: whether an input spans several devices or a mesh context was
        set; such programs are compiled for their shardings
        (:mod:`~jaxaot._src.runtime.shardings`).
      times / executables: seconds per stage and the executables, by name.
      fused_choices: per fused step, which step runs and why (:class:`~jaxaot._src.fusion.FusedChoice`).
      tunings: per fused step still weighed by the calls that follow its first, its
        :class:`~jaxaot._src.fusion.Tuning`.
      compiled: every name :meth:`compile` compiled, in order, variants of the fused step
        weighed and dropped included (``cache_info()`` reports it; a name twice would be a
        duplicate compile, which the lock rules out).
      lock: guards the lazy builds of this signature and its training programs.
    """

    def __init__(self, options: Options, sig: Signature, flat_fn: Callable, avals: list, donated: Sequence[int]):
        self.options = options
        self.signature = sig
        self.in_avals = avals
        self.donated_leaves = tuple(donated)
        self.times: dict[str, float] = {}
        self.executables: dict[str, Any] = {}
        self.fused_choices: dict[str, Any] = {}  # per fused step: FusedChoice (jaxaot._src.fusion.step_choice)
        self.tunings: dict[str, Any] = {}  # per fused step weighed over later calls: Tuning (jaxaot._src.fusion)
        self.compiled: list[str] = []  # every name compiled, in order (variants weighed included)
        t = time.perf_counter()
        self.primal, self.out_tree = trace_primal(flat_fn, avals, options.decompositions)
        self.times["trace"] = time.perf_counter() - t
        #: The function closes over a tracer of the transformation that called it (a model built inside
        #: ``jax.grad`` or ``jit``): its programs hold that one trace's value, and are neither compiled nor kept.
        self.closes_over_tracers = any(map(C.is_tracer, C.consts_of(self.primal)))
        primal = C.jaxpr_of(self.primal)
        positions = {v: i for i, v in enumerate(primal.invars)}
        self.output_is_input = [None if C.is_literal(v) else positions.get(v) for v in primal.outvars]
        self.computed_outputs = [i for i, src in enumerate(self.output_is_input) if src is None]
        self.no_aliases = len(self.computed_outputs) == len(primal.outvars)
        self.inexact = tuple(C.is_inexact(a.dtype) for a in avals)
        self.out_shardings = self._flat_out_shardings(options.out_shardings)
        # Outputs pinned over several devices place the programs too: their residuals, made there, reach the
        # backward there, whatever devices the inputs came from.
        spread = [o for o in self.out_shardings if S.is_multi_device(o)]
        self.sharded = S.is_sharded(avals, sig.mesh) or bool(spread)
        self.mesh = None if not self.sharded else (
            S.mesh_of(avals) or next((getattr(o, "mesh", None) for o in spread), None))
        self._training: dict[tuple[bool, ...], TrainingPrograms] = {}
        # Guards the lazy builds of this signature (and of its TrainingPrograms); taken only
        # on a miss, so each stage is built once however many threads ask.
        self.lock = threading.RLock()

    def _flat_out_shardings(self, out_shardings: Any) -> list:
        """Per output leaf, the sharding ``out_shardings`` pins it to (None: XLA chooses)."""
        n = self.out_tree.num_leaves
        if out_shardings is None:
            return [None] * n
        is_sharding = lambda x: x is None or isinstance(x, jax.sharding.Sharding)  # noqa: E731
        try:
            full = jax.tree.broadcast(out_shardings, jax.tree_util.tree_unflatten(self.out_tree, [0] * n),
                                      is_leaf=is_sharding)
        except (ValueError, TypeError) as e:
            raise InvalidValueError(
                f"out_shardings of {self.options.name} must be a sharding or a pytree prefix of the outputs "
                f"({self.out_tree}): {e}") from None
        flat = jax.tree_util.tree_leaves(full, is_leaf=is_sharding)
        for i, (sh, aval) in enumerate(zip(flat, C.out_avals_of(self.primal))):
            try:
                if sh is not None and hasattr(sh, "shard_shape"):
                    sh.shard_shape(tuple(aval.shape))  # as jit's out_shardings: each sharded dimension divides
            except (ValueError, IndexError) as e:  # IndexError: a spec of more dimensions than the output has
                why = e if isinstance(e, ValueError) else f"{sh} shards more dimensions than the output's {aval.ndim}"
                raise InvalidValueError(f"out_shardings of {self.options.name}, output {i} ({format_aval(aval)}): "
                                        f"{why}") from None
        return flat

    def training(self, mask: Sequence[bool] | None = None) -> TrainingPrograms:
        """The training programs when the inputs in ``mask`` are differentiated (default: every inexact one)."""
        key = self.inexact if mask is None else tuple(m and d for m, d in zip(mask, self.inexact))
        tr = self._training.get(key)
        if tr is None:
            with self.lock:
                tr = self._training.get(key)
                if tr is None:
                    tr = self._training[key] = TrainingPrograms(self, key)
        return tr

    def staged_training(self) -> TrainingPrograms:
        """The training programs :meth:`~jaxaot.AOTFunction.lower` stages: every inexact input differentiated, or
        none where the function has no reverse-mode derivative (a ``lax.while_loop`` with a traced trip count, a
        ``pure_callback``): a call runs its forward alone, as ``jax.jit(f).lower(...).compile()`` does, and a
        gradient raises JAX's error then. Any other failure of the joint trace is raised here."""
        tr = self.training()
        if not any(self.inexact):
            return tr
        try:
            tr.joint
        except Exception as e:  # noqa: BLE001 - the forward alone tells a missing derivative from the function's error
            if not lacks_derivative(e):  # a custom rule's own error, say: the function's
                raise
            none = self.training(tuple(False for _ in self.inexact))
            try:
                none.joint
            except Exception:  # noqa: BLE001 - the forward fails too: the error is the function's own
                raise e from None
            return none
        return tr

    def _donation(self, aliased: set) -> dict:
        donate = [i for i in self.donated_leaves if i not in aliased]
        return {"donate_argnums": tuple(donate)} if donate else {}

    def start_compile(self, compiler: Compiler, closed: Any, avals: Sequence[Any],
                      aliased: set = frozenset()) -> concurrent.futures.Future | None:
        """A compile of ``closed`` begun on a worker (lowered on this thread), handed later to :meth:`compile`
        as its ``pending``; None where it compiles there as ever (:func:`~jaxaot._src.compile.start_compile`)."""
        with S.lowering_mesh(self.out_shardings):
            return start_compile(compiler, closed, list(avals), **self._donation(aliased))

    def compile(self, name: str, compiler: Compiler, closed: Any, avals: Sequence[Any], aliased: set = frozenset(),
                pending: concurrent.futures.Future | None = None):
        """The executable ``name``, compiled (through the persistent cache) on first use; ``pending``: that
        compile, begun by :meth:`start_compile` of the same arguments, waited for."""
        exe = self.executables.get(name)
        if exe is None:
            with self.lock:
                exe = self.executables.get(name)
                if exe is None:
                    t = time.perf_counter()
                    options = self._donation(aliased)
                    try:
                        with S.lowering_mesh(self.out_shardings):
                            raw = cached_compile(compiler, closed, list(avals), pending=pending, **options)
                    except jax.errors.JaxRuntimeError as e:
                        raise xla_compile_error(name, avals, e) from e
                    exe = CheckedExecutable(raw, closed, options.get("donate_argnums", ()))
                    self.times[f"compile_{name}"] = time.perf_counter() - t
                    self.compiled.append(name)
                    self.executables[name] = exe
        return exe

    @property
    def inference_program(self) -> Any:
        """The primal program less the outputs that are inputs (pinned to ``out_shardings``)."""
        pruned = prune_outputs(self.primal, self.computed_outputs)
        return S.constrain_outputs(pruned, [self.out_shardings[i] for i in self.computed_outputs])

    @property
    def inference_exe(self):
        exe = self.executables.get("inference")
        if exe is None:
            aliased = {i for i in self.output_is_input if i is not None}
            exe = self.compile("inference", self.options.inference_compiler, self.inference_program,
                               self.in_avals, aliased)
        return exe

    def splice(self, leaves: Sequence[Any], computed: Sequence[Any]) -> list:
        """Full outputs from the computed ones: outputs that are inputs skip the executable, and are new arrays
        of the input's value, as ``jit`` returns them (a NumPy input or Python scalar becomes an array of
        JAX's dtype; deleting or donating the input leaves the output as it was)."""
        if self.no_aliases:
            return list(computed)
        it = iter(computed)
        return [next(it) if src is None else _fresh(leaves[src]) for src in self.output_is_input]

    def infer(self, leaves: Sequence[Any]) -> list:
        """Outputs for concrete leaves or tracers that differentiate nothing."""
        exe = self.executables.get("inference")
        if exe is not None:  # the hot path: concrete arrays, already compiled
            return self.splice(leaves, exe(*leaves))
        if any(C.is_tracer(x) for x in leaves):
            return C.eval_closed(self.primal, *leaves)
        return self.splice(leaves, self.inference_exe(*leaves))


def _fresh(x: Any) -> Any:
    """An output that is the input ``x`` unchanged, as ``jit`` returns it: a new array (a tracer stays itself)."""
    if C.is_tracer(x):
        return x
    if isinstance(x, jax.Array):
        return jax.numpy.array(x, copy=True)
    return jax.numpy.asarray(x)


def xla_compile_error(name: str, avals: Sequence[Any], error: Exception) -> XlaCompileError:
    """The typed error for XLA's refusal to compile the program ``name``: XLA's first line, where, and what to try."""
    devices = {d for a in avals for d in getattr(getattr(a, "sharding", None), "device_set", ()) or ()}
    platform = next(iter(devices)).platform if devices else jax.default_backend()
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return XlaCompileError(
        f"XLA could not compile jaxaot's {name!r} program on {platform}: {first}\n"
        "This is the XLA compiler failing, not an error in your function: jax.jit(jax.value_and_grad(fn)) of the "
        "same computation usually fails the same way (docs/guarantees.md lists known cases). To work around it, "
        "try other shapes, another jax_default_matmul_precision, the split programs (value_and_grad(f, "
        "fused=False)) or another partition_fn, or compute this step on the CPU (jax.device_put the inputs "
        "to jax.devices('cpu')[0]).")
