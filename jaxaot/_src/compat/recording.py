"""JAX internals for recording an eager forward as a tape (part of :mod:`jaxaot._src.compat`).

Compiled autograd runs a user's forward under its own JAX trace: every primitive reaches
:meth:`RecordingTrace.process_primitive` and is handed to a recorder (the tape, plain Python) that writes it
down and returns :class:`RecordingTracer`\\ s, which have shapes and dtypes, and a value when Python asks for
one. Besides: :func:`abstract_eval`, :func:`stage_call` (a custom rule staged into one equation) with :func:`rule_key`,
:func:`stage_function` and :func:`hoisted_jit` (the Trace API of jax 0.10 and 0.11)."""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Sequence

import numpy as np
from jax.errors import ConcretizationTypeError
from jax._src import api_util as _api_util
from jax._src import core as _core
from jax._src import linear_util as _lu
from jax._src import pjit as _pjit
from jax._src import source_info_util as _siu
from jax._src.interpreters import partial_eval as _pe

from jaxaot._src.compat.core import ArrayImpl as _ArrayImpl, host_value as _host_value


class Unrecordable(Exception):
    """The forward did something a recording trace cannot write down (the caller falls back)."""


_cached_abstract_eval = getattr(_pe, "_cached_abstract_eval", None)


def abstract_eval(prim: Any, avals: Sequence[Any], params: dict) -> tuple[list, Any]:
    """``(output avals, effects)`` of ``prim`` applied to ``avals`` (a list even for one output)."""
    if getattr(prim, "ref_primitive", False) or getattr(prim, "ref_allocating", False):
        raise Unrecordable(f"{prim} works on mutable references")
    try:
        if _cached_abstract_eval is None:
            raise TypeError
        out, effects = _cached_abstract_eval(prim, *avals, **params)
    except TypeError:  # unhashable params (or a real type error, raised again): the uncached rule
        out, effects = prim.abstract_eval(*avals, **params)
    return (list(out) if prim.multiple_results else [out]), effects


def typeof(x: Any) -> Any:
    """The aval of a concrete value or tracer."""
    return _core.typeof(x)


def source_info() -> Any:
    """Where the user code running now is (for recompile reasons and program metadata)."""
    return _siu.current()


_JAXAOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recorded_source(info: Any) -> str:
    """``file:line (function)`` of the innermost user frame of ``info``, jaxaot's own frames skipped."""
    try:
        for frame in _siu.user_frames(info.traceback):
            if not os.path.abspath(frame.file_name).startswith(_JAXAOT_DIR + os.sep):
                return _siu._summarize_frame(frame)
    except Exception:  # pragma: no cover - source info is best effort
        pass
    return ""


#: JAX's box around a custom rule's ``nondiff_argnums`` values, new per call and equal by value: keyed by what it holds.
_NONDIFF_BOX = getattr(_api_util, "Unhashable", None)


def stage_call(prim: Any, args_avals: Sequence[Any], bind: Callable[[Any, list], Any]) -> tuple:
    """Stage one call-like primitive (``custom_jvp_call``, ``custom_vjp_call``, a call) with JAX's tracer.

    ``bind(trace, tracers)`` applies the primitive in the staging trace.
    Returns ``(eqn primitive, eqn params, consts, out avals, effects)``: the single
    equation JAX builds for it (its custom rules kept as they are under
    ``jit``), whose inputs are ``consts`` (values the call's functions closed
    over) followed by the call's own arguments. Raises :class:`Unrecordable`
    when staging needs concrete values or yields anything but that equation.
    """
    def flat(*xs):
        return bind(_core.trace_ctx.trace, list(xs))

    debug = _core.DebugInfo("jaxaot", f"<recorded {prim}>", None, None)
    try:
        jaxpr, out_avals, consts = _pe.trace_to_jaxpr_dynamic(_lu.wrap_init(flat, debug_info=debug), list(args_avals))
    except ConcretizationTypeError as e:
        raise Unrecordable(f"{prim} needs concrete values of its own arguments ({type(e).__name__})") from e
    eqns = jaxpr.eqns
    if (len(eqns) != 1 or list(eqns[0].invars) != [*jaxpr.constvars, *jaxpr.invars]
            or list(eqns[0].outvars) != list(jaxpr.outvars)):
        raise Unrecordable(f"{prim} did not stage to a single equation")
    return eqns[0].primitive, dict(eqns[0].params), list(consts), list(out_avals), eqns[0].effects


#: memo key + input avals -> (staged call, the stores its function filled): see _stage_memo.
_STAGED: dict[tuple, tuple] = {}
_STAGED_MAX = 1024


def _stage_memo(memo: Any, fun: Any, prim: Any, avals: Sequence[Any], bind: Callable) -> tuple:
    """:func:`stage_call`, reused for a call ``memo`` identifies (None: never reused).

    The reused call's function does not run, so the stores its caller reads
    afterwards (the output tree) are filled from the first call's.
    """
    key = None
    if memo is not None:
        try:
            key = (memo, *avals)
            hit = _STAGED.get(key)
        except TypeError:
            key = hit = None
        if hit is not None:
            fun.populate_stores(hit[1])
            return hit[0]
    staged = stage_call(prim, avals, bind)
    if key is not None and not staged[2]:  # no consts: nothing of this call's own is held
        if len(_STAGED) >= _STAGED_MAX:
            _STAGED.clear()
        _STAGED[key] = (staged, fun.stores)
    return staged


def stage_function(fn: Callable[..., Sequence[Any]], avals: Sequence[Any]) -> tuple[Any, list]:
    """``fn`` traced on ``avals``: a closed jaxpr whose consts are leading inputs, and those consts."""
    debug = _core.DebugInfo("jaxaot", getattr(fn, "__qualname__", "<function>"), None, None)
    jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(_lu.wrap_init(fn, debug_info=debug), list(avals))
    return _core.ClosedJaxpr(_pe.convert_constvars_jaxpr(jaxpr), []), list(consts)


def hoisted_jit(prim: Any, params: dict) -> tuple[dict, list] | None:
    """``(params, consts)`` of a ``jit`` equation whose jaxpr (or a ``jit`` in it) closes over arrays, JAX's consts:
    params taking them as leading arguments, and the arrays. None for another equation, or a jit closing over none."""
    if prim is not _pjit.jit_p:
        return None
    closed = params["jaxpr"]
    jaxpr, consts, constvars, eqns = closed.jaxpr, list(closed.consts), list(closed.jaxpr.constvars), []
    for eqn in jaxpr.eqns:
        inner = hoisted_jit(eqn.primitive, eqn.params)
        if inner is not None:  # a nested jit's arrays: consts of this jaxpr, arguments of that equation
            new = [_core.Var(v.aval) for v in inner[0]["jaxpr"].jaxpr.invars[:len(inner[1])]]
            constvars, consts = constvars + new, consts + inner[1]
            eqn = eqn.replace(invars=[*new, *eqn.invars], params=inner[0])
        eqns.append(eqn)
    if not consts:
        return None
    n, lifted = len(consts), _pe.convert_constvars_jaxpr(jaxpr.replace(constvars=constvars, eqns=eqns))
    return dict(params, jaxpr=_core.ClosedJaxpr(lifted, []), donated_invars=(False,) * n + params["donated_invars"],
                in_shardings=(_pjit.UNSPECIFIED,) * n + params["in_shardings"],
                in_layouts=(None,) * n + params["in_layouts"]), consts


class ById:
    """A key part equal only to itself-wrapped object (kept alive by the key)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ById) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} {id(self.obj):#x}>"


def _static_part(a: Any) -> Any:
    # transformation_with_aux2's output thunks read a store filled by this very call:
    # what they return follows from the function and its other static arguments.
    if callable(a) and getattr(a, "__qualname__", "").endswith("transformation_with_aux2.<locals>.<lambda>"):
        return "<aux>"
    if _NONDIFF_BOX is not None and type(a) is _NONDIFF_BOX:  # by type and value, as jit keys a static argument
        return ("nondiff", type(a.val), _static_part(a.val))
    if isinstance(a, float):  # by its bits: -0.0 is not 0.0, and a NaN equals itself
        return ("float", float.hex(a))
    try:
        hash(a)
    except TypeError:
        return tuple(map(_static_part, a)) if type(a) is tuple else ById(a)
    return a


def rule_key(fun: Any) -> tuple:
    """A hashable identity of a custom rule given as a ``WrappedFun``: the user function and static args.

    Two calls of the same ``jax.custom_jvp``/``custom_vjp`` object with the same static arguments get equal
    keys; a rule without that structure is keyed by the object itself (correct, at worst a compile per call).
    """
    f = getattr(fun, "f", None)
    transforms = getattr(fun, "transforms", None)
    if f is None or transforms is None:
        return (ById(fun),)
    parts = []
    for t in transforms:
        try:
            gen, static = t
        except (TypeError, ValueError):
            return (ById(fun),)
        parts.append((gen, tuple(_static_part(a) for a in static)))
    return (_static_part(f), tuple(parts), _static_part(getattr(fun, "params", ())))


def _is_jitted(fun: Any) -> bool:
    """Whether a ``WrappedFun`` wraps a ``jax.jit`` function (whose tracing ``jit`` caches by identity)."""
    f = getattr(fun, "f", None)
    return f is not None and hasattr(f, "lower") and hasattr(f, "trace") and hasattr(f, "clear_cache")


def is_rule_param(value: Any) -> bool:
    """Whether a staged equation's param is a rule or thunk (new per call) rather than data."""
    if isinstance(value, (_core.ClosedJaxpr, _core.Jaxpr)):
        return False
    return isinstance(value, _lu.WrappedFun) or callable(value)


def is_callback_primitive(prim: Any) -> bool:
    """Host callbacks (``jax.debug.print``/``callback``, ``pure_callback``, ``io_callback``)."""
    name = prim.name
    return "callback" in name or name == "debug_print"


class RecordingTrace(_core.Trace):
    """A trace that hands every operation to ``recorder`` instead of running it.

    ``recorder`` provides ``primitive(prim, args, params)``,
    ``staged(args, stage, rules)`` (``stage(avals)`` is :func:`stage_call` for
    that call; ``rules`` identify its custom rules) and ``stage_value(val)``,
    each returning output tracers, and ``force(vid)`` / ``known(vid)`` for
    tracer values.
    """

    __slots__ = ("recorder",)

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder

    def process_primitive(self, prim, tracers, params, /):
        out = self.recorder.primitive(prim, tracers, params)
        return out if prim.multiple_results else out[0]

    def stage_value(self, val):
        return self.recorder.stage_value(val)

    def process_custom_jvp_call(self, prim, fun, jvp, tracers, /, **params):
        def bind(trace, xs):
            return trace.process_custom_jvp_call(prim, fun, jvp, xs, **params)

        rules = {"jvp": rule_key(jvp)}
        # A custom_jvp of a jitted function (jax.nn.relu) stages like the jit it wraps: reuse it.
        memo = (prim, rule_key(fun), rules["jvp"], tuple(sorted(params.items()))) if _is_jitted(fun) else None
        return self.recorder.staged(tracers, lambda avals: _stage_memo(memo, fun, prim, avals, bind), rules)

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, **params):
        def bind(trace, xs):
            return trace.process_custom_vjp_call(prim, fun, fwd, bwd, xs, **params)

        rules = {"fwd": rule_key(fwd), "bwd": rule_key(bwd)}
        return self.recorder.staged(tracers, lambda avals: stage_call(prim, avals, bind), rules)

    def process_call(self, prim, f, tracers, params, /):  # jax 0.10 call primitives
        def bind(trace, xs):
            return trace.process_call(prim, f, xs, params)

        return self.recorder.staged(tracers, lambda avals: stage_call(prim, avals, bind), {"f": rule_key(f)})

    def process_map(self, *args, **kwargs):  # pmap, and shard_map called eagerly: JAX's own step runs it
        raise Unrecordable("pmap or an eager shard_map inside the forward (jit the shard_map to record it)")

    def process_custom_transpose(self, *args, **kwargs):
        raise Unrecordable("custom_transpose inside the forward")

    process_shard_map = process_map
    def cur_qdd(self, x):
        raise Unrecordable("mutable references inside the forward")


def current_recording_trace() -> RecordingTrace | None:
    """The :class:`RecordingTrace` being recorded into right now, else None."""
    trace = _core.trace_ctx.trace
    return trace if isinstance(trace, RecordingTrace) else None


def is_eval_trace(trace: Any) -> bool:
    """Whether ``trace`` is JAX's eager evaluation (no transformation is tracing)."""
    return isinstance(trace, _core.EvalTrace)


def set_current_trace(trace: Any) -> Any:
    """Context manager making ``trace`` the current trace."""
    return _core.set_current_trace(trace)


def invalidate(trace: Any) -> None:
    """Mark ``trace`` finished: its tracers used later raise JAX's escaped-tracer error."""
    trace.invalidate()


class RecordingTracer(_core.Tracer):
    """A recorded value: its aval, its number on the tape, a concrete value on request.

    JAX asks ``to_concrete_value`` opportunistically, so it answers only when the value is known. What
    Python reads (``bool``, ``int``, ``float``, ``index``, ``np.asarray``, ``item``, ``np.from_dlpack``,
    printing) computes it, through the recorder's ``force(vid, how)`` (``how``: the conversion, kept).
    The operators, methods and properties JAX forwards from every tracer to ``jax.numpy`` (``x * 2``,
    ``x.mean()``) go through the recorder's ``call(name, jax_fn, tracer, args, kwargs)``, which may replay
    what ``jax_fn`` recorded for the same operand types (:func:`forwarded_operations`).
    """

    __slots__ = ("vid",)

    def __init__(self, trace: RecordingTrace, aval: Any, vid: int) -> None:
        self._trace = trace
        self.aval = aval
        self.vid = vid

    def to_concrete_value(self):
        return self._trace.recorder.known(self.vid)

    def _value(self, how: str = "value"):
        return self._trace.recorder.force(self.vid, how)

    def _scalar(self, how: str):
        value = self._trace.recorder.force(self.vid, how)
        return _host_value(value) if type(value) is _ArrayImpl and not value.shape else value

    def __bool__(self):
        return bool(self._scalar("bool"))

    def __int__(self):
        return int(self._scalar("int"))

    def __float__(self):
        return float(self._scalar("float"))

    def __complex__(self):
        return complex(self._scalar("complex"))

    def __index__(self):
        return operator.index(self._value("int"))

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._value(), dtype=dtype)

    def block_until_ready(self):
        self._value().block_until_ready()
        return self

    def copy_to_host_async(self):
        pass

    def __format__(self, spec):
        return format(self._value(), spec)

    def __str__(self):
        return str(self._value())

    def __repr__(self):
        return repr(self._value())


def forwarded_operations() -> dict[str, tuple[str, Any]]:
    """The operators, methods and properties every JAX tracer forwards to ``jax.numpy``, by attribute name:
    ``(kind, function)``, ``kind`` one of ``operator``, ``method``, ``property`` (found by how JAX defines
    them, so a JAX version that forwards more or fewer is followed as it is)."""
    out = {}
    for name, attr in vars(_core.Tracer).items():
        fn = attr.fget if isinstance(attr, property) else attr
        qual = getattr(fn, "__qualname__", "")
        for kind, maker in (("operator", "_forward_operator_to_aval"), ("method", "_forward_method_to_aval"),
                            ("property", "_forward_property_to_aval")):
            if qual.startswith(maker + ".") and name not in ("__setitem__", "__deepcopy__", "__copy__"):
                out[name] = (kind, attr)
    return out


def _recorded_operation(name: str, kind: str, attr: Any) -> Any:
    if kind == "property":
        fget = attr.fget
        return property(lambda self: self._trace.recorder.call(name, fget, self, (), None))

    if kind == "operator":  # operators take no keywords: none are collected
        def forwarded(self, *args):
            return self._trace.recorder.call(name, attr, self, args, None)
    else:
        def forwarded(self, *args, **kwargs):
            return self._trace.recorder.call(name, attr, self, args, kwargs)

    forwarded.__name__ = forwarded.__qualname__ = name
    return forwarded


def _read_whole(name: str) -> Any:
    def method(self, *args, **kwargs):
        return getattr(self._value(), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


#: What reads the whole value (Python looks at it, as ``np.asarray(x)`` does): the value's own method or property.
for _name in ("item", "tolist", "tobytes", "__dlpack__", "__dlpack_device__", "addressable_data"):
    setattr(RecordingTracer, _name, _read_whole(_name))
RecordingTracer.addressable_shards = property(lambda self: self._value().addressable_shards)  # type: ignore
for _name, (_kind, _attr) in forwarded_operations().items():
    if _name not in vars(RecordingTracer):  # its own conversions (item, tolist, ...) stay
        setattr(RecordingTracer, _name, _recorded_operation(_name, _kind, _attr))
RecordingTracer.__hash__ = None  # type: ignore[assignment]  # tracers stay unhashable, __eq__ notwithstanding
# JAX finds a value's aval through this table (``typeof``, and each argument of a ``jit`` call): an entry of
# its own spares a recorded value the walk up its classes to ``Tracer``'s, as JAX's own tracers are spared it.
if getattr(_core, "pytype_aval_mappings", None) is not None:
    _core.pytype_aval_mappings[RecordingTracer] = operator.attrgetter("aval")


#: What compiled autograd (:mod:`jaxaot._src.autograd.recorded`) uses (``C.<name>``).
__all__ = [
    "ById", "RecordingTrace", "RecordingTracer", "Unrecordable", "abstract_eval", "current_recording_trace",
    "hoisted_jit", "invalidate", "is_callback_primitive", "is_eval_trace", "is_rule_param", "recorded_source",
    "rule_key", "set_current_trace", "source_info", "stage_call", "stage_function", "typeof",
]
