"""Capture one step's backward as a jaxpr and run it through the compiled-backward cache.

This is compiled autograd's fallback (:mod:`.api`), for forwards a tape
cannot record (:mod:`.tape`): the forward runs under an eager ``jax.vjp``.

After an eager ``jax.vjp``, the returned ``vjp_fn`` holds a linear program and
its residuals (the forward's saved values, as concrete arrays). Calling it
eagerly would transpose and run that program one primitive at a time; calling
``jax.jit(vjp_fn)`` would compile anew every step, because each step's
``vjp_fn`` is a new object holding new arrays.

Instead, :func:`capture` traces ``vjp_fn`` with ``jax.make_jaxpr``. That runs
JAX's transposition once, symbolically, and yields the *transposed* program:
the backward, including ``grad_hook`` bodies and the backwards of
``aot_function`` regions. The residuals appear as the jaxpr's consts; they are
hoisted to leading inputs (``_compat.hoist_consts``), so the program no longer
depends on this step's values and its :class:`~.structure.Structure` is the
same for every step that took the same path through the forward. The
executable compiled for that structure is then called with the residuals as
arguments.

The output cotangent of ``value_and_grad`` is always one; it is traced as a
literal (``jnp.ones`` inside the trace) so XLA can fold it, as it does in a
fully jitted step.

Costs per step, besides running the executable: the symbolic transposition
(one Python pass over the linear program) and the structure key (one more
pass, no printing). Both are linear in the number of backward equations and
much cheaper than dispatching each of them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax

from jaxaot._src import compat as C
from jaxaot._src.autograd.recorded import param_hooks as PH
from jaxaot._src.autograd.recorded.cache import CACHE, Compiled
from jaxaot._src.autograd.recorded.structure import Structure, structure_of


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
    key = (captured.structure.token, tuple(planned))
    exe, compiled = CACHE.get(key, captured.structure, lambda: compile_backward(captured, planned, params),
                              lambda: reason(captured.structure))
    return list(exe(captured.residuals, params)), captured.structure, compiled
