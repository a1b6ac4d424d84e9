"""``compiled_grad`` and ``compiled_value_and_grad``: the forward runs as written, the step is compiled.

Each call records the forward (:mod:`.tape`: Python runs as written, JAX operations
are written down), looks its structure up in the process-wide cache (:mod:`.step_cache`,
compiling ``jit(value_and_grad)`` of it on a miss, with the reason), and runs that
one executable for loss, auxiliary outputs and gradients (:mod:`.step`), started
before the forward runs when the last two calls ran it (:mod:`.ahead`). Lazy
recording falls back to eager recording, then to capturing ``jax.vjp``'s backward
(:mod:`.capture`), when the forward needs it. Arguments follow ``jax.grad``;
``nnx.Module`` arguments as ``nnx.grad`` (:mod:`.modules`); ``replay=True`` skips
the forward's Python for calls proven the same (:mod:`.replay`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src import module_links as ML
from jaxaot._src.pytrees import format_aval
from jaxaot._src.names import named_as_gradient
from jaxaot._src.autograd.argnums import check_reduce_axes, parse_argnums, resolve_argnums
from jaxaot._src.loops import overflow_checked, overflow_mark
from jaxaot._src.autograd.grad_of import grad_of
from jaxaot._src.autograd.gradient_types import Gradient
from jaxaot._src.autograd.recorded import call as K
from jaxaot._src.autograd.recorded import capture as CAP
from jaxaot._src.autograd.recorded import modules as M
from jaxaot._src.autograd.recorded import param_hooks as PH
from jaxaot._src.autograd.recorded import replay as R
from jaxaot._src.autograd.recorded import step as S
from jaxaot._src.autograd.recorded.ahead import EFFECTFUL
from jaxaot._src.autograd.recorded.step_cache import note_fallback, note_replay
from jaxaot._src.autograd.recorded.plans import Plans, name_of
from jaxaot.errors import InvalidInputError, InvalidOutputError, JaxaotError


def compiled_value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
                            holomorphic: bool = False, allow_int: bool = False, reduce_axes: Sequence[Any] = (), *,
                            param_hooks: Mapping[Any, Callable[[Any, Any], Any]] | None = None,
                            replay: bool = False) -> Gradient:
    """Like ``jax.value_and_grad``; the forward runs as written, the step is compiled once per structure.

    Args:
      fun: the function; its (first) output must be a real scalar.
      argnums: position or positions of the differentiated arguments.
      has_aux: ``fun`` returns ``(value, aux)``.
      param_hooks: ``{path pattern or predicate: fn(param, grad) -> grad}``, run
        on each matching parameter's full gradient inside the compiled backward
        (``docs/concepts/compiled_autograd.md``, "Hooks"). Each hook is traced into
        the executable once per compile, as under ``jax.jit``: any Python value or array
        it reads besides ``param`` and ``grad`` (a global, a closed-over ``jax.Array``,
        even one replaced between steps) is read then and kept, for every function
        sharing that executable. Pass a value that changes per step as an array
        argument of ``fun`` and apply it there with :func:`jaxaot.grad_hook`, or to
        the returned gradients.
      replay: skip the forward's Python on a call whose arguments have the
        types and static values of a recorded call, and whose looked-at values
        (``if loss > 0``) take outcomes a recording took: the compiled step runs
        directly, as ``jit`` runs (``docs/concepts/compiled_autograd.md``, "Replay"). The
        forward's Python side effects then happen only when it is recorded.
      holomorphic, allow_int: as ``jax.value_and_grad``'s; either True makes the call
        ``jax.value_and_grad``'s, eager, with ``cache_info()`` listing nothing (``param_hooks`` and
        ``replay`` are then refused).

    Returns:
      ``f(*args, **kwargs) -> (value, grad)`` (``((value, aux), grad)`` with
      ``has_aux``), as ``jax.value_and_grad``.

    Example:
        >>> import jax, jax.numpy as jnp, jaxaot
        >>> def loss(w, x):
        ...     y = jnp.tanh(x @ w)
        ...     return jnp.sum(y ** 2) if y.mean() > 0 else jnp.sum(y)  # a Python branch on data
        >>> vg = jaxaot.compiled_value_and_grad(loss)
        >>> value, g = vg(jnp.ones((3, 2)), jnp.ones((4, 3)))
        >>> bool(jnp.allclose(g, jax.grad(loss)(jnp.ones((3, 2)), jnp.ones((4, 3)))))
        True
    """
    if not callable(fun):
        raise InvalidInputError(f"compiled_value_and_grad needs a callable fun, got a {type(fun).__name__}.")
    nums, single = parse_argnums(argnums, "compiled_value_and_grad")
    check_reduce_axes(reduce_axes)
    if not isinstance(has_aux, bool):
        raise InvalidInputError(f"has_aux must be True or False, got {type(has_aux).__name__} {has_aux!r}.")
    for name, flag in (("replay", replay), ("holomorphic", holomorphic), ("allow_int", allow_int)):
        if not isinstance(flag, bool):
            raise InvalidInputError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}.")
    plans = Plans(fun, PH.check_param_hooks(param_hooks), replay)
    if holomorphic or allow_int:
        if param_hooks or replay:
            raise InvalidInputError("holomorphic=True or allow_int=True runs jax.value_and_grad, which takes no "
                                    "param_hooks and no replay: leave those out, or differentiate real inputs only.")
        vg = jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux, holomorphic=holomorphic, allow_int=allow_int)
        vg.cache_info = plans.cache_info
        return named_as_gradient(vg, fun, "Value and gradient", argnums)

    def value_and_grad(*args: Any, **kwargs: Any):
        mark = overflow_mark()  # a max_steps loop that overflowed: raised as an aot_function call raises it
        return overflow_checked(mark, run(*args, **kwargs))

    def run(*args: Any, **kwargs: Any):
        quick = miss = None
        if (plans.replay and plans.mode == "lazy" and C.is_eval_trace(C.current_trace())
                and not any(map(M.is_nnx_module, args))):
            quick = K.quick_key(args, kwargs, C.trace_context())
            known = plans.trees.quick.get(quick[0]) if quick is not None else None
            if known is not None:  # a call of a replayed key: no Call, no key, no module checks
                leaves = quick[1]
                out = _replay(plans, known.root, [leaves[i] for i in known.diff_at],
                              [leaves[i] for i in known.array_at], known.call)
                if type(out) is not R.Miss:
                    return _returned(out[0], out[1], out[2], known.diff_tree, has_aux, single)
                miss = out
        positions = resolve_argnums(nums, len(args), argnums, plans.name)
        _check_keyword_state(kwargs, plans.name)
        modules = M.split_args(args, positions) if args else {}
        diff = tuple(modules[n].params if n in modules else args[n] for n in positions)
        call = K.Call(args, kwargs, positions, diff, {*modules, *positions})
        _check_inexact(call, diff, positions)
        planned = plans.plan(call.diff_tree, diff, not single)
        linked: list = []  # where the aux holds the modules' Variables (ML.links), set by the forward
        forward = lambda: _forward(fun, args, kwargs, modules, positions, has_aux, call, linked)  # noqa: E731
        if call.traced or not C.is_eval_trace(C.current_trace()) or C.jit_disabled():  # JAX's own autodiff
            value, vjp_fn, (aux, states) = jax.vjp(forward(), *diff, has_aux=True)
            grads = PH.apply(planned, call.diff, jax.tree_util.tree_leaves(vjp_fn(jax.numpy.ones((), value.dtype))))
        else:
            quick = (quick[0], args, kwargs) if quick is not None else None
            value, (aux, states), grads = _step(plans, call, forward, diff, planned, bool(modules), miss, quick)
        for n, m in modules.items():
            m.write_back(states[n])
        if linked and linked[0]:
            aux = ML.relink(aux, linked[0], {n: m.module for n, m in modules.items()})
        return _returned(value, (aux, None), grads, call.diff_tree, has_aux, single,
                         [modules[n].module if n in modules else None for n in positions] if modules else None)

    value_and_grad = C.api_boundary(value_and_grad)  # errors in the user's forward show the user's lines
    value_and_grad.cache_info = plans.cache_info
    named_as_gradient(value_and_grad, fun, "Value and gradient", argnums)
    return value_and_grad


def _check_keyword_state(kwargs: dict, name: str) -> None:
    """Refuse Flax nnx state given by keyword: it is split and written back by position, as ``nnx.grad`` does."""
    for key, value in kwargs.items():
        if M.holds_nnx_state(value):
            raise InvalidInputError(
                f"{name}: the keyword argument {key!r} holds Flax nnx state ({type(value).__name__}), which the "
                f"forward may change; compiled_value_and_grad splits such state, and writes it back, only where "
                f"it is passed by position, as nnx.grad does. Pass it by position.")


def _returned(value: Any, rest: tuple, grads: Sequence[Any], diff_tree: Any, has_aux: bool, single: bool,
              modules: Sequence[Any] | None = None) -> tuple:
    """What ``value_and_grad`` returns, from the step's loss, ``(aux, module states)`` and gradient leaves;
    ``modules``: per differentiated argument, the module argument it is (whose gradient takes ``nnx.grad``'s form)
    or None."""
    grad = jax.tree_util.tree_unflatten(diff_tree, grads)
    if modules:
        grad = tuple(g if m is None else M.as_flax_grads(m, g) for m, g in zip(modules, grad))
    grad = grad[0] if single else grad
    return ((value, rest[0]), grad) if has_aux else (value, grad)


def _replay(plans: Plans, root: R.Guard, diff: list, arrays: list, call: K.Call) -> tuple | R.Miss:
    """``(value, rest, grads)`` of a replayed step of ``root``'s tree (the step the last call took, run ahead
    and kept if its looks agree, else the one its looked-at values lead to), or the :class:`~.replay.Miss`
    where no recording took an outcome. ``call``: the call, kept for the reason of a later compile."""
    ahead = R.expected(root)
    found = None
    if ahead is not None and (root.step is ahead or ahead.exe not in EFFECTFUL):  # a guess runs no callbacks
        ran = S.call(ahead.exe, ahead.structure, diff, arrays)
        if R.confirms(ahead, ran[1], root):
            found = ahead
    if found is None:
        found = R.run(root, diff, arrays)
        if type(found) is R.Miss:
            return found
        ran = S.call(found.exe, found.structure, diff, arrays)
    value, outs, grads = ran
    plans.last = (found.structure, call)
    plans.hits += 1
    note_replay()
    return value, S.outputs(found.kept, found.rest_tree, outs), list(grads)


def _step(plans: Plans, call: K.Call, make_forward: Callable, diff: tuple, planned: tuple, modules: bool,
          miss: R.Miss | None = None, quick: tuple | None = None) -> tuple:
    """``(value, rest, grads)`` of one eager step: replayed, recorded (and remembered for replay), or
    captured under ``jax.vjp`` (``make_forward()``: the forward, made when one runs). ``miss``: the guard
    that failed in a quick replay of this call (it records); ``quick``: its quick key, args and kwargs,
    under which a replayable key is found from then on."""
    guarded = plans.replay and not modules and plans.mode == "lazy"
    key = None
    if guarded:
        key = call.key(C.trace_context())
        arrays = [jax.device_put(x) if isinstance(x, np.ndarray) else x for x in call.arrays]
        root = plans.trees.get(key)
        if root is not None and miss is None:
            out = _replay(plans, root, call.diff, arrays, call)
            if type(out) is not R.Miss:
                _add_quick(plans, key, root, call, quick)
                call.release()
                return out
            miss = out
    reason = plans.reason(call, miss)
    forward = make_forward()
    t = time.perf_counter()
    out = _recorded(plans, forward, call, planned, reason, arrays if guarded else None)
    if out is None:
        value, vjp_fn, rest = jax.vjp(forward, *diff, has_aux=True)
        captured = CAP.capture(vjp_fn, value.dtype)
        recorded_in = time.perf_counter() - t
        grads, structure, compiled = CAP.run_compiled(captured, planned, call.diff, reason)
    else:
        value, rest, grads, compiled, recorded, exe = out
        recorded_in, structure = recorded.seconds, recorded.structure
        if guarded and recorded.tape.guarded:
            path, _ = R.judge(recorded)
            if path is not None:
                outcomes = tuple((how, outcome) for _, how, _, _, outcome in path)
                early = (bool(outcomes) and next(iter(value.devices())).platform != "cpu"
                         and not S.host_copies(recorded, call.diff))
                plans.trees.remember(key, path, R.Step(exe, structure, recorded.rest, recorded.rest_tree, outcomes,
                                                       early))
                _add_quick(plans, key, plans.trees.get(key), call, quick)
    plans.count(call, compiled, structure, recorded_in, miss)
    plans.last = (structure, call.release())
    return value, rest, grads


def _add_quick(plans: Plans, key: tuple, root: R.Guard | None, call: K.Call, quick: tuple | None) -> None:
    """Find ``root`` by the call's quick key from the next call on (``quick``: that key, args, kwargs)."""
    if quick is None or root is None or quick[0] in plans.trees.quick:
        return
    at = K.leaf_positions(quick[1], quick[2], call)
    if at is not None:
        plans.trees.add_quick(key, quick[0], R.Quick(root, at[0], at[1], call.diff_tree, call))


def _forward(fun: Callable, args: tuple, kwargs: dict, modules: dict, positions: tuple, has_aux: bool,
             call: K.Call, linked: list):
    """``forward(*diff, arg_values=None) -> (value, (aux, module states))``: ``fun`` on the differentiated
    values (and, for a guarded recording, on ``arg_values`` in place of the other arguments' arrays). ``linked``
    gets where the aux holds the modules' own Variables (:func:`~jaxaot._src.module_links.links`)."""

    def forward(*dvals, arg_values=None):
        call_args, call_kwargs = (list(args), kwargs) if arg_values is None else call.rebuild(args, kwargs,
                                                                                              arg_values)
        for n, m in modules.items():
            call_args[n] = m.merge(dvals[positions.index(n)] if n in positions else None)
        layouts = {n: M.layout(call_args[n]) for n in modules}
        for n, v in zip(positions, dvals):
            if n not in modules:
                call_args[n] = v
        out = fun(*call_args, **call_kwargs)
        for n, m in modules.items():
            m.check_unchanged(call_args[n], layouts[n], name_of(fun))
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise InvalidOutputError(f"{name_of(fun)} was marked has_aux=True but returned a "
                                         f"{type(out).__name__}, not a (value, aux) pair.")
            out, aux = out
            if modules:
                linked[:] = [ML.links(aux, {n: call_args[n] for n in modules})]
        else:
            aux = None
        _check_scalar(out, fun)
        return out, (aux, {n: m.state_after(call_args[n], dvals[positions.index(n)] if n in positions else None)
                           for n, m in modules.items()})

    return forward


#: What JAX raises when it needs a value that lazy recording has not computed (eager recording has it).
_NEEDS_VALUES = (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError,
                 jax.errors.TracerArrayConversionError, jax.errors.TracerIntegerConversionError)


def _recorded(plans: Plans, forward: Callable, call: K.Call, planned: tuple, reason: Callable[[Any], str],
              arrays: list | None) -> tuple | None:
    """``(value, rest, grads, compiled, recorded, executable)`` from a recorded step, or None when the
    function runs under vjp capture. ``arrays``: record guarded, with these in place of the other
    arguments' arrays (lazy mode only).

    Moves the function to the next mode when its current one fails (module docstring): lazy recording
    to eager recording when JAX needed a value while recording or the recorded program did not compile
    (``fori_loop`` bounds JAX would have specialised on); either to vjp capture when the forward cannot
    be recorded, or a custom rule closes over a value it computed (:func:`_escaped`). Other errors are the
    forward's own and propagate.
    """
    failed: BaseException | None = None  # lazy recording's failure in this call, while eager recording retries it
    while plans.mode != "vjp":
        eager = plans.mode == "eager"
        given = call.arrays if arrays is None or eager else arrays  # the arrays the step may read, by position
        started = None if eager else plans.ahead.start(call.diff, given)
        t = time.perf_counter()
        try:
            recorded = S.record(forward, call.diff, call.diff_tree, eager, None if eager else arrays,
                                [t[0] if type(t) is tuple else t for t in call.types[:len(call.diff)]], plans.trie.root(),
                                started, call.placement)
        except C.Unrecordable as e:
            plans.ahead.drop()
            plans.mode = "vjp"
            note_fallback(f"compiled_grad({plans.name}): the forward cannot be recorded ({e}); running it under "
                          "jax.vjp with a captured backward from now on")
            continue
        except _NEEDS_VALUES as e:
            plans.ahead.drop()
            if eager:
                _retry_failed(plans, failed)
                raise
            failed = e
        except BaseException:
            plans.ahead.drop()
            _retry_failed(plans, failed)
            raise
        else:
            recorded = recorded._replace(seconds=time.perf_counter() - t)
            try:
                exe, compiled = S.executable(recorded, planned, call.diff, reason)
                looks = lambda: S.look_outputs(recorded, S.host_copies(recorded, call.diff))  # noqa: E731
                ran = None if eager else plans.ahead.finish(started, exe, recorded.args, recorded.tape.arg_objects,
                                                            given, looks)
                value, outs, grads = S.call(exe, recorded.structure, call.diff, recorded.args) if ran is None else ran
                rest = S.outputs(recorded.rest, recorded.rest_tree, outs)
            except (JaxaotError, FloatingPointError):  # the user's error, or jax.debug_nans's: not the mode's
                _retry_failed(plans, failed)
                raise
            except Exception as e:
                if _escaped(e):  # no recording holds it: eager recording fails the same way
                    plans.ahead.drop()
                    plans.mode = "vjp"
                    note_fallback(f"compiled_grad({plans.name}): a custom rule closes over a value the forward "
                                  "computed; running it under jax.vjp with a captured backward from now on")
                    continue
                if eager:
                    _retry_failed(plans, failed)
                    raise
                failed = e
            else:
                if failed is not None:  # eager recording did what lazy recording could not: it stays
                    first = (str(failed).strip().splitlines() or [""])[0]
                    note_fallback(f"compiled_grad({plans.name}): lazy recording failed ({type(failed).__name__}: "
                                  f"{first[:200]}); recording eagerly from now on")
                return value, rest, list(grads), compiled, recorded, exe
        plans.mode = "eager"
    return None


def _retry_failed(plans: Plans, failed: BaseException | None) -> None:
    """Eager recording, retrying what lazy recording failed at in this call (``failed``), failed too: the error is
    the call's own (a custom rule refusing this input), not lazy recording's, so the function records lazily again."""
    if failed is not None:
        plans.mode = "lazy"


def _escaped(e: BaseException) -> bool:
    """Whether ``e`` is JAX meeting a recorded value while it traced the step: a custom rule (a ``custom_vjp``
    backward, a ``custom_jvp`` rule) that closes over a value the forward computed, a Python function the
    recording stages as it is and the step traces afterwards."""
    return isinstance(e, jax.errors.UnexpectedTracerError) and C.RecordingTracer.__name__ in str(e)


def compiled_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
                  holomorphic: bool = False, allow_int: bool = False, reduce_axes: Sequence[Any] = (), *,
                  param_hooks: Mapping[Any, Callable[[Any, Any], Any]] | None = None,
                  replay: bool = False) -> Gradient:
    """Like ``jax.grad``, with the eager forward and compiled backward of :func:`compiled_value_and_grad`.

    Example:
        >>> import jax.numpy as jnp, jaxaot
        >>> jaxaot.compiled_grad(lambda x: jnp.sum(x ** 2))(jnp.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
    """
    parse_argnums(argnums, "compiled_grad")  # refused here, in its own name
    vg = compiled_value_and_grad(fun, argnums, has_aux, holomorphic, allow_int, reduce_axes, param_hooks=param_hooks,
                                 replay=replay)
    return grad_of(vg, fun, has_aux=has_aux, argnums=argnums)


def nnx_compiled_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *,
                      param_hooks: Mapping[Any, Callable[[Any, Any], Any]] | None = None,
                      replay: bool = False) -> Gradient:
    """:func:`compiled_grad` under the name Flax users look for; module arguments get an ``nnx.State``."""
    return compiled_grad(fun, argnums, has_aux, param_hooks=param_hooks, replay=replay)


# --------------------------------------------------------------------------- checks
#: (number of differentiated leaves, the call's array types) seen to be float or complex where differentiated
_INEXACT: dict[tuple, bool] = {}


def _check_inexact(call: K.Call, diff: Sequence[Any], positions: Sequence[int]) -> None:
    n = len(call.diff)
    if _INEXACT.get((n, call.types)):  # the types seen before: checked then
        return
    for t in call.types[:n]:
        dtype = (t[0] if type(t) is tuple else t).dtype
        if not C.is_inexact(dtype):
            break
    else:
        if len(_INEXACT) >= 1024:
            _INEXACT.clear()
        _INEXACT[(n, call.types)] = True
        return
    for n, value in zip(positions, diff):  # the slow path, for the message
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            dtype = jax.numpy.result_type(leaf)
            if not C.is_inexact(dtype):
                where = f"argument {n}{jax.tree_util.keystr(path)}"
                raise InvalidInputError(
                    f"{where} has dtype {_dtype_name(dtype)}; compiled_grad "
                    "differentiates float and complex inputs only. Leave it out of argnums, or convert it "
                    "(x.astype(jnp.float32)).")


def _dtype_name(dtype: Any) -> str:
    """``dtype``'s name for a message: NumPy's, or JAX's own for its extended dtypes (a PRNG key's ``key<fry>``)."""
    if dtype == C.float0:
        return "float0"
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _check_scalar(out: Any, fun: Any) -> None:
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape is None:
        raise InvalidOutputError(f"{name_of(fun)} returned a {type(out).__name__}; compiled_grad needs a scalar "
                                 "array output (use has_aux=True to return more).")
    if tuple(shape) != () or not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        raise InvalidOutputError(f"{name_of(fun)} returned {format_aval(out)}; compiled_grad needs a real scalar "
                                 "output, as jax.grad does (sum or mean it, or use jax.vjp).")
