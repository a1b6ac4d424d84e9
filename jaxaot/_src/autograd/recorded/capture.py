"""Capture one step's backward as a jaxpr and run it through the compiled-backward cache.

The fallback for forwards a tape cannot record: the forward runs under eager
``jax.vjp``, and :func:`capture` traces the returned ``vjp_fn`` to its transposed
jaxpr, with the residuals hoisted from consts to inputs. The program then no
longer depends on this step's values, so every step that took the same path
reuses one compiled backward instead of transposing eagerly or compiling anew.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded import param_hooks as PH
from jaxaot._src.autograd.recorded.step_cache import CACHE, Compiled
from jaxaot._src.autograd.recorded.structure import Structure, config_number, structure_of


@dataclasses.dataclass
class Captured:
    """One step's backward: the hoisted program, its residuals and its structure."""

    program: Any
    residuals: list
    structure: Structure


def capture(vjp_fn: Callable[[Any], Any], dtype: Any) -> Captured:
    """Trace ``vjp_fn`` on a unit cotangent of ``dtype`` into a program of the residuals alone."""

    def backward():
        return jax.tree_util.tree_leaves(vjp_fn(jax.numpy.ones((), dtype)))

    closed = jax.make_jaxpr(backward)()
    program, residuals = C.hoist_consts(closed)
    leaked = next((r for r in residuals if isinstance(r, C.Tracer)), None)
    if leaked is not None:  # what jax.value_and_grad raises too, as its backward meets the closed-over value
        raise jax.errors.UnexpectedTracerError(
            f"a custom_vjp backward (or custom_jvp rule) closes over a value the forward computed from a "
            f"differentiated input ({type(leaked).__name__} of {C.typeof(leaked)}); jax.value_and_grad refuses it "
            "as well. Hand such a value to the backward as a residual (the second output of the custom_vjp's "
            "fwd), or compute it inside the rule.")
    return Captured(program, residuals, structure_of(program))


def compile_backward(captured: Captured, planned: Sequence[Any], params: Sequence[Any]) -> tuple[Any, dict]:
    """The compiled executable ``(residuals, params) -> grads`` for ``captured``'s structure.

    ``planned`` post-accumulate hooks (:mod:`.param_hooks`) are traced in after
    the gradients; ``params`` (the differentiated leaves) are inputs only when
    some hook needs them.
    """
    program = captured.program

    def run(residuals, params):
        grads = C.eval_closed(program, *residuals)
        return PH.apply(planned, params, grads) if planned else grads

    t = time.perf_counter()
    lowered = jax.jit(run).lower(captured.residuals, list(params))
    t_lower = time.perf_counter()
    exe = lowered.compile()
    return exe, {"trace_backward": t_lower - t, "compile_backward": time.perf_counter() - t_lower}


def run_compiled(captured: Captured, planned: Sequence[Any], params: Sequence[Any],
                 reason: Callable[[Structure], str]) -> tuple[list, Structure, Compiled | None]:
    """Gradients from the cached executable for ``captured``, the structure used, and on a miss what the
    compile cost and why (``reason(structure)``; None on a hit)."""
    params = list(params) if planned else []
    key = (captured.structure.token, tuple(planned), config_number(C.trace_context()))  # lowering reads the config
    exe, compiled = CACHE.get(key, captured.structure, lambda: compile_backward(captured, planned, params),
                              lambda: reason(captured.structure))
    return list(exe(captured.residuals, params)), captured.structure, compiled
