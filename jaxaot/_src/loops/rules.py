"""The rules of the loop primitives, and their one registration block.

Every transformation JAX applies, for all three primitives at once: abstract eval,
JVP (a loop of the same kind over nonzero tangent carries, or the offline
schedule's), partial eval (:mod:`jaxaot._src.loops.partial_eval`), transpose of a
``counted_loop`` (the cond-driven loops refuse: their trip count is unknown to the
backward), batching (lanes that stop early keep their carry, and their stacked rows are zero, by
selects) and DCE.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> f = lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))
    >>> ref = lambda x: jnp.sin(jnp.sin(jnp.sin(x)))
    >>> bool(jnp.allclose(jax.jvp(lambda x: f(x)[1], (0.5,), (1.0,))[1], jax.grad(ref)(0.5)))
    True
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot._src import compat as C
from jaxaot.errors import LoopFunctionError, ReverseModeBoundError
from jaxaot._src.loops import lowering, offline
from jaxaot._src.loops.capacity import unbounded_error
from jaxaot._src.loops.reverse_mode import reverse_mode
from jaxaot._src.loops.common import (
    INT,
    LOOP_PRIMITIVES,
    as_operand,
    broadcast_lanes,
    counted_loop,
    counted_loop_p,
    either,
    is_zero,
    loop_of,
    moveaxis,
    pick,
    row_aval,
    stacked_aval,
    trace_flat,
    while_loop_p,
    while_loop_stack_output_p,
    zero_tangent,
)
from jaxaot._src.loops.partial_eval import partial_eval, partial_eval_custom


# --------------------------------------------------------------------------- abstract eval
def _abstract_eval(prim, *avals, **params):
    loop = loop_of(prim, params)
    return loop.out_avals(), loop.effects()


# --------------------------------------------------------------------------- JVP
def _jvp(prim, primals, tangents, **params):
    loop = loop_of(prim, params)
    if reverse_mode(loop) == "nested":
        return offline.jvp(loop, primals, tangents)  # nested scans: JAX differentiates them
    n, consts, carry, xs = loop.split(primals)
    _, cdot, tdot, xdot = loop.split(tangents)
    cnz = [not is_zero(t) for t in cdot]
    xnz = [not is_zero(t) for t in xdot]
    tnz = [not is_zero(t) for t in tdot]
    for _ in range(1 + loop.num_carry):
        body_jvp, out_nz = C.jvp_jaxpr(loop.body, cnz + tnz + xnz, tnz + [False] * loop.num_ys)
        if out_nz[: loop.num_carry] == tnz:
            break
        tnz = either(tnz, out_nz[: loop.num_carry])
    ynz = out_nz[loop.num_carry:]
    k, m, x = loop.num_consts, loop.num_carry, loop.num_xs
    fwd = [nz and f for nz, f in zip(tnz, _forwarded_carries(loop))]  # constant tangents: consts, not carries
    fwd_t = pick(tnz, fwd)  # among the nonzero carry tangents, which the body forwards
    nc, nt, nx, nf = sum(cnz), sum(tnz), sum(xnz), sum(fwd)
    ny, nl = sum(ynz), nt - nf
    jvp_in = C.in_avals_of(body_jvp)
    primal_in, tan_in = jvp_in[: k + m + x], jvp_in[k + m + x:]
    c_av, t_av, x_av = C.split_list(primal_in, [k, m])
    dc_av, dt_av, dx_av = C.split_list(tan_in, [nc, nt])

    def body(*args):
        c, dc, df, t, dt, xr, dxr = C.split_list(args, [k, nc, nf, m, nl, x, nx])[:7]
        out = C.eval_closed(body_jvp, *c, *t, *xr, *dc, *C.merge_lists(fwd_t, dt, df), *dxr)
        t_o, y_o, dt_o, dy_o = C.split_list(out, [m, loop.num_ys, nt])
        return [*t_o, *pick(fwd_t, dt_o, False), *y_o, *dy_o]

    new_body = trace_flat(body, [*c_av, *dc_av, *pick(fwd_t, dt_av), *t_av, *pick(fwd_t, dt_av, False), *x_av,
                                 *dx_av])
    new_cond = None
    if loop.cond is not None:
        cond = loop.cond
        new_cond = trace_flat(lambda *a: C.eval_closed(cond, *a[:k], *a[k + nc + nf: k + nc + nf + m]),
                              [*c_av, *dc_av, *pick(fwd_t, dt_av), *t_av, *pick(fwd_t, dt_av, False)])
    new_loop = loop.replace(body=new_body, cond=new_cond, num_consts=k + nc + nf, num_carry=m + nl)
    inst = C.instantiate_zeros
    looped = [nz and not f for nz, f in zip(tnz, fwd)]
    args = new_loop.join(
        n,
        [*consts, *pick(cnz, cdot), *pick(fwd, tdot)],
        [*carry, *[inst(t) for t in pick(looped, tdot)]],
        [*xs, *pick(xnz, xdot)],
    )
    outs = new_loop.bind(args)
    t_out, dt_out, y_out, dy_out, extra = C.split_list(outs, [m, nl, loop.num_ys, ny])
    primal_out = [*t_out, *y_out, *extra]
    dt_iter = iter(dt_out)
    tan_out = ([next(dt_iter) if lp else t if f else zero_tangent(a)
                for lp, f, t, a in zip(looped, fwd, tdot, loop.carry_avals)]
               + C.merge_lists(ynz, [zero_tangent(stacked_aval(a, loop.length))
                                     for a in pick(ynz, loop.y_row_avals, False)], dy_out)
               + [zero_tangent(C.ShapedArray((), INT)), zero_tangent(C.ShapedArray((), np.bool_))][: loop.num_extra])
    return primal_out, tan_out


def _forwarded_carries(loop) -> list[bool]:
    """Per carry, whether the body returns it unchanged: its tangent is then the same every iteration, and
    the JVP passes it as a const (as ``lax.while_loop`` does), so reverse mode never stacks or bounds it."""
    jaxpr = C.jaxpr_of(loop.body)
    k = loop.num_consts
    return [jaxpr.outvars[i] is jaxpr.invars[k + i] for i in range(loop.num_carry)]


# --------------------------------------------------------------------------- transpose
def _transpose_counted(cts, *args, **params):
    loop = loop_of(counted_loop_p, params)
    n, consts, carry, xs = loop.split(args)
    if C.is_undefined_primal(n):
        raise ReverseModeBoundError("counted_loop: the trip count cannot be linear")
    c_lin = [C.is_undefined_primal(c) for c in consts]
    x_lin = [C.is_undefined_primal(x) for x in xs]
    ct_carry, ct_ys = C.split_list(cts, [loop.num_carry])[:2]
    ct_carry = [C.instantiate_zeros(ct) for ct in ct_carry]
    y_nz = [not is_zero(ct) for ct in ct_ys]
    res_c, res_x = pick(c_lin, consts, False), pick(x_lin, xs, False)
    lin_c_avals = [a.to_tangent_aval() for a in pick(c_lin, loop.const_avals)]
    lin_x_rows = [a.to_tangent_aval() for a in pick(x_lin, loop.x_row_avals)]
    y_rows = [a.to_tangent_aval() for a in loop.y_row_avals]
    carry_ct_avals = [a.to_tangent_aval() for a in loop.carry_avals]
    body = loop.body
    nrc, nlc, m, nrx = len(res_c), len(lin_c_avals), loop.num_carry, len(res_x)

    def transposed(*a):
        rc, acc, ctc, rx, cty = C.split_list(a, [nrc, nlc, m, nrx])
        primals = [*C.merge_lists(c_lin, rc, [C.UndefinedPrimal(av) for av in pick(c_lin, loop.const_avals)]),
                   *[C.UndefinedPrimal(av) for av in loop.carry_avals],
                   *C.merge_lists(x_lin, rx, [C.UndefinedPrimal(av) for av in pick(x_lin, loop.x_row_avals)])]
        cts_out = [*ctc, *C.merge_lists(y_nz, [C.Zero(av) for av in pick(y_nz, y_rows, False)], cty)]
        cts_in = C.backward_pass_closed(body, primals, cts_out)
        ct_c, ct_t, ct_x = C.split_list(cts_in, [loop.num_consts, m])
        new_acc = [a_ + C.instantiate_zeros(g) for a_, g in zip(acc, pick(c_lin, ct_c))]
        return [*new_acc, *[C.instantiate_zeros(g) for g in ct_t],
                *[C.instantiate_zeros(g) for g in pick(x_lin, ct_x)]]

    res_c_avals = [jax.typeof(c) for c in res_c]
    res_x_rows = [row_aval(jax.typeof(x)) for x in res_x]
    t_body = trace_flat(transposed, [*res_c_avals, *lin_c_avals, *carry_ct_avals, *res_x_rows,
                                     *pick(y_nz, y_rows)])
    t_loop = counted_loop(t_body, nrc, nlc + m, loop.length, not loop.reverse)
    acc0 = [C.vary_like(jnp.zeros(a.shape, a.dtype), a) for a in lin_c_avals]
    outs = t_loop.bind(t_loop.join(n, res_c, [*acc0, *ct_carry], [*res_x, *pick(y_nz, ct_ys)]))
    ct_c, ct_t, ct_x = C.split_list(outs, [nlc, m])
    return [None, *C.merge_lists(c_lin, [None] * (len(consts) - nlc), ct_c), *ct_t,
            *C.merge_lists(x_lin, [None] * (len(xs) - len(lin_x_rows)), ct_x)]


def _no_transpose(prim, cts, *args, **params):
    if params and reverse_mode(loop_of(prim, params)) == "unbounded":
        raise unbounded_error()
    raise ReverseModeBoundError(
        f"{prim} cannot be transposed directly: its condition depends on a differentiated "
        "value, so its trip count is not known to the backward pass."
    )


# --------------------------------------------------------------------------- batching
def lane_select(p, new, old):
    """``new`` where the batched predicate ``p`` holds, else ``old``: ``p`` has one axis per vmap level."""
    return jnp.where(p.reshape(p.shape + (1,) * (new.ndim - p.ndim)), new, old)


def _batched_carries(loop: Any, axis_data: Any, cb: Sequence[bool], tb: Sequence[bool],
                     xb: Sequence[bool]) -> tuple[list, list]:
    """Fixpoint of which carries (and stacked outputs) vmap must batch.

    Only carries that a batched value (or the named axis itself) reaches get a batch
    axis, so ``jax.jacfwd`` (a vmap over tangents) leaves the primal carries
    unbatched and read-only carries stay as they are, as in lax.while_loop.
    """
    m = loop.num_carry
    tb = list(tb)
    while True:
        outs = C.batched_outputs(loop.body, axis_data, [*cb, *tb, *xb])
        new = either(tb, outs[:m])
        if new == tb:
            return tb, outs[m:]
        tb = new


def gate(p: Any, x: Any) -> Any:
    """``x``, whose derivative is cut on the lanes where ``p`` is false.

    The forward value is ``x`` (XLA folds the select of equal operands). In reverse
    mode a finished lane's cotangent is *selected* to zero instead of multiplied by
    the body's derivative at its state, which may be infinite (``sqrt(0)``): so
    the finished lanes contribute exactly zero, never ``0 * inf = nan``.
    """
    if not C.is_inexact(x.dtype):
        return x
    return lane_select(p, x, jax.lax.stop_gradient(x))


def _has_io_effect(loop: Any) -> bool:
    """Whether the loop runs an unordered ``io_callback`` (ordered ones vmap refuses itself)."""
    return any(type(e).__name__ == "IOEffect" for e in loop.effects())


def _batch(prim, axis_data, args, dims, **params):
    loop = loop_of(prim, params)
    size = axis_data.size
    n, consts, carry, xs = loop.split([as_operand(a, av) for a, av in zip(args, loop.operand_avals())])
    nd, cd, td, xd = loop.split(dims)
    cb = [d is not None for d in cd]
    xb = [d is not None for d in xd]
    k, m, nx, ny = loop.num_consts, loop.num_carry, loop.num_xs, loop.num_ys
    tb, yb = _batched_carries(loop, axis_data, cb, [d is not None for d in td], xb)
    pred_batched = loop.cond is not None and C.batched_outputs(loop.cond, axis_data, cb + tb)[0]
    n_batched = loop.counted and nd is not None
    if pred_batched and _has_io_effect(loop):
        raise LoopFunctionError(
            f"{prim}: the loop's condition is batched under vmap, so finished lanes would keep running "
            "the body, and its IO callbacks (jax.experimental.io_callback) would run for them too; "
            "lax.while_loop refuses this as well. Use jax.debug.callback, or unbatch the condition.")
    if pred_batched or n_batched:
        # Lanes stop at different steps: every carry and row is selected per lane, except
        # read-only carries, which hold their initial value on every lane at every step.
        tb, yb = [b or not ro for b, ro in zip(tb, loop.read_only)], [True] * ny
    consts = [moveaxis(c, d, 0) if d is not None else c for c, d in zip(consts, cd)]
    carry = [moveaxis(c, d, 0) if d is not None else (broadcast_lanes(c, size) if b else c)
             for c, d, b in zip(carry, td, tb)]
    xs = [moveaxis(x, d, 1) if d is not None else x for x, d in zip(xs, xd)]
    body_in_axes = tuple([0 if b else None for b in cb] + [0 if b else None for b in tb]
                         + [0 if b else None for b in xb])
    body_out_axes = [0 if b else None for b in tb] + [0 if b else None for b in yb]
    relaxed = [False]  # the initial carries were cast to varying below: the body and condition take them so

    def run(closed, *a):
        return (C.eval_closed_varying if relaxed[0] else C.eval_closed)(closed, *a)

    vbody = C.vmap_like(partial(run, loop.body), axis_data, body_in_axes, body_out_axes)
    vcond = (C.vmap_like(partial(run, loop.cond), axis_data, body_in_axes[: k + m])
             if loop.cond is not None else None)
    count_lanes = loop.stacks and pred_batched
    lane_mask = []
    if n_batched:
        n = moveaxis(n, nd, 0)
        lane_mask = [jnp.arange(loop.length, dtype=INT)[:, None] < n[None, :]]
        n = jnp.max(n)

    def body(*a):
        c, t, xr, extra = C.split_list(a, [k, m, nx])
        live = vcond(*c, *t)[0] if pred_batched else (extra[0] if n_batched else None)
        if live is not None:  # finished lanes: no derivative through the body (NaN-safe)
            outs = vbody(*[gate(live, x) if b else x for x, b in zip(c, cb)],
                         *[gate(live, x) if b else x for x, b in zip(t, tb)],
                         *[gate(live, x) if b else x for x, b in zip(xr, xb)])
        else:
            outs = vbody(*c, *t, *xr)
        new_t, y = outs[:m], outs[m:]
        if pred_batched:  # a finished lane keeps its carry, and its row is zero, as without vmap
            p = live
            new_t = [lane_select(p, a_, b_) if b else a_ for a_, b_, b in zip(new_t, t, tb)]
            y = [lane_select(p, a_, jnp.zeros_like(a_)) for a_ in y]
        if n_batched:
            (mask,) = extra
            new_t = [lane_select(mask, a_, b_) if b else a_ for a_, b_, b in zip(new_t, t, tb)]
            y = [lane_select(mask, a_, jnp.zeros_like(a_)) for a_ in y]
        counter = [t_extra + p.astype(INT) for t_extra in extra] if count_lanes else []
        return [*new_t, *counter, *y]

    const_avals = [jax.typeof(c) for c in consts]
    x_rows = [row_aval(jax.typeof(x)) for x in xs]
    counter0 = [jnp.zeros((size,), INT)] if count_lanes else []
    extra_rows = [row_aval(jax.typeof(lm)) for lm in lane_mask]

    def counted_body(*a):
        c, t, cnt, xr = C.split_list(a, [k, m, 1])
        return body(*c, *t, *xr, *cnt)

    # Inside shard_map the per-lane selects make a carry (and the lane counter) vary as the predicate or
    # the trip counts do, over manual axes its initial value (a broadcast, a zero) may not vary over:
    # cast the initial values so that the carry keeps one type (lax.while_loop selects in its lowering).
    while True:  # each pass adds axes to some carry: a few passes at most
        carry_avals = [jax.typeof(c) for c in carry]
        if count_lanes:
            new_body = trace_flat(counted_body, [*const_avals, *carry_avals, jax.typeof(counter0[0]), *x_rows])
        else:
            new_body = trace_flat(body, [*const_avals, *carry_avals, *x_rows, *extra_rows])
        init = [*carry, *counter0]
        cast = [C.vary_like(x, av) for x, av in zip(init, C.out_avals_of(new_body))]
        if all(a_ is b_ for a_, b_ in zip(cast, init)):
            break
        carry, counter0 = cast[:m], cast[m:]
        relaxed[0] = True
    new_cond = None
    if loop.cond is not None:
        def cond(*a):
            return [jnp.any(vcond(*a[: k + m])[0])]
        counter_avals = [jax.typeof(c) for c in counter0]
        new_cond = trace_flat(cond, [*const_avals, *carry_avals, *counter_avals])
    new_loop = loop.replace(body=new_body, cond=new_cond, num_carry=m + len(counter0))
    outs = new_loop.bind(new_loop.join(n, consts, [*carry, *counter0], [*xs, *lane_mask]))
    t_out, cnt, y_out, extra = C.split_list(outs, [m, len(counter0), ny])
    out_dims = [0 if b else None for b in tb] + [1 if b else None for b in yb]
    if loop.stacks:
        if count_lanes:
            (lanes,) = cnt
            still = vcond(*consts, *t_out)[0]
            extra = [lanes, jnp.logical_and(lanes >= loop.length, still)]
            out_dims += [0, 0]
        else:
            out_dims += [None, None]
    return [*t_out, *y_out, *extra], out_dims


# --------------------------------------------------------------------------- DCE
def _dce(prim, used_outputs, eqn):
    loop = loop_of(prim, eqn.params)
    if not any(used_outputs) and not C.has_effects(eqn):
        return [False] * len(eqn.invars), None
    k, m, nx, ny = loop.num_consts, loop.num_carry, loop.num_xs, loop.num_ys
    used_t, used_y = list(used_outputs[:m]), list(used_outputs[m:m + ny])
    used_c_cond = [False] * k
    if loop.cond is not None:
        _, used_cond = C.dce_closed(loop.cond, [True])
        used_c_cond, cond_t = used_cond[:k], used_cond[k:]
        used_t = either(used_t, cond_t)
    for _ in range(2 + m):
        _, used_in = C.dce_closed(loop.body, used_t + used_y, [False] * k + used_t + [False] * nx)
        if used_in[k:k + m] == used_t:
            break
        used_t = either(used_t, used_in[k:k + m])
    used_c = either(used_in[:k], used_c_cond)
    used_x = used_in[k + m:]
    body, _ = C.dce_closed(loop.body, used_t + used_y, used_c + used_t + used_x)
    cond = None
    if loop.cond is not None:
        cond, _ = C.dce_closed(loop.cond, [True], used_c + used_t)
    new_loop = loop.replace(body=body, cond=cond, num_consts=sum(used_c), num_carry=sum(used_t))
    used_inputs = ([True] if loop.counted else []) + used_c + used_t + used_x
    invars = [v for v, u in zip(eqn.invars, used_inputs) if u]
    outvars = [v for v, u in zip(eqn.outvars, used_t + used_y + [True] * loop.num_extra) if u]
    new = C.new_eqn(invars, outvars, prim, new_loop.params(), new_loop.effects(), eqn)
    return used_inputs, new


# --------------------------------------------------------------------------- registration
for _p in LOOP_PRIMITIVES:
    _p.def_effectful_abstract_eval(partial(_abstract_eval, _p))
    C.register_lowering(_p, lowering.lowering_rule(_p, blocked=None))
    for _platform in lowering.BLOCKED_PLATFORMS:
        C.register_lowering(_p, lowering.lowering_rule(_p, blocked=True), platform=_platform)
    C.primitive_jvps[_p] = partial(_jvp, _p)
    C.custom_partial_eval_rules[_p] = partial(partial_eval, _p)
    C.fancy_primitive_batchers[_p] = partial(_batch, _p)
    C.dce_rules[_p] = partial(_dce, _p)
    C.partial_eval_jaxpr_custom_rules[_p] = partial(partial_eval_custom, _p)
C.primitive_transposes[counted_loop_p] = _transpose_counted
C.primitive_transposes[while_loop_p] = partial(_no_transpose, while_loop_p)
C.primitive_transposes[while_loop_stack_output_p] = partial(_no_transpose, while_loop_stack_output_p)
