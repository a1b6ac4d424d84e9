"""Stage 4: the runtime. ``aot_function`` wires trace -> partition -> compile.

Per input signature (pytree structure, shapes, dtypes, weak types, shardings,
static arguments) an :class:`AOTFunction` keeps one :class:`_Entry`: the traced
programs and up to three executables, each built the first time it is needed:

* *inference*: the primal program, for calls that differentiate nothing;
* *forward*: outputs plus the saved values (residuals);
* *backward*: gradients from cotangents and residuals.

Eager ``jax.grad`` reaches the forward and backward executables through a
``jax.custom_vjp`` whose rules receive concrete arrays. Under any other trace
(``jit``, ``vmap``, ``jvp``, higher-order ``grad``) the same partitioned
programs are evaluated in that trace, so everything composes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from jaxaot import _compat as C
from jaxaot.compile import compilers as _compilers
from jaxaot.errors import (
    CotangentMismatchError,
    InvalidInputError,
    ResidualsMismatchError,
    ReverseModeBoundError,
)
from jaxaot.partition.split import Partition, Residual
from jaxaot.partition.default import default_partition
from jaxaot.loops.api import dynamic_capacity
from jaxaot._pytrees import flatten_checked, is_array_leaf, leaf_paths
from jaxaot.tracing.primal import trace_primal
from jaxaot.tracing.joint import JointGraph, build_joint

PartitionFn = Callable[[JointGraph], Partition]

#: The first stack capacity of while loops whose stack the runtime sizes (doubled on overflow).
_INITIAL_LOOP_CAPACITY = 32


# --------------------------------------------------------------------------- signatures
_DEFAULT_DEVICE: list = []
_ArrayImpl = C.ArrayImpl


_SHARDING_KEYS: dict[Any, Any] = {}  # a program sees few distinct shardings: remember each one's key


def _sharding_key(sharding: Any) -> Any:
    # Arrays on the default device key like tracers do (None), so that tracing a
    # signature under jit reuses the entry that eager calls built.
    try:
        return _SHARDING_KEYS[sharding]
    except KeyError:
        pass
    if not _DEFAULT_DEVICE:
        _DEFAULT_DEVICE.append(jax.devices()[0])
    key = None if C.single_device_of(sharding) == _DEFAULT_DEVICE[0] else sharding
    if len(_SHARDING_KEYS) < 1024:
        _SHARDING_KEYS[sharding] = key
    return key


def _leaf_key(x: Any) -> Any:
    """The part of a leaf's type that selects a compiled executable.

    The aval (shape, dtype, weak type) alone for most leaves: it is cached on
    arrays and cheap to hash. Committed arrays add their sharding.
    """
    if isinstance(x, C.Tracer):
        return x.aval
    if isinstance(x, jax.Array):
        if x.committed:
            sk = _sharding_key(x.sharding)
            if sk is not None:
                return (x.aval, sk)
        return x.aval
    if isinstance(x, jax.ShapeDtypeStruct):  # abstract input, for lower()
        aval = C.shaped_abstractify(x)
        sk = _sharding_key(x.sharding) if x.sharding is not None else None
        return aval if sk is None else (aval, sk)
    return jax.typeof(x)


def _key_parts(k: Any) -> tuple:
    aval, sharding = k if isinstance(k, tuple) else (k, None)
    return aval.shape, aval.dtype, aval.weak_type, sharding


def _leaf_avals(leaves: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    out = []
    for x in leaves:
        if isinstance(x, jax.Array) and not C.is_tracer(x):
            a = x.aval  # typed PRNG keys have no .weak_type of their own
            out.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=x.sharding, weak_type=a.weak_type))
        elif isinstance(x, jax.ShapeDtypeStruct):
            out.append(x)
        else:
            a = jax.typeof(x)
            out.append(jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type))
    return out


def _fmt_key(k: Any) -> str:
    shape, dtype, weak, _ = _key_parts(k)
    name = getattr(dtype, "name", str(dtype))
    short = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
             "int64": "i64", "bool": "bool", "uint8": "u8", "int8": "i8", "complex64": "c64"}.get(name, name)
    return f"{short}[{','.join(map(str, shape))}]" + ("{weak}" if weak and shape != () else "")


def _describe_change(old: "_Signature", new: "_Signature") -> str:
    if old.static != new.static:
        return f"static arguments changed: {old.static!r} -> {new.static!r}"
    if old.treedef != new.treedef:
        return f"input pytree structure changed: {old.treedef} -> {new.treedef}"
    paths = leaf_paths(new.treedef, "input")
    diffs = []
    for path, ka, kb in zip(paths, old.leaves, new.leaves):
        a, b = _key_parts(ka), _key_parts(kb)
        if a[:3] != b[:3]:
            diffs.append(f"{path}: {_fmt_key(ka)} -> {_fmt_key(kb)}")
        elif a[3] != b[3]:
            diffs.append(f"{path}: sharding {a[3]} -> {b[3]}")
    return "; ".join(diffs) or "new signature"


class _Signature(NamedTuple):
    # A NamedTuple, not a dataclass: it is hashed on every call.
    treedef: Any
    leaves: tuple
    static: tuple


@dataclasses.dataclass(frozen=True)
class CacheEntryInfo:
    """One compiled signature of an :class:`AOTFunction`."""

    signature: str
    reason: str
    executables: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What :meth:`AOTFunction.cache_info` reports."""

    hits: int
    misses: int
    entries: tuple[CacheEntryInfo, ...]

    @property
    def recompiles(self) -> int:
        return max(self.misses - 1, 0)


# --------------------------------------------------------------------------- residuals
@jax.tree_util.register_pytree_node_class
class Residuals:
    """The values ``AOTFunction.forward`` hands to ``AOTFunction.backward``.

    A pytree (its leaves are the saved arrays) that remembers which compiled
    signature produced it, so ``backward`` can refuse residuals of another one.
    """

    def __init__(self, arrays: Sequence[Any], training: "_Training", generation: int | None = None,
                 *, _checked: bool = False):
        self.arrays = tuple(arrays)
        self._training = training
        self._generation = training.generation if generation is None else generation
        # Made by an eager forward itself: shapes are right and no array is a
        # tracer by construction, so backward skips both checks.
        self._checked = _checked

    def tree_flatten(self):
        return self.arrays, (self._training, self._generation)

    @classmethod
    def tree_unflatten(cls, aux, arrays):
        return cls(arrays, *aux)

    @property
    def residuals(self) -> tuple[Residual, ...]:
        return self._training.partition.residuals

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.residuals)

    def __repr__(self) -> str:
        return f"Residuals({len(self.arrays)} arrays, {self.nbytes} bytes)"


# --------------------------------------------------------------------------- lowered
@dataclasses.dataclass(frozen=True)
class AOTLowered:
    """Everything jaxaot built for one input signature (from ``aot_fn.lower``).

    Attributes:
      joint: the :class:`JointGraph`.
      partition: the :class:`Partition`.
      inference / forward / backward: closed jaxprs of the three programs.
      saved: the :class:`Residual` of each saved value (shape, dtype, bytes,
        producing eqn and source line).
      recomputed: forward eqns the backward recomputes.
      compile_times: seconds spent tracing, partitioning and compiling each.
      executables: the compiled executables by name.
    """

    joint: JointGraph
    partition: Partition
    inference: Any
    compile_times: Mapping[str, float]
    executables: Mapping[str, Any]

    @property
    def forward(self) -> Any:
        return self.partition.forward

    @property
    def backward(self) -> Any:
        return self.partition.backward

    @property
    def saved(self) -> tuple[Residual, ...]:
        return self.partition.residuals

    @property
    def saved_bytes(self) -> int:
        return self.partition.saved_bytes

    @property
    def recomputed(self) -> tuple[str, ...]:
        return tuple(self.partition.recomputed)

    def memory_analysis(self) -> dict[str, Any]:
        """Per executable, the backend's memory analysis (None where unavailable).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> sorted(low.memory_analysis())
            ['backward', 'forward', 'inference']
        """
        return {k: _safe(lambda e=e: e.memory_analysis()) for k, e in self.executables.items()}

    def cost_analysis(self) -> dict[str, Any]:
        """Per executable, the backend's cost analysis (None where unavailable).

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> sorted(low.cost_analysis())
            ['backward', 'forward', 'inference']
        """
        return {k: _safe(lambda e=e: e.cost_analysis()) for k, e in self.executables.items()}

    def residual_table(self) -> str:
        """The saved values as a text table: source, shape, dtype, bytes, producer, line.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
            >>> print(low.residual_table().splitlines()[1].split()[:5])
            ['0', 'temporary[1]', '[3]', 'float32', '12']
        """
        rows = [("#", "source", "shape", "dtype", "bytes", "producer", "line")]
        for i, r in enumerate(self.saved):
            rows.append((str(i), f"{r.source}[{r.index}]", str(list(r.aval.shape)), str(r.aval.dtype),
                         str(r.nbytes), r.producer, r.source_line))
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

    def __str__(self) -> str:
        times = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.compile_times.items())
        parts = [
            f"== forward: {len(self.partition.residuals)} residuals, {self.saved_bytes} bytes saved ==",
            str(self.forward),
            "== backward ==",
            str(self.backward),
            "== residuals ==",
            self.residual_table(),
        ]
        if self.recomputed:
            parts += ["== recomputed in backward ==", *self.recomputed]
        parts.append(f"== times: {times} ==")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        """Jupyter's view: the split as a graph plus the residual table (:func:`jaxaot.viz.to_html`)."""
        from jaxaot import viz  # graphviz/matplotlib are optional: import only when displayed

        return viz.to_html(self)


def _safe(f: Callable[[], Any]) -> Any:
    try:
        return f()
    except Exception:  # backends without analyses raise various errors
        return None


# --------------------------------------------------------------------------- entry
def _prune_outputs(closed: Any, keep: Sequence[int]) -> Any:
    j = C.jaxpr_of(closed)
    return C.make_closed_jaxpr(j.constvars, j.invars, [j.outvars[i] for i in keep], j.eqns, C.consts_of(closed))


class _Entry:
    """Programs and executables for one input signature.

    The inference program lives here; training programs depend also on which
    inputs are differentiated (``jax.grad(f, argnums=0)`` differentiates fewer
    than ``jax.vjp``), so each such mask gets its own :class:`_Training`.
    """

    def __init__(self, owner: "AOTFunction", sig: _Signature, flat_fn: Callable, avals: list):
        self.owner = owner
        self.signature = sig
        self.in_avals = avals
        self.times: dict[str, float] = {}
        self.executables: dict[str, Any] = {}
        t = time.perf_counter()
        self.primal, self.out_tree = trace_primal(flat_fn, avals, owner.decompositions)
        self.times["trace"] = time.perf_counter() - t
        primal = C.jaxpr_of(self.primal)
        positions = {v: i for i, v in enumerate(primal.invars)}
        self.output_is_input = [None if C.is_literal(v) else positions.get(v) for v in primal.outvars]
        self.computed_outputs = [i for i, src in enumerate(self.output_is_input) if src is None]
        self.no_aliases = len(self.computed_outputs) == len(primal.outvars)
        self.inexact = tuple(C.is_inexact(a.dtype) for a in avals)
        self._training: dict[tuple[bool, ...], _Training] = {}

    def training(self, mask: Sequence[bool] | None = None) -> "_Training":
        """The training programs when the inputs in ``mask`` are differentiated."""
        key = self.inexact if mask is None else tuple(m and d for m, d in zip(mask, self.inexact))
        tr = self._training.get(key)
        if tr is None:
            tr = self._training[key] = _Training(self, key)
        return tr

    def compile(self, name: str, compiler: Callable, closed: Any, avals: Sequence[Any], donate=()):
        exe = self.executables.get(name)
        if exe is None:
            t = time.perf_counter()
            kwargs = {"donate_argnums": tuple(donate)} if donate and compiler is _compilers.xla else {}
            from jaxaot.compile import cache  # the persistent cache hook (a no-op when config.cache_dir is None)
            exe = cache.cached_compile(compiler, closed, list(avals), **kwargs)
            self.times[f"compile_{name}"] = time.perf_counter() - t
            self.executables[name] = exe
        return exe

    def donated(self, excluded: set) -> list[int]:
        return [i for i in self.owner._donated_leaves(self.signature) if i not in excluded]

    @property
    def inference_exe(self):
        exe = self.executables.get("inference")
        if exe is None:
            closed = _prune_outputs(self.primal, self.computed_outputs)
            aliased = {i for i in self.output_is_input if i is not None}
            exe = self.compile("inference", self.owner.inference_compiler, closed, self.in_avals,
                               self.donated(aliased))
        return exe

    def splice(self, leaves: Sequence[Any], computed: Sequence[Any]) -> list:
        """Full outputs from the computed ones: outputs that are inputs skip the executable."""
        if self.no_aliases:
            return list(computed)
        it = iter(computed)
        return [next(it) if src is None else leaves[src] for src in self.output_is_input]

    def infer(self, leaves: Sequence[Any]) -> list:
        exe = self.executables.get("inference")
        if exe is not None:  # the hot path: concrete arrays, already compiled
            return self.splice(leaves, exe(*leaves))
        if any(C.is_tracer(x) for x in leaves):
            return C.eval_closed(self.primal, *leaves)
        return self.splice(leaves, self.inference_exe(*leaves))


class _Training:
    """Joint graph, partition and forward/backward executables for one differentiated mask."""

    def __init__(self, entry: _Entry, mask: tuple[bool, ...]):
        self.entry = entry
        self.owner = entry.owner
        self.mask = mask
        full = mask == entry.inexact
        self.suffix = "" if full else "[" + ",".join(str(i) for i, m in enumerate(mask) if m) + "]"
        self._backward_name = "backward" + self.suffix
        self.capacity = _INITIAL_LOOP_CAPACITY
        self.generation = 0  # bumped when a loop outgrows its stack and all is rebuilt
        self._custom_vjp: Callable | None = None
        self._float0s: list | None = None
        self._reset()

    def _reset(self) -> None:
        self._joint: JointGraph | None = None
        self._partition: Partition | None = None
        self._unit_cts: dict[int, list] = {}
        self._eager_forward: Callable | None = None
        for name in ("forward", "backward"):
            self.entry.executables.pop(name + self.suffix, None)

    @property
    def joint(self) -> JointGraph:
        if self._joint is None:
            e = self.entry
            t = time.perf_counter()
            self._joint = build_joint(
                e.primal, e.signature.treedef, e.out_tree, e.in_avals, self.owner.decompositions, self.mask,
                aux_outputs=lambda: dynamic_capacity(self.capacity),
            )
            e.times["joint" + self.suffix] = time.perf_counter() - t
        return self._joint

    @property
    def partition(self) -> Partition:
        if self._partition is None:
            joint = self.joint
            t = time.perf_counter()
            from jaxaot.compile import cache  # the persistent cache hook (a no-op when config.cache_dir is None)
            self._partition = cache.cached_partition(self.owner.partition_fn, joint)
            self.entry.times["partition" + self.suffix] = time.perf_counter() - t
        return self._partition

    @property
    def forward_exe(self):
        e = self.entry
        exe = e.executables.get("forward" + self.suffix)
        if exe is None:
            part = self.partition
            n_fwd = len(C.jaxpr_of(part.forward).outvars)
            keep = e.computed_outputs + list(range(len(e.output_is_input), n_fwd))
            closed = _prune_outputs(part.forward, keep)
            aliased = set(part.saved_inputs) | {i for i in e.output_is_input if i is not None}
            exe = e.compile("forward" + self.suffix, self.owner.fw_compiler, closed, e.in_avals, e.donated(aliased))
        return exe

    @property
    def backward_exe(self):
        exe = self.entry.executables.get("backward" + self.suffix)
        if exe is None:
            exe = self.entry.compile("backward" + self.suffix, self.owner.bw_compiler, self.partition.backward,
                                     self.backward_avals())
        return exe

    def backward_avals(self) -> list:
        part = self.partition
        cts = [self.joint.out_avals[i] for i in part.cotangent_outputs]
        cts = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in cts]
        return cts + [jax.ShapeDtypeStruct(r.aval.shape, r.aval.dtype, weak_type=r.aval.weak_type)
                      for r in part.residuals]

    def forward(self, leaves: Sequence[Any], concrete: bool | None = None) -> tuple[list, list]:
        """Run the forward; return (the function's outputs, residual arrays in backward order).

        ``concrete``: whether no leaf is a tracer, when the caller already knows.
        """
        if concrete and self._eager_forward is not None:
            return self._eager_forward(leaves)
        n_user = len(self.entry.output_is_input)
        if concrete is None:
            concrete = not any(C.is_tracer(x) for x in leaves)
        if not concrete:
            if self.joint.num_aux:
                raise _unbounded_loop_error(self.owner.__name__)
            fwd_outs = C.eval_closed(self.partition.forward, *leaves)
        else:
            fwd_outs = self._run_forward(leaves)
            while self.joint.num_aux and max(int(t) for t in fwd_outs[n_user : n_user + self.joint.num_aux]) > self.capacity:
                # A while loop outgrew its stack: double the capacity, rebuild and rerun.
                self.capacity *= 2
                self.generation += 1
                self._reset()
                fwd_outs = self._run_forward(leaves)
        part = self.partition
        residuals = [leaves[i] for i in part.saved_inputs] + [fwd_outs[i] for i in part.saved_outputs]
        if self._eager_forward is None and not self.joint.num_aux and self.entry.no_aliases:
            self._eager_forward = self._make_eager_forward()
        return fwd_outs[:n_user], residuals

    def _make_eager_forward(self) -> Callable[[Sequence[Any]], tuple[list, list]]:
        """The hot path of an eager forward, once compiled: one executable call and two gathers.

        Only for programs whose outputs are all computed and that size no loop
        stack at run time (those check the loop's trip counts after each run).
        """
        exe, part = self.forward_exe, self.partition
        n_user = len(self.entry.output_is_input)
        saved_in, saved_out = part.saved_inputs, part.saved_outputs

        def run(leaves):
            outs = exe(*leaves)
            return outs[:n_user], [leaves[i] for i in saved_in] + [outs[i] for i in saved_out]

        return run

    def _run_forward(self, leaves: Sequence[Any]) -> list:
        computed = self.forward_exe(*leaves)
        n_real = len(self.entry.computed_outputs)
        return self.entry.splice(leaves, computed[:n_real]) + list(computed[n_real:])

    def backward(self, residuals: Sequence[Any], cts: Sequence[Any], concrete_residuals: bool = False) -> list:
        """Grads for the differentiated inputs, from residuals and selected cotangents."""
        args = [*cts, *residuals]
        if concrete_residuals:  # only the cotangents can be tracers; arrays are the common case
            traced = not all(type(x) is _ArrayImpl for x in cts) and any(C.is_tracer(x) for x in cts)
        else:
            traced = any(C.is_tracer(x) for x in args)
        if traced:
            return C.eval_closed(self.partition.backward, *args)
        exe = self.entry.executables.get(self._backward_name) or self.backward_exe
        return list(exe(*args))

    def unit_cotangents(self, leaf: int) -> list:
        """Cotangents 1 for output ``leaf`` (a scalar) and 0 elsewhere, made once on device."""
        cts = self._unit_cts.get(leaf)
        if cts is None:
            avals = [self.joint.out_avals[i] for i in self.partition.cotangent_outputs]
            cts = [jax.numpy.full(a.shape, 1 if i == leaf else 0, a.dtype)
                   for i, a in zip(self.partition.cotangent_outputs, avals)]
            self._unit_cts[leaf] = cts
        return cts

    def input_grads_tree(self, grads: Sequence[Any]) -> Any:
        """``(args, kwargs)``-shaped grads; float0 zeros for non-differentiated leaves."""
        if self._float0s is None:
            # float0 arrays hold no data; read-only, so one set can be handed out every call
            self._float0s = [C.zeros_float0(a.shape) for a in self.entry.in_avals]
            for z in self._float0s:
                z.flags.writeable = False
        grad_inputs = self.partition.grad_inputs
        if len(grad_inputs) == len(self._float0s):  # every input differentiated: grads are in order
            return jax.tree_util.tree_unflatten(self.entry.signature.treedef, grads)
        full: list[Any] = list(self._float0s)
        for i, g in zip(grad_inputs, grads):
            full[i] = g
        return jax.tree_util.tree_unflatten(self.entry.signature.treedef, full)

    @property
    def custom_vjp(self) -> Callable:
        if self._custom_vjp is None:
            self._custom_vjp = self._make_custom_vjp()
        return self._custom_vjp

    def _make_custom_vjp(self) -> Callable:
        tr = self

        @jax.custom_vjp
        def call(*leaves):
            # Only ever traced (eager calls that differentiate nothing never get here).
            return C.eval_closed(tr.entry.primal, *leaves)

        def fwd(*leaves):
            return tr.forward(leaves)

        def bwd(residuals, cts):
            part = tr.partition
            selected = [_as_cotangent(cts[i], tr.joint.out_avals[i]) for i in part.cotangent_outputs]
            grads = tr.backward(residuals, selected)
            full: list[Any] = [None] * len(tr.entry.in_avals)
            for i, g in zip(part.grad_inputs, grads):
                full[i] = g
            return tuple(full)

        call.defvjp(fwd, bwd)
        return call


def _unbounded_loop_error(name: str) -> Exception:
    return ReverseModeBoundError(
        f"{name} contains a jaxaot.while_loop without max_steps or checkpoints and is being "
        "reverse-differentiated inside another transformation (jit, vmap, or a higher-order grad). "
        "The runtime can size the loop's stack only when the aot_function is called eagerly: "
        "pass max_steps=N or checkpoints=k to the while_loop."
    )


def _abstract_call_error(name: str) -> Exception:
    return InvalidInputError(
        f"{name} was called with jax.ShapeDtypeStruct inputs: those describe arrays without values. "
        "Use .lower(...) to compile from shapes alone, or pass arrays to run it."
    )


def _is_none(x: Any) -> bool:
    return x is None


def _shape_dtype(x: Any) -> tuple[tuple, Any]:
    if isinstance(x, (jax.Array, np.ndarray)):
        return tuple(x.shape), x.dtype
    return tuple(np.shape(x)), jax.numpy.result_type(x)


def _as_cotangent(ct: Any, aval: Any) -> Any:
    # custom_vjp may hand a weak-typed or symbolic-zero-instantiated cotangent.
    if getattr(ct, "dtype", None) != aval.dtype:
        ct = jax.numpy.asarray(ct, aval.dtype)
    return ct


# --------------------------------------------------------------------------- AOTFunction
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

    def __init__(
        self,
        fn: Callable[..., Any],
        fw_compiler: Callable | None,
        bw_compiler: Callable | None,
        partition_fn: PartitionFn,
        inference_compiler: Callable | None,
        decompositions: Mapping[Any, Callable] | None,
        static_argnums: Sequence[int],
        donate_argnums: Sequence[int],
    ):
        self.fn = fn
        self.fw_compiler = fw_compiler or _compilers.xla
        self.bw_compiler = bw_compiler or self.fw_compiler
        self.inference_compiler = inference_compiler or self.fw_compiler
        self.partition_fn = partition_fn
        self.decompositions = dict(decompositions) if decompositions else None
        self.static_argnums = tuple(sorted(static_argnums))
        self.donate_argnums = tuple(sorted(donate_argnums))
        self._cache: dict[_Signature, _Entry] = {}
        self._infos: list[CacheEntryInfo] = []
        self._hits = 0
        self._last: _Signature | None = None
        # (treedef, avals, training) of the last eager forward: its hot path (see forward).
        self._hot: tuple | None = None
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "aot_function")
        self.__doc__ = getattr(fn, "__doc__", None)

    # -- argument handling
    def _split(self, args: tuple, kwargs: dict):
        if self.static_argnums:
            n = len(args)
            for i in self.static_argnums:
                if i >= n:
                    raise InvalidInputError(
                        f"static_argnums contains {i}, but {self.__name__} was called with {n} positional "
                        "arguments. Pass the static argument positionally or fix static_argnums."
                    )
            static = tuple(args[i] for i in self.static_argnums)
            for i, s in zip(self.static_argnums, static):
                try:
                    hash(s)
                except TypeError:
                    raise InvalidInputError(
                        f"static argument arg[{i}] of type {type(s).__name__} is not hashable. Static "
                        "arguments key the compile cache: pass a hashable value (a tuple instead of a "
                        "list, say) or pass it as an array argument instead."
                    ) from None
            dyn = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        else:
            static, dyn = (), args
        leaves, treedef = jax.tree_util.tree_flatten((dyn, kwargs))
        return static, leaves, treedef

    def _lookup(self, args: tuple, kwargs: dict) -> tuple["_Entry", list, int]:
        """The entry for this call's signature, the flat leaves, and the trace kind.

        The trace kind is 0 for concrete arrays, 1 for tracers, 2 for forward-mode
        (``jax.jvp``) tracers, 3 for abstract ``jax.ShapeDtypeStruct`` inputs
        (only ``lower`` takes those). One pass over the leaves: this is the hot path.
        """
        static, leaves, treedef = self._split(args, kwargs)
        keys = []
        kind = 0
        for x in leaves:
            if type(x) is _ArrayImpl:  # the common case, kept cheap
                if x.committed:
                    sk = _sharding_key(x.sharding)
                    keys.append(x.aval if sk is None else (x.aval, sk))
                else:
                    keys.append(x.aval)
                continue
            if isinstance(x, C.Tracer):
                kind = max(kind, 2 if C.is_forward_mode_tracer(x) else 1)
            elif isinstance(x, jax.ShapeDtypeStruct):
                kind = 3
            elif not is_array_leaf(x):
                flatten_checked((args, kwargs), "input", InvalidInputError)  # raises, naming the leaf
            keys.append(_leaf_key(x))
        sig = _Signature(treedef, tuple(keys), static)
        entry = self._cache.get(sig)
        if entry is None:
            entry = self._new_entry(sig, leaves)
        else:
            self._hits += 1
        return entry, leaves, kind

    def _donated_leaves(self, sig: _Signature) -> list[int]:
        if not self.donate_argnums:
            return []
        dyn_positions = [i for i in range(len(sig.static) + 10_000) if i not in self.static_argnums]
        dummy = jax.tree_util.tree_unflatten(sig.treedef, list(range(sig.treedef.num_leaves)))
        out = []
        for k, arg in enumerate(dummy[0]):
            if dyn_positions[k] in self.donate_argnums:
                out.extend(jax.tree_util.tree_leaves(arg))
        return out

    def _new_entry(self, sig: _Signature, leaves: list) -> _Entry:
        reason = "first call" if self._last is None else _describe_change(self._last, sig)
        entry = _Entry(self, sig, self._flat_fn(sig.static, sig.treedef), _leaf_avals(leaves))
        self._cache[sig] = entry
        self._last = sig
        self._infos.append(CacheEntryInfo(self._describe_sig(sig), reason, ()))
        return entry

    def _flat_fn(self, static: tuple, treedef: Any) -> Callable:
        def flat_fn(*flat):
            dyn, kwargs = jax.tree_util.tree_unflatten(treedef, flat)
            args = list(dyn)
            for i, s in zip(self.static_argnums, static):
                args.insert(i, s)
            return self.fn(*args, **kwargs)

        return flat_fn

    def _describe_sig(self, sig: _Signature) -> str:
        parts = [f"{p}: {_fmt_key(k)}" for p, k in zip(leaf_paths(sig.treedef, "input"), sig.leaves)]
        if sig.static:
            parts.append(f"static={sig.static!r}")
        return ", ".join(parts)

    # -- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, leaves, kind = self._lookup(args, kwargs)
        if kind == 3:
            raise _abstract_call_error(self.__name__)
        if kind == 0:
            outs = entry.infer(leaves)
        elif kind == 2:
            # jax.custom_vjp refuses forward mode: inline the primal program instead.
            outs = C.eval_closed(entry.primal, *leaves)
        else:
            # Concrete leaves are not being differentiated: leave them out of the joint.
            mask = tuple(C.is_tracer(x) for x in leaves)
            outs = entry.training(mask).custom_vjp(*leaves)
        return jax.tree_util.tree_unflatten(entry.out_tree, outs)

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, Residuals]:
        """Run the compiled forward: ``(outputs, residuals)``.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
            >>> y, res = f.forward(jnp.ones(3))
            >>> (dx,) = f.backward(res, jnp.float32(1.0))
        """
        hot = self._hot
        if hot is not None:
            # A training loop calls with one signature: compare it with the last
            # one's in a single pass and run the executable directly. The
            # executable itself refuses other devices (ValueError).
            leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
            if treedef == hot[0] and hot[2]._eager_forward is not None and all(
                    type(x) is _ArrayImpl and x.aval == a for x, a in zip(leaves, hot[1])):
                tr = hot[2]
                try:
                    outs, residuals = tr._eager_forward(leaves)
                except ValueError:
                    pass  # a sharding the last signature did not have: look it up
                else:
                    self._hits += 1
                    return (jax.tree_util.tree_unflatten(tr.entry.out_tree, outs),
                            Residuals(residuals, tr, _checked=True))
        entry, leaves, kind = self._lookup(args, kwargs)
        if kind == 3:
            raise _abstract_call_error(self.__name__)
        tr = entry.training()
        outs, residuals = tr.forward(leaves, concrete=kind == 0)
        if (kind == 0 and tr._eager_forward is not None and not self.static_argnums
                and all(type(x) is _ArrayImpl for x in leaves)):
            self._hot = (entry.signature.treedef, tuple(x.aval for x in leaves), tr)
        return jax.tree_util.tree_unflatten(entry.out_tree, outs), Residuals(residuals, tr, _checked=kind == 0)

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
        if not isinstance(residuals, Residuals):
            raise ResidualsMismatchError(
                f"backward expects the Residuals returned by {self.__name__}.forward, got "
                f"{type(residuals).__name__}."
            )
        tr = residuals._training
        if tr.owner is not self:
            raise ResidualsMismatchError(
                f"these residuals were produced by another function ({tr.owner.__name__}), not by "
                f"{self.__name__}: pass the residuals of this function's own forward."
            )
        if residuals._generation != tr.generation:
            raise ResidualsMismatchError(
                "these residuals were produced before a while loop in the function outgrew its stack "
                "and the programs were rebuilt with a larger one: run forward again."
            )
        if not residuals._checked:
            self._check_residuals(tr, residuals.arrays)
        cts = self._check_cotangents(tr, cotangents)
        grads = tr.backward(residuals.arrays, cts, concrete_residuals=residuals._checked)
        dyn, kwargs = tr.input_grads_tree(grads)
        return (dyn, kwargs) if kwargs else dyn

    def _check_residuals(self, tr: _Training, arrays: Sequence[Any]) -> None:
        expected, entry = tr.partition.residuals, tr.entry
        if len(arrays) != len(expected):
            raise ResidualsMismatchError(
                f"expected {len(expected)} residuals for signature ({self._describe_sig(entry.signature)}), "
                f"got {len(arrays)}."
            )
        for i, (x, r) in enumerate(zip(arrays, expected)):
            shape, dtype = _shape_dtype(x)
            if shape != r.aval.shape or dtype != r.aval.dtype:
                raise ResidualsMismatchError(
                    f"residual {i} is {dtype}{list(shape)} but signature "
                    f"({self._describe_sig(entry.signature)}) saved {r.aval.dtype}{list(r.aval.shape)}: "
                    "pass the residuals produced by forward for the same input signature."
                )

    def _check_cotangents(self, tr: _Training, cotangents: Any) -> list:
        entry = tr.entry
        if type(cotangents) is _ArrayImpl and entry.out_tree.num_leaves == 1:
            # One array output (a loss): the common case, checked without a flatten.
            aval = tr.joint.out_avals[0]
            if tr.partition.cotangent_outputs == (0,) and cotangents.shape == aval.shape \
                    and cotangents.dtype == aval.dtype:
                return [cotangents]
            flat, tree = [cotangents], entry.out_tree
        else:
            flat, tree = jax.tree_util.tree_flatten(cotangents, is_leaf=_is_none)
        if tree != entry.out_tree and jax.tree_util.tree_structure(cotangents) != entry.out_tree:
            raise CotangentMismatchError(
                f"cotangents have structure {tree} but the outputs have structure {entry.out_tree}."
            )
        out = []
        for i in tr.partition.cotangent_outputs:
            ct, aval = flat[i], tr.joint.out_avals[i]
            shape, dtype = _shape_dtype(ct) if ct is not None else (None, None)
            if shape != aval.shape or dtype != aval.dtype:
                path = leaf_paths(entry.out_tree, "output")[i]
                got = "None" if ct is None else f"{dtype}{list(shape)}"
                raise CotangentMismatchError(
                    f"cotangent for {path} is {got}, but the output is {aval.dtype}{list(aval.shape)}: "
                    "pass a cotangent of the output's shape and dtype."
                )
            out.append(ct)
        return out

    # -- introspection
    def lower(self, *args: Any, **kwargs: Any) -> AOTLowered:
        """Build (or fetch) everything for this signature and describe it.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(lambda x: jnp.sin(x).sum())
            >>> low = f.lower(jnp.ones(3))
            >>> low.saved_bytes
            12
        """
        entry, leaves, _ = self._lookup(args, kwargs)
        return self._lowered(entry, entry.training())

    def _lowered(self, entry: _Entry, tr: _Training) -> AOTLowered:
        inference = _prune_outputs(entry.primal, entry.computed_outputs)
        entry.inference_exe, tr.forward_exe, tr.backward_exe  # noqa: B018 - builds them
        names = {"inference", "forward" + tr.suffix, "backward" + tr.suffix}
        return AOTLowered(
            joint=tr.joint,
            partition=tr.partition,
            inference=inference,
            compile_times=dict(entry.times),
            executables={k.split("[")[0]: v for k, v in entry.executables.items() if k in names},
        )

    def cache_info(self) -> CacheInfo:
        """Compiled signatures, with the reason each was (re)compiled.

        Example:
            >>> import jax.numpy as jnp, jaxaot
            >>> f = jaxaot.aot_function(jnp.sin)
            >>> _ = f(jnp.ones(3)); _ = f(jnp.ones(4))
            >>> f.cache_info().entries[1].reason
            'arg[0]: f32[3] -> f32[4]'
        """
        entries = tuple(
            dataclasses.replace(info, executables=tuple(e.executables))
            for info, e in zip(self._infos, self._cache.values())
        )
        return CacheInfo(hits=self._hits, misses=len(self._cache), entries=entries)

    def __repr__(self) -> str:
        return f"<AOTFunction {self.__name__}: {len(self._cache)} signatures>"


def aot_function(
    fn: Callable[..., Any],
    fw_compiler: Callable | None = None,
    bw_compiler: Callable | None = None,
    partition_fn: PartitionFn = default_partition,
    *,
    inference_compiler: Callable | None = None,
    decompositions: Mapping[Any, Callable] | None = None,
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
) -> AOTFunction:
    """Compile ``fn`` ahead of time into separate forward and backward executables.

    Args:
      fn: a function of pytrees of arrays returning a pytree of arrays.
      fw_compiler: compiles the forward program; default :func:`jaxaot.compilers.xla`.
      bw_compiler: compiles the backward program; default ``fw_compiler``.
      partition_fn: chooses what the forward saves; default :func:`default_partition`.
      inference_compiler: compiles the inference program; default ``fw_compiler``.
      decompositions: ``{primitive: python_fn}`` applied while tracing, so the
        partitioner sees the decomposed operations; they reach into loop and
        cond bodies, not into ``custom_jvp``/``custom_vjp`` functions (whose
        derivative rules are written for the original operations).
      static_argnums: positional arguments that are compile-time constants.
      donate_argnums: positional arguments whose buffers the executables may reuse.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> f = jaxaot.aot_function(lambda w, x: jnp.tanh(x @ w).sum())
        >>> w, x = jnp.ones((3, 2)), jnp.ones((4, 3))
        >>> loss, dw = jax.value_and_grad(f)(w, x)
        >>> dw.shape
        (3, 2)
    """
    if not callable(fn):
        raise InvalidInputError(f"aot_function expects a callable, got {type(fn).__name__}: {fn!r}.")
    for name, c in (("fw_compiler", fw_compiler), ("bw_compiler", bw_compiler),
                    ("inference_compiler", inference_compiler), ("partition_fn", partition_fn)):
        if c is not None and not callable(c):
            raise InvalidInputError(f"{name} must be callable, got {type(c).__name__}.")
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    for name, nums in (("static_argnums", static), ("donate_argnums", donate)):
        if any(not isinstance(i, int) or i < 0 for i in nums):
            raise InvalidInputError(f"{name} must be non-negative ints, got {nums!r}.")
    if set(static) & set(donate):
        raise InvalidInputError(f"arguments {sorted(set(static) & set(donate))} cannot be both static and donated.")
    return AOTFunction(fn, fw_compiler, bw_compiler, partition_fn, inference_compiler, decompositions, static, donate)
