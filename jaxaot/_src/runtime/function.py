"""``aot_function`` and ``AOTFunction``: trace -> partition -> compile, per input signature.

Per input signature an :class:`AOTFunction` keeps one
:class:`~jaxaot._src.runtime.SignaturePrograms` with up to three executables, each
built when first needed: *inference*, *forward* (outputs and residuals) and
*backward*. Eager ``jax.grad`` reaches them through a ``jax.custom_vjp``; under any
other trace the same partitioned programs are evaluated in that trace, so
everything composes. Front-ends use :meth:`AOTFunction.lookup` and
:meth:`AOTFunction.lowered`.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.names import callable_name
from jaxaot._src.compile import Compiler, compilers
from jaxaot.errors import InvalidInputError
from jaxaot._src.loops import overflow_checked, overflow_mark
from jaxaot._src.partition import Partitioner, default_partition
from jaxaot._src.runtime import arguments, checks, reasons
from jaxaot._src.runtime.calls import call_signature, stage_call
from jaxaot._src.runtime.hot_path import HotPath, hot_leaves, hot_path
from jaxaot._src.runtime.lowered import AOTLowered
from jaxaot._src.runtime.traced import AOTTraced
from jaxaot._src.runtime.options import Options, check_options
from jaxaot._src.runtime.signature_programs import SignaturePrograms
from jaxaot._src.runtime.training import TrainingPrograms
from jaxaot._src.runtime.residuals import Residuals
from jaxaot._src.runtime.shardings import check_same_devices
from jaxaot._src.runtime.signature import CacheEntryInfo, CacheInfo, Signature, TraceKind, describe_signature, leaf_avals


class Lookup(NamedTuple):
    """What :meth:`AOTFunction.lookup` finds for a call."""

    programs: SignaturePrograms
    leaves: list
    kind: TraceKind


def _public_call(method: Callable) -> Callable:
    """``method`` as users call it: raising :class:`~jaxaot.errors.LoopOverflowError` when a ``max_steps`` loop it
    ran overflowed (:func:`jaxaot._src.loops.reraise_overflow`), and an API boundary of JAX's traceback filtering
    (an error in the user's function shows the user's lines, as under ``jit``)."""

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        mark = overflow_mark()
        return overflow_checked(mark, method(*args, **kwargs))

    return C.api_boundary(run)


class AOTFunction:
    """A function compiled ahead of time into separate forward and backward executables.

    Build one with :func:`aot_function`. Calling it behaves like calling the
    original function, under every JAX transformation.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda x: jnp.sum(x ** 3))
        >>> jax.grad(f)(jnp.arange(3.0)).tolist()
        [0.0, 3.0, 12.0]
    """

    def __init__(self, fn: Callable[..., Any], fw_compiler: Compiler | None, bw_compiler: Compiler | None,
                 partition_fn: Partitioner, inference_compiler: Compiler | None,
                 decompositions: Mapping[Any, Callable] | None, static_argnums: Sequence[int],
                 donate_argnums: Sequence[int], out_shardings: Any = None, residual_sharding: str = "producer"):
        self.fn = fn
        self.fw_compiler = fw_compiler or compilers.xla
        self.bw_compiler = bw_compiler or self.fw_compiler
        self.inference_compiler = inference_compiler or self.fw_compiler
        self.partition_fn = partition_fn
        self.decompositions = dict(decompositions) if decompositions else None
        self.static_argnums = tuple(sorted(static_argnums))
        self.donate_argnums = tuple(sorted(donate_argnums))
        self.__wrapped__, self.__name__, self.__doc__ = fn, callable_name(fn), getattr(fn, "__doc__", None)
        self.__qualname__, self.__module__ = getattr(fn, "__qualname__", self.__name__), getattr(fn, "__module__", None)
        self.options = Options(self.__name__, self.fw_compiler, self.bw_compiler, self.inference_compiler,
                               partition_fn, self.decompositions, out_shardings, residual_sharding)
        self._cache: dict[Signature, SignaturePrograms] = {}
        self._infos: list[CacheEntryInfo] = []
        self._hits = 0
        self._names: reasons.ArgNames | None = None  # the positional arguments' names, read on the first miss
        self._names_for: Callable[[Signature], reasons.ArgNames] | None = None  # a front-end's names, by signature
        self._hot: HotPath | None = None
        self._lock = threading.RLock()  # taken only on a cache miss: each signature is traced once
        self._derived: dict[Hashable, Any] = {}  # what front-ends made of it (its gradients), living as it lives

    # -- the interface of front-ends
    def lookup(self, args: tuple, kwargs: dict) -> Lookup:
        """The programs of this call's signature (traced on a miss), its leaves and trace kind: one pass, hot path."""
        sig, leaves, kind = call_signature(self, args, kwargs)
        programs = self._cache.get(sig)
        if programs is None:
            with self._lock:  # double-checked: another thread may have traced it meanwhile
                programs = self._cache.get(sig)
                if programs is None:
                    return Lookup(self._new_programs(sig, leaves), leaves, kind)
        self._hits += 1
        return Lookup(programs, leaves, kind)

    def note_hit(self) -> None:
        """Count a call that ran a :class:`HotPath` as a cache hit (:meth:`cache_info`)."""
        self._hits += 1

    def lowered(self, training: TrainingPrograms, run: Callable[..., Any] | None = None,
                runs_step: bool = False) -> AOTLowered:
        """The :class:`AOTLowered` of ``training`` (not compiled), whose compiled stage runs ``run`` (this function
        by default) on this signature's arguments (:func:`stage_call`); ``runs_step``: ``run`` runs the fused step."""
        return AOTLowered(training, stage_call(self, training.programs.signature, run or self), runs_step)

    def _new_programs(self, sig: Signature, leaves: list) -> SignaturePrograms:
        flat_fn = arguments.flat_function(self.fn, self.static_argnums, sig.static, sig.treedef)
        donated = arguments.donated_leaves(sig.treedef, len(sig.static), self.static_argnums, self.donate_argnums,
                                           self.fn)
        avals = leaf_avals(leaves)
        check_same_devices(sig.treedef, leaves, avals)
        names = self._arg_names()
        reason = reasons.describe_change(reasons.nearest(list(self._cache), sig, self._paths), sig, self._paths, names)
        programs = SignaturePrograms(self.options, sig, flat_fn, avals, donated)
        self._cache[sig] = programs
        text = describe_signature(sig, self._paths(sig), [names(s.index) for s in sig.static])
        self._infos.append(CacheEntryInfo(text, reason, ()))
        reasons.log_compile(self.__name__, text, reason)
        return programs

    def _arg_names(self) -> reasons.ArgNames:
        if self._names is None:
            self._names = reasons.ArgNames.of(self.fn)
        return self._names

    def _paths(self, sig: Signature) -> list[str]:
        """The leaves of ``sig`` by parameter name and pytree path (``params['w']``)."""
        names = self._arg_names() if self._names_for is None else self._names_for(sig)
        return reasons.signature_paths(sig.treedef, len(sig.static), self.static_argnums, names)

    # -- calling
    @_public_call
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if C.jit_disabled():  # as jit's: the function's Python, op by op (and JAX's own autodiff through it)
            return self.fn(*args, **kwargs)
        programs, leaves, kind = self.lookup(args, kwargs)
        if kind is TraceKind.ABSTRACT:
            raise _abstract_call_error(self.__name__)
        if programs.closes_over_tracers:  # a model built inside a transformation: its one trace, replayed there
            self._cache.pop(programs.signature, None)
            return jax.tree_util.tree_unflatten(programs.out_tree, C.eval_closed(programs.primal, *leaves))
        if kind is TraceKind.CONCRETE and not C.stages_operations():
            outs = programs.infer(leaves)
        else:
            if kind is not TraceKind.TRACED:
                # forward mode (custom_vjp refuses it), arrays under jit (staged, as a jit in a jit): the primal inlined
                outs = C.eval_forward_mode(programs.primal, *leaves)
            else:
                # Leaves the reverse-mode trace does not differentiate (concrete ones, the data of a
                # jit(value_and_grad) step) stay out of the joint.
                mask = C.reverse_mode_mask(leaves)
                outs = programs.training(mask).custom_vjp(*leaves)
            outs = [o if sh is None else C.pin_sharding(o, sh) for o, sh in zip(outs, programs.out_shardings)]
        return jax.tree_util.tree_unflatten(programs.out_tree, outs)

    @_public_call
    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, Residuals]:
        """Run the compiled forward: ``(outputs, residuals)``.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
            >>> y, res = f.forward(jnp.ones(3))
            >>> (dx,) = f.backward(res, jnp.float32(1.0))

        Under ``jax.disable_jit()`` it runs the compiled programs, as a ``Compiled`` stage does. A function closing
        over an outer transformation's tracer compiles none: InvalidInputError (call it, or take its gradient)."""
        if C.jit_disabled():
            with jax.disable_jit(False):
                return self.forward(*args, **kwargs)
        hot = _hot_forward(self, args, kwargs)
        if hot is not None:
            return hot
        programs, leaves, kind = self.lookup(args, kwargs)
        _check_compiles(self, programs, kind)
        concrete = kind is TraceKind.CONCRETE
        tr = programs.training()
        outs, residuals = tr.forward(leaves, concrete=concrete)
        if concrete and tr.eager_forward is not None:
            self._hot = hot_path(tr, leaves, static=bool(self.static_argnums)) or self._hot
        return jax.tree_util.tree_unflatten(programs.out_tree, outs), Residuals(residuals, tr, checked=concrete)

    @_public_call
    def backward(self, residuals: Residuals, cotangents: Any) -> Any:
        """Run the compiled backward on residuals from :meth:`forward`.

        ``cotangents`` has the structure of the outputs (leaves of integer
        outputs are ignored and may be ``None``). Returns gradients shaped like
        the positional arguments (a tuple), or ``(args, kwargs)`` gradients when
        the call had keyword arguments; non-differentiable leaves get ``float0``
        zeros, as in ``jax.vjp``.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda w, x: jnp.sum(w * x))
            >>> out, res = f.forward(jnp.ones(2), jnp.arange(2.0))
            >>> dw, dx = f.backward(res, jnp.float32(1.0))
            >>> dw.tolist()
            [0.0, 1.0]
        """
        if C.jit_disabled():  # the compiled programs, as :meth:`forward`'s
            with jax.disable_jit(False):
                return self.backward(residuals, cotangents)
        tr = checks.check_residuals_origin(self.__name__, self.options, residuals)
        if not residuals.checked:
            checks.check_residual_arrays(tr, residuals.arrays)
        cts = checks.user_cotangents(tr, cotangents)
        grads = tr.backward(residuals.arrays, cts, concrete_residuals=residuals.checked)
        dyn, kwargs = tr.input_grads_tree(grads)
        return (dyn, kwargs) if kwargs else dyn

    # -- introspection
    def lower(self, *args: Any, **kwargs: Any) -> AOTLowered:
        """Trace and partition for this signature (nothing compiles): the first of JAX's stages.

        ``.compile()`` on the result compiles the three programs. Inputs may be ``jax.ShapeDtypeStruct`` too.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
            >>> low = f.lower(jnp.ones(3))
            >>> low.saved_bytes
            12
        """
        return self.lowered(self.lookup(args, kwargs).programs.staged_training())

    def trace(self, *args: Any, **kwargs: Any) -> AOTTraced:
        """Trace for this signature (nothing partitions or compiles): ``.jaxpr`` is the function's, as
        ``jax.jit(f).trace(...)``'s; ``.lower()`` partitions it, as :meth:`lower` does."""
        return AOTTraced(self.lookup(args, kwargs).programs, self.lowered, self.__name__)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The outputs as ``jax.ShapeDtypeStruct`` leaves, as ``jax.jit(f).eval_shape`` gives (nothing compiles)."""
        return jax.jit(self.fn, static_argnums=self.static_argnums,
                       out_shardings=self.options.out_shardings).eval_shape(*args, **kwargs)

    def cache_info(self) -> CacheInfo:
        """Compiled signatures: per signature the executables kept, every compilation (fused-step variants
        included), the seconds spent tracing, partitioning and in XLA, and why it was (re)compiled.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda params, x: jnp.sum(x @ params["w"]))
            >>> _ = f({"w": jnp.ones((3, 2))}, jnp.ones((4, 3))); _ = f({"w": jnp.ones((5, 2))}, jnp.ones((4, 5)))
            >>> f.cache_info().entries[1].reason
            "params['w']: shape (3, 2) → (5, 2); x: shape (4, 3) → (4, 5)"
        """
        return _cache_info(self)

    def __copy__(self, memo: dict | None = None) -> "AOTFunction":
        return _copied(self)  # as jax.jit's copies, deep ones too: the same function and options, a cache of its own

    __deepcopy__ = __copy__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)  # a method binds it, as jax.jit's

    def __repr__(self) -> str:
        return f"<AOTFunction {self.__name__}: {len(self._cache)} signatures>"


def _hot_forward(fun: AOTFunction, args: tuple, kwargs: dict) -> tuple[Any, Residuals] | None:
    """:meth:`AOTFunction.forward` of a training loop's one signature: its executable run directly (unless it was
    dropped since, with the split pair a fused step beat); None where the call's arguments need a lookup (the
    executable itself refuses other devices: ValueError)."""
    hot = fun._hot
    leaves = hot_leaves(hot, args, kwargs)
    if leaves is None or hot.training.eager_forward is None:
        return None
    tr = hot.training
    try:
        outs, residuals = tr.eager_forward(leaves)
    except ValueError:
        return None  # a sharding the last signature did not have: look it up
    fun.note_hit()
    return jax.tree_util.tree_unflatten(tr.programs.out_tree, outs), Residuals(residuals, tr, checked=True)


def _cache_info(fun: AOTFunction) -> CacheInfo:
    with fun._lock:
        entries = tuple(
            dataclasses.replace(info, executables=tuple(p.executables), fused=tuple(p.fused_choices.values()),
                                compiles=tuple(p.compiled), times=dict(p.times))
            for info, p in zip(fun._infos, list(fun._cache.values()))
        )
        return CacheInfo(hits=fun._hits, misses=len(fun._cache), entries=entries)


def _copied(fun: AOTFunction) -> AOTFunction:
    """A copy of ``fun`` as ``jax.jit``'s copies are: the same function and options, with a compile cache of its own
    (the persistent cache still serves its compiles)."""
    o = fun.options
    new = AOTFunction(fun.fn, fun.fw_compiler, fun.bw_compiler, fun.partition_fn, fun.inference_compiler,
                      fun.decompositions, fun.static_argnums, fun.donate_argnums, o.out_shardings, o.residual_sharding)
    new._names_for = fun._names_for
    return new


def _check_compiles(fun: AOTFunction, programs: SignaturePrograms, kind: TraceKind) -> None:
    """Raise where :meth:`AOTFunction.forward` cannot run compiled programs: inputs without values, or a function
    closing over an outer transformation's tracers (whose forward and backward are not compiled)."""
    if kind is TraceKind.ABSTRACT:
        raise _abstract_call_error(fun.__name__)
    if programs.closes_over_tracers:
        fun._cache.pop(programs.signature, None)
        raise InvalidInputError(
            f"{fun.__name__} closes over a tracer of an outer jax.jit, jax.vmap or jax.grad, so its forward and "
            f"backward are not compiled: call {fun.__name__} itself, or take its gradient (jax.grad, "
            f"jaxaot.value_and_grad), which evaluate its trace with JAX's own autodiff.")


def closed_over_tracers(fun: AOTFunction, programs: SignaturePrograms) -> Callable[..., Any]:
    """``fun``'s function as the one trace ``programs.primal``, for programs that close over an outer
    transformation's tracers (nothing compiles): JAX's own transformations differentiate it, as ``fun``'s call
    evaluates it. Its cache entry is dropped, as the call drops it (the tracers do not outlive their trace)."""
    fun._cache.pop(programs.signature, None)

    def primal(*args: Any, **kwargs: Any) -> Any:
        leaves = arguments.split_static(fun.static_argnums, args, kwargs, fun.fn)[1]
        return jax.tree_util.tree_unflatten(programs.out_tree, C.eval_closed(programs.primal, *leaves))
    return primal


def _abstract_call_error(name: str) -> Exception:
    return InvalidInputError(
        f"{name} was called with jax.ShapeDtypeStruct inputs: those describe arrays without values. "
        "Use .lower(...) to compile from shapes alone, or pass arrays to run it."
    )


def aot_function(
    fn: Callable[..., Any],
    fw_compiler: Compiler | None = None,
    bw_compiler: Compiler | None = None,
    partition_fn: Partitioner | None = default_partition,
    *,
    inference_compiler: Compiler | None = None,
    decompositions: Mapping[Any, Callable] | None = None,
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    out_shardings: Any = None,
    residual_sharding: str = "producer",
) -> AOTFunction:
    """Compile ``fn`` ahead of time into separate forward and backward executables.

    Args:
      fn: a function of pytrees of arrays returning a pytree of arrays.
      fw_compiler: compiles the forward program; default :func:`jaxaot.compilers.xla`.
      bw_compiler: compiles the backward program; default ``fw_compiler``.
      partition_fn: chooses what the forward saves; default (or None) :func:`default_partition`.
        Its result must be a :class:`~jaxaot.partition.Partition` (a :class:`~jaxaot.errors.PartitionError`
        naming it otherwise, at the first call that partitions).
      inference_compiler: compiles the inference program; default ``fw_compiler``.
      decompositions: ``{primitive: python_fn}`` applied while tracing, so the
        partitioner sees the decomposed operations; they reach into loop and
        cond bodies, not into ``custom_jvp``/``custom_vjp`` functions (whose
        derivative rules are written for the original operations).
      static_argnums: positional arguments that are compile-time constants (also when passed by name, as jax.jit's).
      donate_argnums: positional arguments whose buffers the executables may reuse.
      out_shardings: a ``jax.sharding.Sharding``, or a pytree prefix of the
        outputs with one (or None) per output, pinning where the outputs live,
        as ``jax.jit``'s ``out_shardings``; default: wherever XLA's SPMD
        partitioner puts them.
      residual_sharding: where a sharded forward keeps its residuals:
        ``"producer"`` (default) leaves each as the forward produced it;
        ``"replicated"`` keeps a full copy on every device of the mesh.

    Sharded inputs (committed ``jax.Array``s on several devices, or any input
    under a ``jax.set_mesh`` context) compile every program for their shardings:
    see ``docs/concepts/sharding.md``. A call's signature includes JAX's configuration (``jax_enable_x64``,
    matmul precision, dtype and rank promotion): a change compiles again, as under ``jit``. Under
    ``jax.disable_jit()`` a call runs ``fn``'s Python op by op, as ``jit``'s does; ``forward`` and ``backward``
    still run the compiled programs.

    Raises:
      InvalidInputError: ``fn`` or a compiler or partitioner is not callable, ``fn`` is a generator function,
        ``decompositions`` is not a dict of primitives to functions, ``static_argnums``/``donate_argnums`` are
        not non-negative ints or overlap, ``out_shardings`` holds something other than Shardings,
        ``residual_sharding`` is not a string.
      InvalidValueError: ``residual_sharding`` is not a policy; ``static_argnums``/``donate_argnums`` name a
        position beyond ``fn``'s positional parameters (as ``jax.jit``'s ``ValueError``).

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
        >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
        >>> loss, dw = jax.value_and_grad(f)(w, x)
        >>> dw.shape
        (3, 2)
    """
    if not callable(fn):
        raise InvalidInputError(f"aot_function expects a callable fn, got {type(fn).__name__}: {fn!r}.")
    arguments.check_traceable(fn, "aot_function")
    partitioner = check_options(
        fw_compiler=fw_compiler, bw_compiler=bw_compiler, inference_compiler=inference_compiler,
        partition_fn=partition_fn, decompositions=decompositions, out_shardings=out_shardings,
        residual_sharding=residual_sharding)
    who = callable_name(fn)
    static = arguments.argnums_of("static_argnums", static_argnums, fn, who)
    donate = arguments.argnums_of("donate_argnums", donate_argnums, fn, who)
    if set(static) & set(donate):
        raise InvalidInputError(f"arguments {sorted(set(static) & set(donate))} cannot be both static and donated.")
    if not partition_fn:
        partitioner = default_partition  # a configured min-cut is one MinCutOptions, read by check_options
    return AOTFunction(fn, fw_compiler, bw_compiler, partitioner, inference_compiler,
                       decompositions, static, donate, out_shardings, residual_sharding)

