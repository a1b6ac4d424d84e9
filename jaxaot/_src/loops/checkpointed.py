"""``while_loop(..., checkpoints=k)``: the reverse mode that stores k carries.

Partial evaluation splits such a loop into a primal loop that stores at most k
snapshots, placed online by :func:`~jaxaot._src.loops.revolve.place` (or read from a
trace-time table, :mod:`jaxaot._src.loops.schedule_tables`), and one
:data:`checkpointed_linear_p` eqn, the tangent map, recomputing each step's
residuals. Its transpose is the revolve backward, one loop
(:mod:`jaxaot._src.loops.sweep`) whose loops are ``checkpoints=k`` loops themselves,
so reverse over reverse stays bounded. On GPUs, where each run-time predicate is a
host round trip, the loops check it once per block of steps (:func:`online_block`,
:mod:`jaxaot._src.loops.blocked`).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxaot._src import compat as C
from jaxaot._src.config import config
from jaxaot.errors import InvalidLoopOptionError
from jaxaot._src.loops.common import broadcast_lanes, is_zero, moveaxis, read_row, strong, trace_flat, write_row
from jaxaot._src.loops.overflow import check_overflow, overflow_scale, poison
from jaxaot._src.loops import blocked, revolve, schedule_tables, sweep
from jaxaot._src.loops.revolve import MAX_REPS, beta_table_jax, place, split_point_jax

checkpointed_linear_p = C.new_loop_primitive("checkpointed_linear_loop")
"""The tangent map of a checkpointed loop: ``num_steps`` applications of the
linearized body, each recomputing its residuals from the replayed primal state.

Operands: ``num_steps, positions, slot_of, top, *snapshots, *known consts, *linear
consts, *linear carry`` (level ``a <= top``'s snapshot is in slot ``slot_of[a]``; the
snapshots have ``checkpoints + 1`` rows, the last a scratch slot).
Params: ``known_body`` ``(known consts, primal carry) -> (primal carry,
residuals)``, ``linear_body`` ``(residuals, linear consts, linear carry) ->
linear carry``, ``checkpoints``, ``num_known_consts``, ``num_linear_consts``.
Its transpose is the revolve backward."""


def _linear_split(args: Sequence[Any], params: dict):
    """``(num_steps, positions, slot_of, top, snapshots, known consts, linear consts, linear carry)``."""
    n_snap = len(C.out_avals_of(params["known_body"])) - _num_res(params)
    sizes = [1, 1, 1, 1, n_snap, params["num_known_consts"], params["num_linear_consts"]]
    (n,), (pos,), (slot_of,), (top,), snaps, kc, lc, lt = C.split_list(args, sizes)
    return n, pos, slot_of, top, snaps, kc, lc, lt


def _num_res(params: dict) -> int:
    lin_in = len(C.in_avals_of(params["linear_body"]))
    n_lin_carry = len(C.out_avals_of(params["linear_body"]))
    return lin_in - params["num_linear_consts"] - n_lin_carry


def _primal_body(params: dict) -> Any:
    """The known body without its residuals: the step of the forward loop and of the backward's
    advances."""
    body = params["known_body"]
    n_out = len(C.out_avals_of(body)) - _num_res(params)
    return C.dce_closed(body, [True] * n_out + [False] * _num_res(params), True)[0]


def _step(params: dict, kc, x):
    outs = C.eval_closed(params["known_body"], *kc, *x)
    nres = _num_res(params)
    return outs[: len(outs) - nres], outs[len(outs) - nres:]


def _linear_impl(*args, **params):
    n, _, _, _, snaps, kc, lc, lt = _linear_split(args, params)

    def body(state):
        i, x, t = state
        x2, res = _step(params, kc, x)
        t2 = C.eval_closed(params["linear_body"], *res, *lc, *t)
        return i + 1, [strong(a) for a in x2], [strong(a) for a in t2]

    x0 = [strong(read_row(s, 0)) for s in snaps]
    _, _, t = C.lax_while_loop(lambda s: s[0] < n, body, (jnp.zeros((), jnp.int32), x0, [strong(a) for a in lt]))
    return list(t)


def _linear_abstract_eval(*avals, **params):
    return C.out_avals_of(params["linear_body"]), C.join_effects(
        C.effects_of(params["known_body"]), C.effects_of(params["linear_body"]))


def _transpose_step(params: dict, res, lc_avals, ct):
    """Cotangents ``(linear consts, linear carry)`` of one step with residuals ``res``."""
    lt_avals = C.out_avals_of(params["linear_body"])
    primals = [*res, *[C.UndefinedPrimal(a) for a in lc_avals], *[C.UndefinedPrimal(a) for a in lt_avals]]
    cts = C.backward_pass_closed(params["linear_body"], primals, ct)
    nres = len(res)
    ct_lc = [C.instantiate_zeros(g) for g in cts[nres: nres + len(lc_avals)]]
    ct_lt = [C.instantiate_zeros(g) for g in cts[nres + len(lc_avals):]]
    return ct_lc, ct_lt


def _stepper(params: dict, kc: Sequence[Any], lc_avals: Sequence[Any]) -> Any:
    """:func:`jaxaot._src.loops.sweep.stepper` of this loop: the advance runs the known body without its
    residuals (the forward loop's step), the VJP the known body with them and the linear body's
    transpose."""
    primal = _primal_body(params)

    def advance(x):
        return [strong(a) for a in C.eval_closed(primal, *kc, *x)]

    def vjp(x, ct, acc):
        g_lc, g_lt = _transpose_step(params, _step(params, kc, x)[1], lc_avals, ct)
        return [strong(g) for g in g_lt], [strong(a + g) for a, g in zip(acc, g_lc)]

    return sweep.stepper(advance, vjp)


def _split_table(params: dict) -> Any:
    """The binomial table of the split points: cut to what ``max_steps`` needs for a bounded loop
    (a constant of a few thousand entries), else computed on the device once per loop."""
    k, bound = params["checkpoints"], params["max_steps"]
    return schedule_tables.split_table(bound, k) if bound is not None else beta_table_jax(k)


def _split(params: dict, longest: int | None = None) -> Any:
    """Revolve's split points ``split(length, slots)``: read from a table of every split point (one
    lookup) for a bounded loop, or segments of at most ``longest`` steps, where that table is small;
    else searched in the binomial table: by a binary search of a dozen dynamic slices in one loop
    (:func:`jaxaot._src.loops.sweep.search_split`, cheap scalar ops on a CPU), by one compare-and-count
    over a row in blocks (:func:`~jaxaot._src.loops.revolve.split_point_jax`, one kernel on a GPU)."""
    k, bound = params["checkpoints"], params["max_steps"]
    longest = bound if longest is None else longest
    points = schedule_tables.split_points(longest, k) if longest is not None else None
    if points is not None:
        return sweep.lookup_split(points, max(longest, 2))
    if params["block"] == 1:
        return sweep.search_split(_split_table(params))
    table = jnp.asarray(_split_table(params))
    return lambda length, slots: split_point_jax(length, slots, k, table)


def _linear_transpose(cts, *args, **params):
    n, pos, slot_of, top, snaps, kc, lc, lt = _linear_split(args, params)
    k, block = params["checkpoints"], params["block"]
    lc_avals = [a.aval for a in lc]
    ct = [C.instantiate_zeros(c) for c in cts]
    acc = [C.vary_like(jnp.zeros(a.shape, a.dtype), a) for a in lc_avals]
    n_plain = 4 + len(snaps) + len(kc)

    def reverse(ct, acc, longest=None):  # the split points made here: a branch not taken computes none
        split = _split(params, longest)
        if block == 1:  # one loop, one body (jaxaot._src.loops.sweep)
            return sweep.reverse(_stepper(params, kc, lc_avals), n, pos, slot_of, top, snaps, ct, acc, k, split)
        primal = _primal_body(params)  # the advance needs no residuals
        return blocked.reverse(lambda x: C.eval_closed(primal, *kc, *x),
                               lambda x, ct: _transpose_step(params, _step(params, kc, x)[1], lc_avals, ct),
                               n, pos, slot_of, top, snaps, ct, acc, k, block, split)

    if params["max_steps"] is not None or k > TABLE_CHECKPOINTS:
        ct, acc = reverse(ct, acc)
    else:  # an unbounded loop's split points: looked up while its segments are short (no longer than
        # the loop), searched past that; a lax.cond per step would cost more than the lookup saves
        short = online_table_steps(k)
        ct, acc = lax.cond(n <= short, functools.partial(reverse, longest=short), reverse, ct, acc)
    lt_avals = [a.aval for a in lt]  # the loop ran strongly typed: hand back the inputs' weak types
    return [None] * n_plain + [C.typed_as(g, a) for g, a in zip(acc, lc_avals)] + [
        C.typed_as(g, a) for g, a in zip(ct, lt_avals)]


def _linear_jvp(primals, tangents, **params):
    """Linear in (linear consts, linear carry): their tangents go through the same
    map, which stays transposable. Tangents of the replayed primal inputs (forward
    mode over a linearization) take the plain loop's JVP instead."""
    n, pos, slot_of, top, snaps, kc, lc, lt = _linear_split(primals, params)
    _, _, _, _, d_snaps, d_kc, d_lc, d_lt = _linear_split(tangents, params)
    if all(is_zero(t) for t in (*d_snaps, *d_kc)):
        d_lin = [C.instantiate_zeros(t) for t in (*d_lc, *d_lt)]
        return (checkpointed_linear_p.bind(*primals, **params),
                checkpointed_linear_p.bind(n, pos, slot_of, top, *snaps, *kc, *d_lin, **params))
    tangents = [C.instantiate_zeros(t) if not is_zero(t) or C.is_inexact(jnp.result_type(x))
                else C.zeros_float0(jnp.shape(x)) for x, t in zip(primals, tangents)]
    out, d_out = jax.jvp(functools.partial(_linear_impl, **params), tuple(primals), tuple(tangents))
    return list(out), list(d_out)


def _linear_batch(axis_data, args, dims, **params):
    """vmap over linear consts / carry (``jax.vmap`` of a linearized function) keeps
    the primitive, with a vmapped linear body; lanes that replay different primal
    states run the plain loop under vmap (correct, but not transposable)."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    n, pos, slot_of, top, snaps, kc, lc, lt = _linear_split(args, params)
    dn, dp, ds, dt, d_snaps, d_kc, d_lc, d_lt = _linear_split(dims, params)
    if any(d is not None for d in (dn, dp, ds, dt, *d_snaps, *d_kc)):
        out = C.vmap_like(functools.partial(_linear_impl, **params), axis_data, tuple(dims))(*args)
        return list(out), [0] * len(out)
    lc = [moveaxis(c, d, 0) if d is not None else c for c, d in zip(lc, d_lc)]
    lt = [moveaxis(t, d, 0) if d is not None else broadcast_lanes(t, size) for t, d in zip(lt, d_lt)]
    nres = _num_res(params)
    in_axes = [None] * nres + [0 if d is not None else None for d in d_lc] + [0] * len(lt)
    vlin = C.vmap_like(functools.partial(C.eval_closed, params["linear_body"]), axis_data, tuple(in_axes))
    res_avals = C.in_avals_of(params["linear_body"])[:nres]
    linear_body = trace_flat(vlin, [*res_avals, *[jax.typeof(c) for c in lc], *[jax.typeof(t) for t in lt]])
    out = checkpointed_linear_p.bind(n, pos, slot_of, top, *snaps, *kc, *lc, *lt,
                                     **dict(params, linear_body=linear_body))
    return list(out), [0] * len(out)


# --------------------------------------------------------------------------- blocks
#: The blocks on GPUs, where each check is a wait for the predicate on the host: a run of L
#: steps then costs about ``L / B`` waits plus ``(B - 1) / 2`` masked steps;
#: ``B = sqrt(2 L wait / step)`` balances them, 4 for runs of about 8 steps each about as long
#: as a wait (the recomputation sweeps and VJP runs of n=2000, k=40).
GPU_BLOCK = 4


def online_block(effects: Any = None) -> int:
    """Steps per predicate check for a ``checkpoints=k`` loop traced now: ``jaxaot.config.online_block``
    if set, else :data:`GPU_BLOCK` when the default backend is a GPU, else 1 (CPUs and TPUs check a
    predicate without a host round trip). 1 for a body with effects (a masked step would repeat them)."""
    if effects:
        return 1
    if config.online_block is not None:
        return config.online_block
    return GPU_BLOCK if jax.default_backend() in ("gpu", "cuda", "rocm") else 1


# --------------------------------------------------------------------------- effects
def unreplayable(effects: Any) -> list[str]:
    """The effects in ``effects`` that a backward recomputing the body must not run again, by name:
    ordered ones (``io_callback(..., ordered=True)``, ``jax.debug.callback(..., ordered=True)``) and
    ``io_callback``'s, which ``jax.checkpoint`` refuses as well. Unordered ``jax.debug`` callbacks
    may run again, as under ``jax.checkpoint``. (Read by type name: JAX keeps its effect sets private.)"""
    names = {e: type(e).__name__ for e in effects}
    return sorted(str(e) for e, name in names.items() if "Ordered" in name or name == "IOEffect")


def check_replay(loop: Any) -> None:
    """Raise :class:`~jaxaot.errors.InvalidLoopOptionError` when reverse mode of ``loop`` (``checkpoints=k``,
    with or without ``max_steps``) would recompute :func:`unreplayable` effects of its body or condition.
    Called when the gradient is traced: the loop itself, and its forward mode, run each effect once per step."""
    refused = unreplayable(loop.effects())
    if not refused:
        return
    option = f"checkpoints={loop.checkpoints}"
    option = option if loop.max_steps is None else f"max_steps={loop.max_steps}, {option}"
    raise InvalidLoopOptionError(
        f"while_loop: with {option}, reverse mode recomputes the body between its snapshots, so its effects "
        f"({', '.join(refused)}) would run again in the backward, after the forward's last step. Ordered effects "
        f"and io_callback's are refused there, as jax.checkpoint refuses io_callback's. Use max_steps without "
        f"checkpoints (it stacks every step and recomputes none), or move the effect out of the loop; an unordered "
        f"jax.debug.callback or jax.debug.print may stay, and runs again where the backward recomputes a step."
    )


# --------------------------------------------------------------------------- partial eval
#: Up to this many snapshots, an unbounded ``checkpoints=k`` loop reads its placement and split points
#: from tables made at trace time (constants of at most about 0.3 MB, :func:`online_table_steps`);
#: above, the program's size does not grow with k, and each step decides on the device (O(k) work).
TABLE_CHECKPOINTS = 128


def online_table_steps(k: int) -> int:
    """How many steps of an unbounded ``checkpoints=k`` forward (k up to :data:`TABLE_CHECKPOINTS`) read
    their placement from a table made at trace time (:func:`jaxaot._src.loops.schedule_tables.recorder`, once
    per k), and the longest loop whose backward looks its split points up in a
    table (:func:`jaxaot._src.loops.schedule_tables.split_points`, ``(k + 1) * (steps + 1)`` int16): 4096 steps
    up to k=31, down to 1024 at k=127; past them each step decides online, O(k) work
    (:func:`~jaxaot._src.loops.revolve.place`), and the backward searches the binomial table."""
    return max(1024, min(4096, (1 << 17) // (k + 1)))


def _placer(k: int, needed: Any) -> tuple:
    """``(levels0, decide, finish)`` of the online placement (:func:`~jaxaot._src.loops.revolve.place`),
    as :func:`jaxaot._src.loops.schedule_tables.recorder` gives them for a bounded loop. Its binomial table is
    computed once, outside the loop (the program's size does not grow with k), when ``needed``."""
    table = lax.cond(needed, lambda: beta_table_jax(k + 1), lambda: jnp.zeros((k + 2, MAX_REPS + 1), jnp.int32))

    def decide(i, levels):
        slot, *new = place(jnp, i, *levels, k, table)
        return jnp.where(i == 0, 0, slot), tuple(new)  # the initial state is level 0, in slot 0

    levels0 = (jnp.full((k,), -1, jnp.int32).at[0].set(0), jnp.arange(k, dtype=jnp.int32), jnp.ones((), jnp.int32))
    return levels0, decide, lambda levels: (levels[0], levels[1], levels[2] - 1)


def _scaled(known_body: Any, unknown_body: Any, num_kc: int, num_res: int, scale_aval: Any) -> tuple[Any, Any]:
    """The bodies with one more known const, the overflow scale (of ``scale_aval``): the known body passes it on
    as its last residual, and the linear body multiplies its outputs by it (linear still)."""
    kb, ub = known_body, unknown_body
    k_in = C.in_avals_of(kb)

    def known(*a):
        return [*C.eval_closed(kb, *a[:num_kc], *a[num_kc + 1:]), a[num_kc]]

    def linear(*a):
        return poison(a[num_res], C.eval_closed(ub, *a[:num_res], *a[num_res + 1:]))

    u_in = C.in_avals_of(ub)
    return (trace_flat(known, [*k_in[:num_kc], scale_aval, *k_in[num_kc:]]),
            trace_flat(linear, [*u_in[:num_res], scale_aval, *u_in[num_res:]]))


def partial_eval(loop: Any, trace: Any, tracers: Sequence[Any], carry_uk: Sequence[bool], cond: Any,
                 known_body: Any, unknown_body: Any, res_avals: Sequence[Any]) -> list:
    """Split a ``checkpoints=k`` loop: an online-snapshotting primal loop (known) and
    a :data:`checkpointed_linear_p` eqn (unknown).

    ``carry_uk`` says which carries are unknown, ``cond`` is the known part of the
    condition and ``known_body`` / ``unknown_body`` / ``res_avals`` are the body's
    partial evaluation for those unknowns. Returns the loop's output tracers. Effects that must
    not run again are refused (:func:`check_replay`).
    """
    check_replay(loop)
    k = loop.checkpoints
    _, consts, carry, _ = loop.split(tracers)
    consts_uk = [not C.is_known_pval(t) for t in consts]
    kc = [C.known_value(t) for t, u in zip(consts, consts_uk) if not u]
    kt = [C.known_value(t) for t, u in zip(carry, carry_uk) if not u]
    lin_consts = [t for t, u in zip(consts, consts_uk) if u]
    lin_carry = [t for t, u in zip(carry, carry_uk) if u]
    bound = loop.max_steps  # max_steps with checkpoints, no nested scans (jaxaot._src.loops.offline)
    block = online_block(C.join_effects(C.effects_of(known_body), C.effects_of(cond)))
    # The overflow scale, a known const found after the forward: it reads the condition, so inside shard_map it
    # varies as the condition does (a condition on the local shard), and the bodies are traced for that type.
    scale_aval = C.out_avals_of(cond)[0].update(dtype=jnp.dtype(jnp.float32), weak_type=False)
    if bound is not None:
        known_body, unknown_body = _scaled(known_body, unknown_body, len(kc), len(res_avals), scale_aval)
    params = dict(known_body=known_body, linear_body=unknown_body, checkpoints=k, block=block, max_steps=bound,
                  num_known_consts=len(kc) + (bound is not None), num_linear_consts=len(lin_consts))
    fkc = [*kc, C.vary_like(jnp.ones((), jnp.float32), scale_aval)] if bound is not None else kc  # any scale
    primal_body = _primal_body(params)  # the program the transpose advances with, too

    def fcond(state):
        go = C.eval_closed(cond, *kc, *state[0])[0]
        return go if bound is None else go & (state[1] < bound)

    def forward(state, decide, limit):
        """The forward loop from ``state`` while the loop runs and the step is below ``limit``."""
        def running(state):
            return fcond(state) if limit is None else fcond(state) & (state[1] < limit)

        def advance(x):
            return C.eval_closed(primal_body, *fkc, *x)

        if block > 1:
            return blocked.forward(running, decide, advance, state, block, k)

        def fbody(state, _):
            # Store the state *before* the step: the state after the last step is never needed.
            x, i, levels, snaps = state
            slot, new_levels = decide(i, levels)
            snaps = [write_row(s, slot, a) for s, a in zip(snaps, x)]
            return advance(x), i + 1, new_levels, snaps

        return blocked.blocks(running, fbody, state, 1, k)

    snaps0 = [C.vary_like(jnp.zeros((k + 1, *jnp.shape(x)), jnp.result_type(x)), jax.typeof(x))  # + scratch slot
              for x in kt]
    # The placement's decisions depend on the step alone: read from a table made at trace time for
    # the bound, or, without one, for the first online_table_steps(k) steps, and decided online
    # (revolve.place, O(k) work per step) past them.
    state = (kt, jnp.zeros((), jnp.int32), None, snaps0)
    if bound is not None or k <= TABLE_CHECKPOINTS:
        levels0, decide, finish = schedule_tables.recorder(bound or online_table_steps(k), k)
        x, n, levels, snaps = forward(state[:2] + (levels0, snaps0), decide,
                                      None if bound is not None else online_table_steps(k))
        pos, slot_of, top = finish(levels)
        state = (x, n, (pos, slot_of, top + 1), snaps)
    if bound is None:  # past the table (usually not one step), or k above TABLE_CHECKPOINTS: online
        levels0, decide, finish = _placer(k, fcond(state))
        x, n, levels, snaps = forward(state[:2] + (state[2] or levels0, state[3]), decide, None)
        pos, slot_of, top = finish(levels)
    if bound is not None:  # stopped at the bound while the loop still ran: NaN values and tangents
        overflowed = (n >= bound) & C.eval_closed(cond, *kc, *x)[0]
        check_overflow(overflowed, bound)
        scale = C.vary_like(overflow_scale(overflowed), scale_aval)
        x = poison(scale, x)
        kc = [*kc, scale]

    out_avals = C.out_avals_of(unknown_body)
    effs = C.join_effects(C.effects_of(known_body), C.effects_of(unknown_body))
    lin_out = C.stage_unknown_eqn(trace, checkpointed_linear_p,
                                  [n, pos, slot_of, top, *snaps, *kc, *lin_consts, *lin_carry], out_avals, params, effs)
    return C.merge_lists(carry_uk, list(x), lin_out)


# --------------------------------------------------------------------------- registration
checkpointed_linear_p.def_effectful_abstract_eval(_linear_abstract_eval)
C.register_lowering(checkpointed_linear_p, C.lower_fun(_linear_impl, multiple_results=True))
C.primitive_jvps[checkpointed_linear_p] = _linear_jvp
C.primitive_transposes[checkpointed_linear_p] = _linear_transpose
C.fancy_primitive_batchers[checkpointed_linear_p] = _linear_batch
