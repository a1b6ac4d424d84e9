"""The programs of one differentiated mask: joint graph, partition, forward and backward executables.

Which inputs are differentiated changes the joint graph, so each mask gets its own
:class:`TrainingPrograms`, each stage built once on first read. An unbounded
``jaxaot.loops.while_loop`` reports its trip count; when a run needed more than the
stack's rows (from :data:`INITIAL_LOOP_CAPACITY`), the capacity doubles and the
joint, partition and executables are rebuilt (``generation`` counts rebuilds, so
stale residuals are refused). The partition cache is keyed by the joint graph's
recipe and the hot path reads the graph the partition was split from, so a
cached partition that replays a primal rewrite never traces the original joint.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.pytrees import is_weakly_typed
from jaxaot._src.compile import cached_partition
from jaxaot.errors import PartitionError, ReverseModeBoundError
from jaxaot._src.fusion import Prefetch
from jaxaot._src.loops import dynamic_capacity
from jaxaot._src.partition import Partition
from jaxaot._src.runtime import shardings as S
from jaxaot._src.runtime.options import prune_outputs
from jaxaot._src.runtime.placement import Placement
from jaxaot._src.runtime.vjp import SplitPrograms, custom_vjp_of, read_only_float0s, scatter
from jaxaot._src.tracing import JointGraph, JointRecipe, grad_avals

#: The first stack capacity of while loops whose stack the runtime sizes (doubled on overflow).
INITIAL_LOOP_CAPACITY = 32

_ArrayImpl = C.ArrayImpl


class TrainingPrograms:
    """Joint graph, partition and forward/backward executables for one differentiated mask.

    Made by :meth:`SignaturePrograms.training <jaxaot._src.runtime.SignaturePrograms.training>`, never directly.

    Attributes:
      programs: the ``SignaturePrograms`` it belongs to.
      options: the function's ``Options`` (partitioner, compilers, shardings).
      mask: which input leaves are differentiated.
      name_suffix: ``""`` for the full mask, else ``[i,j]`` naming the differentiated
        leaves; executables and times are keyed ``forward[0]``, ``backward[0]``.
      joint / partition: the joint graph and its partition (built on first read; a cached
        partition that replays a primal rewrite needs no ``joint``).
      recipe: what the joint graph is a function of, the partition's cache key.
      out_avals / num_aux: the joint graph's outputs and how many trailing ones are loop
        trip counts, read off the graph the partition was split from (the same outputs).
      placement / weak_grads: where residuals and gradients live (``Placement``); which grads are weakly typed.
      generation: bumped each time a loop outgrew its stack and all was rebuilt.
    """

    def __init__(self, programs: Any, mask: tuple[bool, ...]):
        self.programs = programs
        self.options = programs.options
        self.mask = mask
        self.name_suffix = "" if mask == programs.inexact else f"[{','.join(str(i) for i, m in enumerate(mask) if m)}]"
        self.forward_name, self.backward_name = "forward" + self.name_suffix, "backward" + self.name_suffix
        self.capacity, self.generation = INITIAL_LOOP_CAPACITY, 0
        self._custom_vjp: Callable | None = None
        self._float0s: list | None = None
        self._reset()

    def _reset(self) -> None:
        self._joint: JointGraph | None = None
        self._partition: Partition | None = None
        self._unit_cts: dict[int, list] = {}
        self.weak_grads = WeakGrads(self)  # which grads JAX hands back weakly typed
        self.placement = Placement(self)
        self.eager_forward: Callable | None = None  # the hot path, once it can be built
        # The split programs' compiles begun ahead: by name, their compile's arguments and future.
        self.split_begun = Prefetch(functools.partial(_split_compile, self),
                                    lambda args: self.programs.start_compile(*args))
        for name in (self.forward_name, self.backward_name):
            self.programs.executables.pop(name, None)

    # -- the stages, each built once
    @property
    def joint(self) -> JointGraph:
        if self._joint is None:
            with self.programs.lock:
                if self._joint is None:
                    t = time.perf_counter()
                    self._joint = self.recipe.build()
                    self.programs.times["joint" + self.name_suffix] = time.perf_counter() - t
        return self._joint

    @property
    def recipe(self) -> JointRecipe:
        """The arguments the joint graph is built from (at the present loop capacity)."""
        p = self.programs
        return JointRecipe(p.primal, p.signature.treedef, p.out_tree, tuple(p.in_avals), self.options.decompositions,
                           self.mask, functools.partial(dynamic_capacity, self.capacity))

    @property
    def partition(self) -> Partition:
        if self._partition is None:
            with self.programs.lock:
                if self._partition is None:
                    had_joint, t = self._joint is not None, time.perf_counter()
                    part = cached_partition(self.options.partition_fn, self.recipe, lambda: self.joint)
                    seconds = time.perf_counter() - t
                    if not had_joint and self._joint is not None:  # a miss built the joint: counted apart
                        seconds -= self.programs.times.get("joint" + self.name_suffix, 0.0)
                    self._partition = _checked(part, self.options.partition_fn)
                    self.programs.times["partition" + self.name_suffix] = seconds
        return self._partition

    @property
    def out_avals(self) -> tuple:
        return _split_source(self).out_avals

    @property
    def num_aux(self) -> int:
        return _split_source(self).num_aux

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
        return _split_exe(self, self.forward_name)

    @property
    def backward_exe(self):
        return _split_exe(self, self.backward_name)

    def start_split_compiles(self) -> None:
        """Begin the forward's and backward's compiles on worker threads (lowered on this one) where not
        compiled: :attr:`forward_exe` and :attr:`backward_exe` then wait for them instead of compiling."""
        self.split_begun.begin({self.forward_name, self.backward_name} - set(self.programs.executables))

    def drop_split_compiles(self) -> None:
        """Drop the compiles :meth:`start_split_compiles` began that no executable took (waiting for running ones)."""
        self.split_begun.close()

    def drop_executables(self, names: set) -> None:
        """Forget the executables ``names`` (a fused step's timed-only split pair): the hot path holding
        the forward goes too, so nothing keeps a dropped executable alive or runs it."""
        for name in names:
            self.programs.executables.pop(name, None)
        if self.forward_name in names:
            self.eager_forward = None

    def backward_avals(self) -> list:
        """The backward's inputs: the selected cotangents, then the residuals (with their shardings, memory kinds)."""
        part = self.partition
        out_avals = self.out_avals
        cts = [jax.ShapeDtypeStruct(out_avals[i].shape, out_avals[i].dtype) for i in part.cotangent_outputs]
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
        if self.num_aux:  # a loop may outgrow its stack and rebuild everything: one thread at a time
            with self.programs.lock:
                return self._forward(leaves, concrete)
        return self._forward(leaves, concrete)

    def _forward(self, leaves: Sequence[Any], concrete: bool | None) -> tuple[list, list]:
        n_user = len(self.programs.output_is_input)
        if concrete is None:  # arrays bound where operations are staged (jit over closed-over arrays, checkify)
            concrete = not any(C.is_tracer(x) for x in leaves) and not C.stages_operations()  # join that program
        if not concrete:
            if self.num_aux:
                raise _unbounded_loop_error(self.options.name)
            fwd_outs = C.eval_closed(self.partition.forward, *leaves)
        else:
            fwd_outs = self._run_forward(leaves)
            n_aux = self.num_aux
            while n_aux and max(int(t) for t in fwd_outs[n_user:n_user + n_aux]) > self.capacity:
                # A while loop outgrew its stack: double the capacity, rebuild and rerun.
                self.capacity *= 2
                self.generation += 1
                self._reset()
                fwd_outs = self._run_forward(leaves)
                n_aux = self.num_aux
        part = self.partition
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd_outs[i] for i in part.saved_outputs]
        if concrete and self.eager_forward is None and not self.num_aux and self.programs.no_aliases:
            with self.programs.lock:
                if self.eager_forward is None:
                    self.eager_forward = _eager_forward(self)
        return fwd_outs[:n_user], residuals

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
            return self.weak_grads.typed(list(C.eval_closed(self.backward_program, *args)), cts)
        exe = self.programs.executables.get(self.backward_name) or self.backward_exe
        if self.programs.sharded:
            args = [*S.reshard_cotangents(cts, self.placement.backward_inputs()), *residuals]
        return self.weak_grads.typed(list(exe(*args)), cts)

    def unit_cotangents(self, leaf: int) -> list:
        """Cotangents 1 for output ``leaf`` (a scalar) and 0 elsewhere, made once on device."""
        cts = self._unit_cts.get(leaf)
        if cts is None:  # racing threads build equal lists; either may be kept
            outs = self.partition.cotangent_outputs
            cts = _unit_cotangents([self.out_avals[i] for i in outs], outs.index(leaf) if leaf in outs else -1)
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
                    self._custom_vjp = _custom_vjp(self)
        return self._custom_vjp


class WeakGrads:
    """Which of a :class:`TrainingPrograms`' grads JAX hands back weakly typed where its executables, compiled for
    strong cotangents, may not: the gradient of a weakly typed input (a Python float), whose arithmetic keeps a
    bfloat16 parameter bfloat16. The backward program, evaluated abstractly as under ``jit``, says which, once
    per pattern of the cotangents' weak types; nothing is cast where no differentiated input is weakly typed.

    Attributes:
      any: whether a differentiated input is weakly typed (else every answer is ``()``).
    """

    def __init__(self, tr: TrainingPrograms):
        self.tr = tr
        self.any = any(m and a.weak_type for m, a in zip(tr.mask, tr.programs.in_avals))
        self._casts: dict[tuple[bool, ...], tuple] = {}

    def casts(self, ct_weak: tuple[bool, ...] | None = None) -> tuple:
        """``(position, aval)`` per grad to hand back weakly typed, for selected cotangents of weak types
        ``ct_weak`` (default: their outputs', as ``jax.grad`` hands them)."""
        if not self.any:
            return ()
        part = self.tr.partition
        if ct_weak is None:
            out_avals = self.tr.out_avals
            ct_weak = tuple(bool(out_avals[i].weak_type) for i in part.cotangent_outputs)
        casts = self._casts.get(ct_weak)
        if casts is None:  # racing threads find equal answers; either may be kept
            outs = self._grad_avals(ct_weak)
            in_avals = self.tr.programs.in_avals
            casts = self._casts[ct_weak] = tuple(
                (k, out) for k, (i, out) in enumerate(zip(part.grad_inputs, outs))
                if in_avals[i].weak_type and out.weak_type)
        return casts

    def _grad_avals(self, ct_weak: tuple[bool, ...]) -> list:
        """The grads' avals ``jax.vjp`` of the primal program gives for cotangents of weak types ``ct_weak``; where
        that cannot be evaluated apart from the joint graph's build, the backward program's, evaluated abstractly
        for those cotangents (its zeros typed as the strong cotangents it was traced for)."""
        part = self.tr.partition
        cts = [C.abstract_input(self.tr.out_avals[i], weak_type=w) for i, w in zip(part.cotangent_outputs, ct_weak)]
        try:
            return grad_avals(self.tr.recipe, part.grad_inputs, part.cotangent_outputs, cts)
        except Exception:  # noqa: BLE001 - a program only the joint's own build can differentiate
            avals = C.in_avals_of(part.backward)  # the cotangents', then the residuals' (shardings, memory kinds)
            avals[:len(ct_weak)] = [a.update(weak_type=w) for a, w in zip(avals, ct_weak)]
            return jax.eval_shape(lambda *a: C.eval_closed(part.backward, *a), *avals)

    def typed(self, grads: list, cts: Sequence[Any]) -> list:
        """The backward's ``grads`` typed as JAX's for the cotangents ``cts`` (arrays or tracers)."""
        if not self.any:
            return grads
        return typed_grads(grads, self.casts(tuple(map(is_weakly_typed, cts))))


def typed_grads(grads: list, casts: tuple) -> list:
    """``grads`` (arrays or tracers), those at ``casts``' positions weakly typed (:meth:`WeakGrads.casts`)."""
    for k, aval in casts:
        if not is_weakly_typed(grads[k]):
            grads[k] = C.typed_as(grads[k], aval)
    return grads


def _split_compile(tr: TrainingPrograms, name: str) -> tuple:
    """``(compiler, program, avals, aliased)`` of the compile of ``tr``'s split executable ``name``."""
    p = tr.programs
    if name == tr.forward_name:
        aliased = set(tr.partition.saved_inputs) | {i for i in p.output_is_input if i is not None}
        return tr.options.fw_compiler, tr.forward_program, p.in_avals, aliased
    avals = tr.backward_avals()  # cotangents and residuals: the function's donated leaves are not among them
    return tr.options.bw_compiler, tr.backward_program, avals, set(range(len(avals)))


def _split_exe(tr: TrainingPrograms, name: str) -> Any:
    """``tr``'s split executable ``name``, compiled on first use (its compile begun ahead taken, where one was)."""
    exe = tr.programs.executables.get(name)
    if exe is None:
        args, pending = tr.split_begun.take(name)
        exe = tr.programs.compile(name, *(args or _split_compile(tr, name)), pending=pending)
    return exe


def _split_source(tr: TrainingPrograms) -> JointGraph:
    """The joint graph ``tr``'s partition was split from: the joint as traced, or a rewrite's from the cache."""
    if tr._joint is not None:
        return tr._joint
    source = tr.partition.split_from
    return tr.joint if source is None else source


def _eager_forward(tr: TrainingPrograms) -> Callable[[Sequence[Any]], tuple[list, list]]:
    """The hot path of an eager forward, once compiled: one executable call and two gathers.

    Only for programs whose outputs are all computed and that size no loop
    stack at run time (those check the loop's trip counts after each run).
    """
    exe, part = tr.forward_exe, tr.partition
    n_user = len(tr.programs.output_is_input)
    saved_in, saved_out = part.saved_inputs, part.saved_outputs

    def run(leaves):
        outs = exe(*leaves)
        return outs[:n_user], [leaves[i] for i in saved_in] + [outs[i] for i in saved_out]

    return run


@functools.partial(jax.jit, static_argnums=(0, 1))
def _units(types: tuple, one: int) -> list:
    return [jax.numpy.full(shape, 1 if i == one else 0, dtype) for i, (shape, dtype) in enumerate(types)]


def _unit_cotangents(avals: Sequence[Any], one: int) -> list:
    """Zeros of ``avals``, 1 at position ``one``: made by one program on the device (compiled once per shapes and
    dtypes), so nothing is transferred, as in ``jit(value_and_grad)``'s step."""
    return _units(tuple((tuple(a.shape), str(a.dtype)) for a in avals), one)


def _custom_vjp(tr: TrainingPrograms) -> Callable:
    """``tr``'s ``jax.custom_vjp``: JAX's autodiff runs its forward and backward executables."""
    # What the joint graph will differentiate, read off the primal program: a
    # call under jit that differentiates nothing never builds the joint graph.
    primal = tr.programs.primal
    out_avals = C.out_avals_of(primal)
    cts = tuple(i for i, a in enumerate(out_avals) if C.is_inexact(a.dtype))
    return custom_vjp_of(SplitPrograms(
        primal=lambda leaves: C.eval_closed(primal, *leaves),  # only ever traced
        forward=tr.forward,
        backward=tr.backward,
        num_inputs=len(tr.programs.in_avals),
        grad_inputs=tuple(i for i, m in enumerate(tr.mask) if m),
        cotangent_outputs=cts,
        cotangent_dtypes=tuple(out_avals[i].dtype for i in cts),
    ))


def _checked(part: Any, partition_fn: Callable) -> Partition:
    """``part`` if it is a :class:`~jaxaot.partition.Partition`, else a :class:`~jaxaot.errors.PartitionError` naming
    the partitioner (nothing is kept: the next call partitions again)."""
    if isinstance(part, Partition):
        return part
    name = getattr(partition_fn, "__qualname__", None) or repr(partition_fn)
    raise PartitionError(
        f"partition_fn {name} returned a {type(part).__name__}, not a jaxaot.partition.Partition. A partitioner takes the "
        "JointGraph and returns the Partition it chose (jaxaot.partition.default_partition(joint), say): return one.")


def _unbounded_loop_error(name: str) -> Exception:
    return ReverseModeBoundError(
        f"{name} contains a jaxaot.loops.while_loop without max_steps or checkpoints and is being "
        "reverse-differentiated inside another transformation (jit, vmap, or a higher-order grad). "
        "The runtime can size the loop's stack only when the aot_function is called eagerly: "
        "pass max_steps=N or checkpoints=k to the while_loop."
    )
