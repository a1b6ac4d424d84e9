"""Partial evaluation of the loop primitives: how reverse mode splits a loop.

Note [while_loop autograd]
--------------------------
Reverse mode partially evaluates the JVP loop: the known half is a stacking loop
that runs the primal and stacks the residuals each iteration needs (invariant ones
hoisted), the unknown half a linear ``counted_loop`` over them, which transposes to
a counted loop running ``num_steps`` iterations in reverse. Tangents that reach no
output are pruned first, so they are never transposed. ``checkpoints=k`` stores
snapshots instead (:mod:`jaxaot._src.loops.checkpointed`).

Example:
    >>> import jax, jaxaot
    >>> f = lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x), max_steps=8)[1]
    >>> float(jax.grad(f)(1.0))
    8.0
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jaxaot._src import compat as C
from jaxaot._src.loops import checkpointed, segments
from jaxaot._src.loops.capacity import stack_capacity
from jaxaot._src.loops.common import (
    LOOP_PRIMITIVES,
    Loop,
    counted_loop,
    counted_loop_p,
    either,
    loop_of,
    pick,
    stack_loop,
    trace_flat,
    while_loop_p,
)
from jaxaot._src.loops.overflow import guard_tangents, poison
from jaxaot._src.loops.reverse_mode import reverse_mode


# --------------------------------------------------------------------------- splitting the bodies
def _carry_unknowns(loop: Loop, consts_uk: Sequence[bool], carry_uk: Sequence[bool], xs_uk: Sequence[bool]):
    """Fixpoint of which carries are unknown, and the body's partial evaluation for it:
    ``(carry_uk, (known body, unknown body, out_uk, residual avals))``."""
    carry_uk = list(carry_uk)
    for _ in range(1 + loop.num_carry):
        split = C.partial_eval_jaxpr_nounits(
            loop.body, [*consts_uk, *carry_uk, *xs_uk], [*carry_uk, *([False] * loop.num_ys)])
        out_uk = split[2]
        if out_uk[: loop.num_carry] == carry_uk:
            return carry_uk, split
        carry_uk = either(carry_uk, out_uk[: loop.num_carry])
    raise AssertionError("carry fixpoint not reached")


def _cond_unknown(loop: Loop, consts_uk: Sequence[bool], carry_uk: Sequence[bool]) -> bool:
    if loop.cond is None:
        return False
    _, _, (uk,), _ = C.partial_eval_jaxpr_nounits(loop.cond, [*consts_uk, *carry_uk], False)
    return bool(uk)


def _known_cond(loop: Loop, consts_uk: Sequence[bool], carry_uk: Sequence[bool]) -> Any:
    """The condition on the known consts and carries (None for a counted loop)."""
    if loop.cond is None:
        return None
    known, _, _, _ = C.partial_eval_jaxpr_nounits(loop.cond, [*consts_uk, *carry_uk], False)
    return known


def _prune_residuals(known_body: Any, unknown_body: Any, res_avals: Sequence[Any]) -> tuple[Any, Any, list]:
    """Dead-code-eliminate the unknown (linear) body, and drop from the known body the
    residuals it no longer reads: ``(known body, unknown body, residual avals)``.

    The linear body may hold tangents that reach no output: those of values that only
    feed a condition (a line search's acceptance tolerance, say). Transposing them
    anyway would multiply zero cotangents by their derivatives, which can be
    infinite (``sqrt`` at 0): ``0 * inf = nan``. Without them, every cotangent the
    backward computes reaches an input, and fewer residuals are stored or recomputed.
    """
    num_res = len(res_avals)
    n_in, n_out = len(C.in_avals_of(unknown_body)), len(C.out_avals_of(unknown_body))
    unknown_body, used = C.dce_closed(unknown_body, [True] * n_out, [False] * num_res + [True] * (n_in - num_res))
    keep = list(used[:num_res])
    if all(keep):
        return known_body, unknown_body, list(res_avals)
    n_known_out = len(C.out_avals_of(known_body)) - num_res
    known_body, _ = C.dce_closed(known_body, [True] * n_known_out + keep, True)
    return known_body, unknown_body, pick(keep, res_avals)


def _hoist(known_body: Any, num_consts: int, num_outs: int, num_res: int):
    """Split ``known_body`` into a consts-only part and a per-iteration part.

    Returns ``(hoist, loop_body, loop_dep)``: ``hoist(consts) -> (invariant residuals,
    loop consts)``, ``loop_body(loop consts, carry, xs) -> (outs, varying residuals)``
    and, per residual, whether it varies with the iteration (and so is stacked).
    """
    n_in = len(C.in_avals_of(known_body))
    hoist, loop_body, dep, _ = C.partial_eval_jaxpr_nounits(
        known_body, [False] * num_consts + [True] * (n_in - num_consts), [True] * num_outs + [False] * num_res)
    return hoist, loop_body, list(dep[num_outs:])


# --------------------------------------------------------------------------- nested loops
_LOOP_NAMES = frozenset(str(p) for p in LOOP_PRIMITIVES)


def _runs_a_loop(eqn: Any) -> bool:
    """Whether ``eqn`` runs a jaxaot loop (and has no effects, which ``jax.checkpoint`` may refuse)."""
    if C.is_effectful(eqn):
        return False
    return str(eqn.primitive) in _LOOP_NAMES or any(str(e.primitive) in _LOOP_NAMES
                                                    for sub in C.eqn_subjaxprs(eqn) for e in C.iter_eqns(sub))


def recompute_inner_loops(body: Any) -> Any:
    """``body`` with every eqn that runs a loop of its own (directly or inside a call) under
    ``jax.checkpoint``: reverse mode then stores that inner loop's inputs per outer iteration and
    runs its forward again, with its own stack, in the outer backward's step, instead of keeping
    every inner stack for every outer iteration (``N_outer * N_inner`` rows; ``N ** depth`` for a
    nest of loops of one ``max_steps``). Each nesting level costs one more forward evaluation of
    the loops inside it. ``body`` itself when it runs no inner loop."""
    jaxpr = C.jaxpr_of(body)
    if not any(_runs_a_loop(e) for e in jaxpr.eqns):
        return body

    def run(*args):
        env = dict(zip(jaxpr.constvars, C.consts_of(body)))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            invals = [v.val if C.is_literal(v) else env[v] for v in eqn.invars]
            if _runs_a_loop(eqn):
                outs = jax.checkpoint(lambda *a, eqn=eqn: C.bind_eqn(eqn, a), prevent_cse=False)(*invals)
            else:
                outs = C.bind_eqn(eqn, invals)
            env.update((v, x) for v, x in zip(eqn.outvars, outs) if not C.is_drop_var(v))
        return [v.val if C.is_literal(v) else env[v] for v in jaxpr.outvars]

    return trace_flat(run, C.in_avals_of(body))


# --------------------------------------------------------------------------- the rules
def partial_eval(prim: Any, trace: Any, *tracers: Any, **params: Any) -> list:
    """The partial-eval rule: a known stacking loop and a staged linear counted loop."""
    loop = loop_of(prim, params)
    if not loop.counted:  # inner loops: recomputed in the outer backward (nested checkpointing)
        loop = loop.replace(body=recompute_inner_loops(loop.body))
    uk = [not C.is_known_pval(t) for t in tracers]
    n_uk, consts_uk, carry_uk, xs_uk = loop.split(uk)
    if (loop.counted and n_uk) or not any(uk):
        return trace.default_process_primitive(prim, tracers, params)
    carry_uk, (known_body, unknown_body, out_uk, res_avals) = _carry_unknowns(loop, consts_uk, carry_uk, xs_uk)
    if _cond_unknown(loop, consts_uk, carry_uk):
        return trace.default_process_primitive(prim, tracers, params)
    if not any(out_uk):  # no derivative reaches an output: nothing to stack, bound or transpose
        return _run_known(loop, tracers, consts_uk, carry_uk, xs_uk, known_body, res_avals)
    if reverse_mode(loop) == "unbounded":
        return _stage_whole(loop, trace, tracers, consts_uk, carry_uk, known_body, res_avals)
    known_body, unknown_body, res_avals = _prune_residuals(known_body, unknown_body, res_avals)
    mode = reverse_mode(loop, res_avals)
    if mode == "segments":  # a CPU's large max_steps stack in segments (jaxaot._src.loops.segments)
        return _segmented(loop, trace, tracers, consts_uk, carry_uk, known_body, res_avals)
    if mode in ("checkpointed", "nested"):  # a nested loop's JVP is scans: here only when staged as it is
        return checkpointed.partial_eval(loop, trace, tracers, carry_uk, _known_cond(loop, consts_uk, carry_uk),
                                         known_body, unknown_body, res_avals)
    ys_uk = out_uk[loop.num_carry:]
    length, on_overflow = stack_capacity(loop)
    k, m = loop.num_consts, loop.num_carry
    kc_n, kt_n = k - sum(consts_uk), m - sum(carry_uk)
    num_res = len(res_avals)
    num_known_outs = kt_n + loop.num_ys - sum(ys_uk)

    n, consts, carry, xs = loop.split(tracers)
    k_consts, k_carry, k_xs = ([C.known_value(t) for t in pick(uks, ts, False)]
                               for ts, uks in ((consts, consts_uk), (carry, carry_uk), (xs, xs_uk)))

    # The known loop: hoisted residuals once, the varying ones stacked per iteration.
    hoist, loop_body, res_dep = _hoist(known_body, kc_n, num_known_outs, num_res)
    hoisted = C.eval_closed(hoist, *k_consts)
    n_inv = len(res_dep) - sum(res_dep)
    inv_res, loop_consts = hoisted[:n_inv], hoisted[n_inv:]
    n_lc = len(loop_consts)
    cond = _known_cond(loop, consts_uk, carry_uk)
    if cond is not None:  # the known loop's consts are (cond consts, loop consts)
        cond_k, lb = cond, loop_body
        cond_in = C.in_avals_of(cond_k)
        cond = trace_flat(lambda *a: C.eval_closed(cond_k, *a[:kc_n], *a[kc_n + n_lc:]),
                          [*cond_in[:kc_n], *C.in_avals_of(lb)[:n_lc], *cond_in[kc_n:]])
        loop_body = trace_flat(lambda *a: C.eval_closed(lb, *a[kc_n:]), [*cond_in[:kc_n], *C.in_avals_of(lb)])
        loop_consts = [*k_consts, *loop_consts]
    if loop.counted:
        known_loop = counted_loop(loop_body, len(loop_consts), kt_n, length, loop.reverse)
    else:
        known_loop = stack_loop(cond, loop_body, len(loop_consts), kt_n, length)
    known_outs = known_loop.bind(known_loop.join(C.known_value(n) if loop.counted else None,
                                                 loop_consts, k_carry, k_xs))
    k_t_out, k_rest, extra = C.split_list(known_outs, [kt_n, known_loop.num_ys])
    k_y_out, ext_res = k_rest[: num_known_outs - kt_n], k_rest[num_known_outs - kt_n:]
    scale = None
    if loop.counted:
        num_steps = C.known_value(n)
    else:
        num_steps, overflowed = extra
        scale = on_overflow(num_steps, overflowed)
        extra = extra if loop.stacks else []
    if scale is not None:  # an overflow makes every tangent NaN (below), checked where one is used
        k_t_out = _run_past(loop, consts_uk, carry_uk, known_body, res_avals, k_consts, k_t_out, overflowed)
        inv_res, res_dep = [*inv_res, scale], [*res_dep, False]
        n_inv += 1

    # The unknown loop: a linear counted loop over the stacked residuals.
    ub = unknown_body
    u_k, u_m = sum(consts_uk), sum(carry_uk)

    def linear_body(*a):
        inv, uc, ut, ux, ext = C.split_list(a, [n_inv, u_k, u_m, sum(xs_uk)])
        if scale is None:
            return C.eval_closed(ub, *C.merge_lists(res_dep, inv, ext), *uc, *ut, *ux)
        out = C.eval_closed(ub, *C.merge_lists(res_dep[:-1], inv[:-1], ext), *uc, *ut, *ux)
        return [*poison(inv[-1], out[:u_m]), *out[u_m:]]

    u_in = C.in_avals_of(ub)
    res_in, rest_in = [*u_in[:num_res], *([jax.typeof(scale)] if scale is not None else [])], u_in[num_res:]
    lin_body = trace_flat(linear_body, [*pick(res_dep, res_in, False), *rest_in, *pick(res_dep, res_in)])
    lin_loop = counted_loop(lin_body, n_inv + u_k, u_m, length, loop.reverse)
    in_tracers = lin_loop.join(num_steps, [*inv_res, *pick(consts_uk, consts)], pick(carry_uk, carry),
                               [*pick(xs_uk, xs), *ext_res])
    out_tracers = C.stage_unknown_eqn(trace, counted_loop_p, in_tracers, lin_loop.out_avals(),
                                      lin_loop.params(), lin_loop.effects())
    if scale is not None:
        with C.tracing_into(trace):
            out_tracers = guard_tangents(overflowed, loop.max_steps, out_tracers)
    u_t_out, u_y_out = C.split_list(out_tracers, [u_m])
    return [*C.merge_lists(carry_uk, k_t_out, u_t_out), *C.merge_lists(ys_uk, k_y_out, u_y_out), *extra]


def _segmented(loop: Loop, trace: Any, tracers: Sequence[Any], consts_uk: Sequence[bool],
               carry_uk: Sequence[bool], known_body: Any, res_avals: Sequence[Any]) -> list:
    """The segmented stack's outputs (:func:`~jaxaot._src.loops.segments.run`); past ``max_steps`` the known
    carries run on without a stack, as one stack's do (:func:`_run_past`), and the tangents are NaN, checked
    where they are used."""
    cond = _known_cond(loop, consts_uk, carry_uk)
    _, consts, carry, _ = loop.split(tracers)
    known_consts = [C.known_value(t) for t in pick(consts_uk, consts, False)]

    def still_running(known):
        return C.eval_closed(cond, *known_consts, *known)[0]

    def run_past(known, overflowed):
        return _run_past(loop, consts_uk, carry_uk, known_body, res_avals, known_consts, known, overflowed)

    return segments.run(loop, segments.applies(loop, res_avals), consts, carry, carry_uk, trace, still_running,
                        run_past)


def _known_loop(loop: Loop, consts_uk: Sequence[bool], carry_uk: Sequence[bool], known_body: Any,
                res_avals: Sequence[Any]) -> Loop:
    """The loop over its known inputs, computing its known outputs (``known_body`` less its residuals)."""
    n_known_outs = len(C.out_avals_of(known_body)) - len(res_avals)
    body, _ = C.dce_closed(known_body, [True] * n_known_outs + [False] * len(res_avals), True)
    return loop.replace(body=body, cond=_known_cond(loop, consts_uk, carry_uk),
                        num_consts=loop.num_consts - sum(consts_uk), num_carry=loop.num_carry - sum(carry_uk))


def _run_past(loop: Loop, consts_uk: Sequence[bool], carry_uk: Sequence[bool], known_body: Any,
              res_avals: Sequence[Any], k_consts: Sequence[Any], k_carry: Sequence[Any], overflowed: Any) -> list:
    """The known carries at the loop's end: the stacking loop's, or where it stopped at ``max_steps``, the
    loop run on from there without a stack (zero iterations otherwise). The primal outputs so never depend on
    ``max_steps``; only the tangents do (NaN, and an error where they are used)."""
    known_loop = _known_loop(loop, consts_uk, carry_uk, known_body, res_avals)
    sg = jax.lax.stop_gradient  # the overflowed lanes' outputs carry no derivative of an outer transformation
    ran = known_loop.bind(known_loop.join(None, [sg(c) for c in k_consts], [sg(c) for c in k_carry], []))
    return [C.typed_as(jnp.where(overflowed, sg(r), c), jax.typeof(c)) for r, c in zip(ran, k_carry)]


def _run_known(loop: Loop, tracers: Sequence[Any], consts_uk: Sequence[bool], carry_uk: Sequence[bool],
               xs_uk: Sequence[bool], known_body: Any, res_avals: Sequence[Any]) -> list:
    """A loop none of whose outputs carries a derivative (its unknown inputs, tangents of values read
    through ``floor`` or by the condition alone, reach none): its known part runs as the loop runs
    without differentiation, to its end, whatever its bound; no stack, nothing staged."""
    known_loop = _known_loop(loop, consts_uk, carry_uk, known_body, res_avals)
    n, consts, carry, xs = loop.split(tracers)
    known = [[C.known_value(t) for t in pick(uks, ts, False)]
             for ts, uks in ((consts, consts_uk), (carry, carry_uk), (xs, xs_uk))]
    return known_loop.bind(known_loop.join(C.known_value(n) if loop.counted else None, *known))


def _stage_whole(loop: Loop, trace: Any, tracers: Sequence[Any], consts_uk: Sequence[bool],
                 carry_uk: Sequence[bool], known_body: Any, res_avals: Sequence[Any]) -> list:
    """What ``lax.while_loop`` does for an unbounded loop: a known loop computes the
    known carries, and the whole loop is staged into the unknown part (which
    recomputes the primal carries it needs); linearize works, the transpose of the
    staged loop is refused with :func:`~jaxaot._src.loops.capacity.unbounded_error`."""
    known_loop = _known_loop(loop, consts_uk, carry_uk, known_body, res_avals)
    _, consts, carry, _ = loop.split(tracers)
    known_in = [C.known_value(t) for t in [*pick(consts_uk, consts, False), *pick(carry_uk, carry, False)]]
    known_out = known_loop.bind(known_in) if known_loop.num_carry else []
    staged = trace.default_process_primitive(loop.prim, tracers, loop.params())
    return C.merge_lists(carry_uk, known_out, pick(carry_uk, staged))


def partial_eval_custom(prim: Any, saveable: Any, unks_in: Sequence[bool], inst_in: Sequence[bool], eqn: Any):
    """The ``jax.checkpoint`` rule: the known loop runs in the forward; the staged
    (backward) part recomputes the loop whole, its residuals being only its inputs.
    Splitting it into stacking and linear loops happens later, when remat's
    transpose partially evaluates the staged eqn with :func:`partial_eval`.

    A loop none of whose outputs is unknown (no differentiated input, or only tangents
    that reach no output: a closed-over value read through ``floor`` or by the
    condition alone) is known, as JAX treats any eqn of known inputs: the policy says
    whether the backward recomputes it or saves its outputs. Were its outputs unknown,
    a loop around it whose condition reads them could not be split, and reverse mode
    would have to transpose a ``while`` (:class:`~jaxaot.errors.ReverseModeBoundError`)."""
    loop = loop_of(prim, eqn.params)
    new_inst = [x for x, inst in zip(eqn.invars, inst_in) if C.is_jaxpr_var(x) and not inst]
    n_out = len(eqn.outvars)
    stage_all = (None, eqn, [True] * n_out, [True] * n_out, new_inst)
    n_uk, consts_uk, carry_uk, xs_uk = loop.split(unks_in)
    if loop.counted and n_uk:
        return stage_all
    carry_uk, (known_body, _, out_uk, res_avals) = _carry_unknowns(loop, consts_uk, carry_uk, xs_uk)
    if _cond_unknown(loop, consts_uk, carry_uk):
        return stage_all
    ys_uk = out_uk[loop.num_carry:]
    known_loop = _known_loop(loop, consts_uk, carry_uk, known_body, res_avals)
    unks = ([False] if loop.counted else []) + [*consts_uk, *carry_uk, *xs_uk]
    known_in = [v for v, u in zip(eqn.invars, unks) if not u]
    out_uk_all = [*carry_uk, *ys_uk, *([False] * loop.num_extra)]
    known_out = [v for v, u in zip(eqn.outvars, out_uk_all) if not u]
    eqn_known = C.new_eqn(known_in, known_out, prim, known_loop.params(), known_loop.effects(), eqn)
    if any(out_uk):
        return eqn_known, eqn, out_uk_all, [True] * n_out, new_inst
    if C.has_effects(eqn_known) or C.saved_by_policy(saveable, eqn_known):
        return eqn_known, None, out_uk_all, [False] * n_out, []
    known_inst = [inst for inst, u in zip(inst_in, unks) if not u]
    recompute_inst = [x for x, inst in zip(known_in, known_inst) if C.is_jaxpr_var(x) and not inst]
    return eqn_known, eqn_known, out_uk_all, [True] * n_out, recompute_inst
