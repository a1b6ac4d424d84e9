"""The eager gradient of an ``aot_function``: straight to its compiled executables.

Eagerly, JAX's autodiff bookkeeping around an ``aot_function`` (linearize,
``custom_vjp``, transposition) can cost as much as the executables on small
functions. :func:`function_value_and_grad` runs the compiled forward and backward
directly (one fused executable by default, ``docs/concepts/fused_step.md``) when
every argument is concrete, and defers to ``jax.value_and_grad`` otherwise (under
a trace, integer inputs, a loss that is not a real scalar). A function closing
over a tracer of an outer transformation has nothing compiled: ``jax.value_and_grad``
differentiates its one trace, as ``jax.grad`` of its call does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.autograd.argnums import parse_argnums, resolve_argnums
from jaxaot._src.fusion import fused_exe, fused_name, fused_outputs, is_decided, run_fused
from jaxaot._src.loops import overflow_checked, overflow_mark
from jaxaot.errors import JaxaotError
from jaxaot._src.runtime import AOTFunction, TraceKind, closed_over_tracers, hot_leaves, hot_path, typed_grads


def _is_real_scalar_loss(programs: Any, has_aux: bool) -> bool:
    """Whether the outputs are what ``jax.grad`` differentiates: a real scalar, or a ``(scalar, aux)`` pair.

    Anything else goes to ``jax.value_and_grad`` itself, which raises its own error.
    """
    tree = jax.tree_util.tree_unflatten(programs.out_tree, list(range(programs.out_tree.num_leaves)))
    if has_aux:
        if not (isinstance(tree, (tuple, list)) and len(tree) == 2 and isinstance(tree[0], int)):
            return False
    elif not isinstance(tree, int):
        return False
    aval = C.out_avals_of(programs.primal)[0]
    return aval.shape == () and bool(jax.numpy.issubdtype(aval.dtype, jax.numpy.floating))


def function_value_and_grad(fun: AOTFunction, argnums: int | Sequence[int], has_aux: bool,
                            fused: bool) -> Callable[..., Any]:
    """``jax.value_and_grad(fun, argnums, has_aux)`` of an ``aot_function``, run eagerly on its executables.

    ``fused``: one executable computes the forward and then the backward,
    keeping the partition's plan; False runs the split forward and backward
    executables. The result has a ``lower(*args)`` giving the
    :class:`~jaxaot.AOTLowered` of the programs it runs, and ``cache_info()``,
    ``fun``'s (:meth:`AOTFunction.cache_info <jaxaot.AOTFunction.cache_info>`).

    A signature's first call holds its lock while the fused step compiles and
    is chosen (:func:`~jaxaot._src.fusion.run_fused`), so threads calling together
    compile each variant once: the step's name is in the signature's
    ``compiled`` once, its variants each once.
    """
    fallback = jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux)
    nums, single = parse_argnums(argnums, fun.__name__)

    def training_for(programs, leaves, args, at):
        # The flat leaves are the dynamic arguments' leaves in order (then kwargs'):
        # mark the ranges of the picked arguments, by position (the same array may be
        # passed twice, once differentiated and once not).
        mask, start = [False] * len(leaves), 0
        for i, a in enumerate(args):
            if i in fun.static_argnums:
                continue
            size = len(jax.tree_util.tree_leaves(a))
            if i in at:
                mask[start:start + size] = [True] * size
            start += size
        return programs.training(tuple(mask))

    # id(programs) -> (programs, training or None, picks): what each signature runs, and each picked argument's
    # position among the dynamic ones. The differentiated leaves are fixed by the signature (its number of
    # positional arguments places a negative argnum), so this is decided once per signature.
    plans: dict[int, tuple[Any, Any, tuple[int, ...]]] = {}

    def plan_for(programs, leaves, args, at):
        plan = plans.get(id(programs))
        if plan is None:
            ok = all(n not in fun.static_argnums for n in at) and _differentiable(args, at)
            ok = ok and _is_real_scalar_loss(programs, has_aux)
            picks = tuple(n - sum(s < n for s in fun.static_argnums) for n in at) if ok else ()
            plan = plans[id(programs)] = (programs, training_for(programs, leaves, args, at) if ok else None, picks)
        return plan[1], plan[2]

    # The last call's signature, where it ran the fused executable decided on, its picks and its grads' weak types
    # (TrainingPrograms.weak_grads): the next call with that signature runs it straight away (hot_leaves), as jit's
    # dispatch does, without the lookup and the choice.
    hot: list = [None, (), ()]

    def vg(*args: Any, **kwargs: Any):
        h, hot_picks, hot_casts = hot
        leaves = hot_leaves(h, args, kwargs)
        if leaves is not None:
            mark = overflow_mark()
            try:
                outs, grads = fused_outputs(h.training, h.runs, leaves)
            except ValueError:
                pass  # a sharding the last signature did not have: look it up
            else:
                fun.note_hit()
                return overflow_checked(mark, _results(h.training, outs, grads, hot_picks, hot_casts))
        at = resolve_argnums(nums, len(args), argnums, fun.__name__)
        if C.jit_disabled():  # JAX's own autodiff, eagerly through fun's Python (AOTFunction.__call__)
            return fallback(*args, **kwargs)
        try:
            programs, leaves, kind = fun.lookup(args, kwargs)
        except JaxaotError:  # the call's own arguments refused (a leaf that is no array), by name
            raise
        except Exception:  # the function's trace failed: JAX checks the inputs' types before it traces
            if not _differentiable(args, at):
                return fallback(*args, **kwargs)
            raise
        if programs.closes_over_tracers:  # built inside a transformation: its one trace, through JAX's autodiff
            primal = closed_over_tracers(fun, programs)
            return jax.value_and_grad(primal, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        if kind is not TraceKind.CONCRETE or C.stages_operations():  # arrays under jit (closed over): staged
            return fallback(*args, **kwargs)
        tr, picks = plan_for(programs, leaves, args, at)
        if tr is None:
            return fallback(*args, **kwargs)  # JAX's own error for bad argnums or integer inputs
        value_leaf = 0  # the loss: the only leaf, or the first of a (value, aux) pair
        mark = overflow_mark()  # a max_steps loop that overflowed: LoopOverflowError, with the results
        if fused and not tr.num_aux:
            name = fused_name(tr, value_leaf)
            if not is_decided(programs, name):
                # The first call of a signature compiles the step (on an accelerator, each variant
                # weighed) and decides fused or split: once, however many threads call.
                with programs.lock:
                    outs, grads = run_fused(tr, leaves, value_leaf)
            else:
                outs, grads = run_fused(tr, leaves, value_leaf)
            casts = tr.weak_grads.casts()
            if is_decided(programs, name) and programs.fused_choices[name].runs == "fused":
                found = hot_path(tr, leaves, fused_exe(tr, value_leaf), bool(fun.static_argnums))
                if found is not None:
                    hot[:] = [found, picks, casts]
        else:
            outs, residuals = tr.forward(leaves, concrete=True)
            grads = tr.backward(residuals, tr.unit_cotangents(value_leaf), concrete_residuals=True)
            casts = tr.weak_grads.casts()
        return overflow_checked(mark, _results(tr, outs, grads, picks, casts))

    def _results(tr: Any, outs: list, grads: list, picks: tuple[int, ...], casts: tuple) -> Any:
        """``(value, grad)`` (``((value, aux), grad)`` with ``has_aux``) from the flat outputs and grads; those at
        ``casts`` weakly typed, as JAX's gradient of a Python float is (``TrainingPrograms.weak_grads``)."""
        dyn, _ = tr.input_grads_tree(typed_grads(grads, casts) if casts else grads)
        picked = tuple(dyn[i] for i in picks)
        out_tree = jax.tree_util.tree_unflatten(tr.programs.out_tree, outs)
        grad = picked[0] if single else picked
        if has_aux:
            value, aux = out_tree
            return (value, aux), grad
        return out_tree, grad

    def lower_running(run: Callable[..., Any]) -> Callable[..., Any]:
        def lower(*args: Any, **kwargs: Any):
            """The :class:`AOTLowered` of the programs this gradient runs; its compiled stage, called, runs ``run``."""
            at = resolve_argnums(nums, len(args), argnums, fun.__name__)
            programs, leaves, _ = fun.lookup(args, kwargs)
            tr, _ = plan_for(programs, leaves, args, at)  # None: jax.value_and_grad runs it, not the fused step
            training = tr if tr is not None else training_for(programs, leaves, args, at)
            return fun.lowered(training, run, runs_step=fused and tr is not None)
        return lower

    vg = C.api_boundary(vg)  # an error in the user's function shows the user's lines, as under jit
    vg.__wrapped__ = fun
    vg.lower = lower_running(vg)
    vg.lower_running = lower_running  # grad_of's gradient lowers the same programs
    vg.cache_info = fun.cache_info
    return vg


def _differentiable(args: tuple, at: Sequence[int]) -> bool:
    """Whether every leaf of the differentiated arguments has a float or complex type, as ``jax.grad`` requires."""
    try:
        return all(C.is_inexact(jax.numpy.result_type(x)) for i in at for x in jax.tree_util.tree_leaves(args[i]))
    except TypeError:  # a leaf JAX cannot type (a function)
        return False
