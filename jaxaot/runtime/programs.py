"""The programs and executables of one input signature, built the first time each is needed.

:class:`SignaturePrograms` holds, for one :class:`~jaxaot.runtime.signature.Signature`,
the traced primal program and the *inference* executable (the primal program
for calls that differentiate nothing). Which inputs are differentiated changes
the joint graph (``jax.grad(f, argnums=0)`` differentiates fewer inputs than
``jax.vjp``), so each such mask gets its own :class:`TrainingPrograms`: the joint
graph, its :class:`~jaxaot.Partition`, and the *forward* (outputs plus
residuals) and *backward* (gradients from cotangents and residuals) executables.

Each stage runs lazily and records its time: tracing, the joint graph,
partitioning (through the persistent cache) and each compilation.

A ``jaxaot.while_loop`` without a bound, at the top level of the function,
reports its trip count as an extra forward output; the runtime starts its
stack at :data:`INITIAL_LOOP_CAPACITY` rows and, when a run needed more,
doubles it, rebuilds the training programs and runs the forward again
(``generation`` counts rebuilds, so stale residuals are refused).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot import _compat as C
from jaxaot.compile import cache
from jaxaot.compile.compilers import Compiler
from jaxaot.errors import InvalidValueError, ReverseModeBoundError
from jaxaot.loops.capacity import dynamic_capacity
from jaxaot.partition.split import Partition
from jaxaot.runtime import shardings as S
from jaxaot.runtime.debug_nans import CheckedExecutable
from jaxaot.runtime.options import Options, prune_outputs
from jaxaot.runtime.placement import Placement
from jaxaot.runtime.signature import Signature
from jaxaot.runtime.vjp import SplitPrograms, custom_vjp_of, read_only_float0s, scatter
from jaxaot.tracing.joint import JointGraph, build_joint
from jaxaot.tracing.primal import trace_primal

#: The first stack capacity of while loops whose stack the runtime sizes (doubled on overflow).
INITIAL_LOOP_CAPACITY = 32

_ArrayImpl = C.ArrayImpl


class SignaturePrograms:
    """The primal program and inference executable of one signature, and its training programs.

    Attributes:
      signature: the :class:`~jaxaot.runtime.signature.Signature`.
      in_avals: the input leaves' ``ShapeDtypeStruct`` (shardings kept).
      primal: the flat primal program; ``out_tree`` its output structure.
      output_is_input: per output, the input it returns unchanged (or None);
        such outputs skip the executables.
      sharded: whether an input spans several devices or a mesh context was
        set; such programs are compiled for their shardings
        (:mod:`~jaxaot.runtime.shardings`).
      times / executables: seconds per stage and the executables, by name.
    """

    def __init__(self, options: Options, sig: Signature, flat_fn: Callable, avals: list, donated: Sequence[int]):
        self.options = options
        self.signature = sig
        self.in_avals = avals
        self.donated_leaves = tuple(donated)
        self.times: dict[str, float] = {}
        self.executables: dict[str, Any] = {}
        t = time.perf_counter()
        self.primal, self.out_tree = trace_primal(flat_fn, avals, options.decompositions)
        self.times["trace"] = time.perf_counter() - t
        primal = C.jaxpr_of(self.primal)
        positions = {v: i for i, v in enumerate(primal.invars)}
        self.output_is_input = [None if C.is_literal(v) else positions.get(v) for v in primal.outvars]
        self.computed_outputs = [i for i, src in enumerate(self.output_is_input) if src is None]
        self.no_aliases = len(self.computed_outputs) == len(primal.outvars)
        self.inexact = tuple(C.is_inexact(a.dtype) for a in avals)
        self.sharded = S.is_sharded(avals, sig.mesh)
        self.mesh = S.mesh_of(avals) if self.sharded else None
        self.out_shardings = self._flat_out_shardings(options.out_shardings)
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
        return jax.tree_util.tree_leaves(full, is_leaf=is_sharding)

    def training(self, mask: Sequence[bool] | None = None) -> "TrainingPrograms":
        """The training programs when the inputs in ``mask`` are differentiated (default: every inexact one)."""
        key = self.inexact if mask is None else tuple(m and d for m, d in zip(mask, self.inexact))
        tr = self._training.get(key)
        if tr is None:
            with self.lock:
                tr = self._training.get(key)
                if tr is None:
                    tr = self._training[key] = TrainingPrograms(self, key)
        return tr

    def compile(self, name: str, compiler: Compiler, closed: Any, avals: Sequence[Any], aliased: set = frozenset()):
        """The executable ``name``, compiled (through the persistent cache) on first use."""
        exe = self.executables.get(name)
        if exe is None:
            with self.lock:
                exe = self.executables.get(name)
                if exe is None:
                    t = time.perf_counter()
                    donate = [i for i in self.donated_leaves if i not in aliased]
                    options = {"donate_argnums": tuple(donate)} if donate else {}
                    exe = CheckedExecutable(cache.cached_compile(compiler, closed, list(avals), **options), closed)
                    self.times[f"compile_{name}"] = time.perf_counter() - t
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
        """Full outputs from the computed ones: outputs that are inputs skip the executable."""
        if self.no_aliases:
            return list(computed)
        it = iter(computed)
        return [next(it) if src is None else leaves[src] for src in self.output_is_input]

    def infer(self, leaves: Sequence[Any]) -> list:
        """Outputs for concrete leaves or tracers that differentiate nothing."""
        exe = self.executables.get("inference")
        if exe is not None:  # the hot path: concrete arrays, already compiled
            return self.splice(leaves, exe(*leaves))
        if any(C.is_tracer(x) for x in leaves):
            return C.eval_closed(self.primal, *leaves)
        return self.splice(leaves, self.inference_exe(*leaves))


class TrainingPrograms:
    """Joint graph, partition and forward/backward executables for one differentiated mask.

    Attributes:
      programs: the :class:`SignaturePrograms` it belongs to.
      mask: which input leaves are differentiated.
      name_suffix: ``""`` for the full mask, else ``[i,j]`` naming the differentiated
        leaves; executables and times are keyed ``forward[0]``, ``backward[0]``.
      generation: bumped each time a loop outgrew its stack and all was rebuilt.
    """

    def __init__(self, programs: SignaturePrograms, mask: tuple[bool, ...]):
        self.programs = programs
        self.options = programs.options
        self.mask = mask
        self.name_suffix = "" if mask == programs.inexact else f"[{','.join(str(i) for i, m in enumerate(mask) if m)}]"
        self.forward_name, self.backward_name = "forward" + self.name_suffix, "backward" + self.name_suffix
        self.capacity = INITIAL_LOOP_CAPACITY
        self.generation = 0
        self._custom_vjp: Callable | None = None
        self._float0s: list | None = None
        self._reset()

    def _reset(self) -> None:
        self._joint: JointGraph | None = None
        self._partition: Partition | None = None
        self._unit_cts: dict[int, list] = {}
        self.placement = Placement(self)
        self.eager_forward: Callable | None = None  # the hot path, once it can be built
        for name in (self.forward_name, self.backward_name):
            self.programs.executables.pop(name, None)

    # -- the stages, each built once
    @property
    def joint(self) -> JointGraph:
        if self._joint is None:
            with self.programs.lock:
                if self._joint is None:
                    self._build_joint()
        return self._joint

    def _build_joint(self) -> None:
        p = self.programs
        t = time.perf_counter()
        self._joint = build_joint(
            p.primal, p.signature.treedef, p.out_tree, p.in_avals, self.options.decompositions, self.mask,
            aux_outputs=lambda: dynamic_capacity(self.capacity),
        )
        p.times["joint" + self.name_suffix] = time.perf_counter() - t

    @property
    def partition(self) -> Partition:
        if self._partition is None:
            with self.programs.lock:
                if self._partition is None:
                    joint = self.joint
                    t = time.perf_counter()
                    self._partition = cache.cached_partition(self.options.partition_fn, joint)
                    self.programs.times["partition" + self.name_suffix] = time.perf_counter() - t
        return self._partition

    @property
    def forward_program(self) -> Any:
        """The partition's forward, less the outputs that are inputs (pinned as :class:`Placement` says)."""
        p, part = self.programs, self.partition
        n_fwd, n_user = len(C.jaxpr_of(part.forward).outvars), len(p.output_is_input)
        pruned = prune_outputs(part.forward, p.computed_outputs + list(range(n_user, n_fwd)))
        return S.constrain_outputs(pruned, self.placement.forward_pins())

    @property
    def backward_program(self) -> Any:
        """The partition's backward; in a sharded signature, each grad pinned to its input's sharding."""
        return S.constrain_outputs(self.partition.backward, self.placement.grad_pins())

    @property
    def forward_exe(self):
        p = self.programs
        exe = p.executables.get(self.forward_name)
        if exe is None:
            aliased = set(self.partition.saved_inputs) | {i for i in p.output_is_input if i is not None}
            exe = p.compile(self.forward_name, self.options.fw_compiler, self.forward_program, p.in_avals, aliased)
        return exe

    @property
    def backward_exe(self):
        exe = self.programs.executables.get(self.backward_name)
        if exe is None:
            exe = self.programs.compile(self.backward_name, self.options.bw_compiler, self.backward_program,
                                        self.backward_avals())
        return exe

    def backward_avals(self) -> list:
        """The backward's inputs: the selected cotangents, then the residuals (with their shardings, memory kinds)."""
        part = self.partition
        cts = [jax.ShapeDtypeStruct(self.joint.out_avals[i].shape, self.joint.out_avals[i].dtype)
               for i in part.cotangent_outputs]
        avals = cts + [r.aval for r in part.residuals]
        if not self.programs.sharded:
            return self.placement.host_residuals(avals)  # offloaded residuals arrive in host memory
        return [S.with_sharding(a, s) for a, s in zip(avals, self.placement.backward_inputs())]

    # -- running
    def forward(self, leaves: Sequence[Any], concrete: bool | None = None) -> tuple[list, list]:
        """Run the forward: ``(the function's outputs, residual arrays in backward order)``.

        ``concrete``: whether no leaf is a tracer, when the caller already knows.
        """
        if concrete and self.eager_forward is not None:
            return self.eager_forward(leaves)
        if self.joint.num_aux:  # a loop may outgrow its stack and rebuild everything: one thread at a time
            with self.programs.lock:
                return self._forward(leaves, concrete)
        return self._forward(leaves, concrete)

    def _forward(self, leaves: Sequence[Any], concrete: bool | None) -> tuple[list, list]:
        n_user = len(self.programs.output_is_input)
        if concrete is None:
            concrete = not any(C.is_tracer(x) for x in leaves)
        if not concrete:
            if self.joint.num_aux:
                raise _unbounded_loop_error(self.options.name)
            fwd_outs = C.eval_closed(self.partition.forward, *leaves)
        else:
            fwd_outs = self._run_forward(leaves)
            n_aux = self.joint.num_aux
            while n_aux and max(int(t) for t in fwd_outs[n_user:n_user + n_aux]) > self.capacity:
                # A while loop outgrew its stack: double the capacity, rebuild and rerun.
                self.capacity *= 2
                self.generation += 1
                self._reset()
                fwd_outs = self._run_forward(leaves)
                n_aux = self.joint.num_aux
        part = self.partition
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd_outs[i] for i in part.saved_outputs]
        if self.eager_forward is None and not self.joint.num_aux and self.programs.no_aliases:
            with self.programs.lock:
                if self.eager_forward is None:
                    self.eager_forward = self._make_eager_forward()
        return fwd_outs[:n_user], residuals

    def _make_eager_forward(self) -> Callable[[Sequence[Any]], tuple[list, list]]:
        """The hot path of an eager forward, once compiled: one executable call and two gathers.

        Only for programs whose outputs are all computed and that size no loop
        stack at run time (those check the loop's trip counts after each run).
        """
        exe, part = self.forward_exe, self.partition
        n_user = len(self.programs.output_is_input)
        saved_in, saved_out = part.saved_inputs, part.saved_outputs

        def run(leaves):
            outs = exe(*leaves)
            return outs[:n_user], [leaves[i] for i in saved_in] + [outs[i] for i in saved_out]

        return run

    def _run_forward(self, leaves: Sequence[Any]) -> list:
        computed = self.forward_exe(*leaves)
        n_real = len(self.programs.computed_outputs)
        return self.programs.splice(leaves, computed[:n_real]) + list(computed[n_real:])

    def backward(self, residuals: Sequence[Any], cts: Sequence[Any], concrete_residuals: bool = False) -> list:
        """Grads for the differentiated inputs, from residuals and the selected cotangents."""
        args = [*cts, *residuals]
        if concrete_residuals:  # only the cotangents can be tracers; arrays are the common case
            traced = not all(type(x) is _ArrayImpl for x in cts) and any(C.is_tracer(x) for x in cts)
        else:
            traced = any(C.is_tracer(x) for x in args)
        if traced:
            return C.eval_closed(self.backward_program, *args)
        exe = self.programs.executables.get(self.backward_name) or self.backward_exe
        if self.programs.sharded:
            args = [*S.reshard_cotangents(cts, self.placement.backward_inputs()), *residuals]
        return list(exe(*args))

    def unit_cotangents(self, leaf: int) -> list:
        """Cotangents 1 for output ``leaf`` (a scalar) and 0 elsewhere, made once on device."""
        cts = self._unit_cts.get(leaf)
        if cts is None:  # racing threads build equal lists; either may be kept
            outs = self.partition.cotangent_outputs
            cts = [jax.numpy.full(self.joint.out_avals[i].shape, 1 if i == leaf else 0, self.joint.out_avals[i].dtype)
                   for i in outs]
            if self.programs.sharded:
                cts = S.reshard_cotangents(cts, self.placement.backward_inputs())
            self._unit_cts[leaf] = cts
        return cts

    def input_grads_tree(self, grads: Sequence[Any]) -> Any:
        """``(args, kwargs)``-shaped grads; float0 zeros for non-differentiated leaves."""
        if self._float0s is None:
            self._float0s = read_only_float0s(self.programs.in_avals)
        grad_inputs = self.partition.grad_inputs
        if len(grad_inputs) == len(self._float0s):  # every input differentiated: grads are in order
            return jax.tree_util.tree_unflatten(self.programs.signature.treedef, grads)
        return jax.tree_util.tree_unflatten(self.programs.signature.treedef,
                                            scatter(grad_inputs, grads, self._float0s))

    @property
    def custom_vjp(self) -> Callable:
        """The ``jax.custom_vjp`` through which JAX's autodiff reaches the executables."""
        if self._custom_vjp is None:
            with self.programs.lock:
                if self._custom_vjp is None:
                    self._custom_vjp = self._make_custom_vjp()
        return self._custom_vjp

    def _make_custom_vjp(self) -> Callable:
        # What the joint graph will differentiate, read off the primal program: a
        # call under jit that differentiates nothing never builds the joint graph.
        out_avals = C.out_avals_of(self.programs.primal)
        cts = tuple(i for i, a in enumerate(out_avals) if C.is_inexact(a.dtype))
        return custom_vjp_of(SplitPrograms(
            primal=lambda leaves: C.eval_closed(self.programs.primal, *leaves),  # only ever traced
            forward=self.forward,
            backward=self.backward,
            num_inputs=len(self.programs.in_avals),
            grad_inputs=tuple(i for i, m in enumerate(self.mask) if m),
            cotangent_outputs=cts,
            cotangent_dtypes=tuple(out_avals[i].dtype for i in cts),
        ))


def _unbounded_loop_error(name: str) -> Exception:
    return ReverseModeBoundError(
        f"{name} contains a jaxaot.while_loop without max_steps or checkpoints and is being "
        "reverse-differentiated inside another transformation (jit, vmap, or a higher-order grad). "
        "The runtime can size the loop's stack only when the aot_function is called eagerly: "
        "pass max_steps=N or checkpoints=k to the while_loop."
    )
