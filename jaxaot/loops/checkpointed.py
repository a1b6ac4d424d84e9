"""Binomial (revolve) checkpointing for ``while_loop(..., checkpoints=k)``.

Reverse mode of a loop of n steps needs every step's state, in reverse order.
Storing only k of them and recomputing the rest costs at least
``t(n, k) = r*n - C(k + r, r - 1)`` forward steps (Griewank & Walther's revolve;
``r`` is the smallest integer with ``C(k + r, k) >= n``), the first sweep included.

The forward does not know n, so it places snapshots *online* (:func:`_place`):
at every step it keeps, drops or replaces a snapshot, whichever would be cheapest
if the loop stopped right there, scoring a placement by the exact cost of the
backward that follows it. The backward knows n and the stored positions, and
reverses each segment with the optimal offline schedule for the snapshot slots
still free (:func:`split`). A decision is one batched binary search of a
constant table (a dozen one-element gathers per lane), moves no snapshot, and
writes one carry (a skipped state goes to a scratch slot).

Measured with :func:`revolve_counts` (``forward / optimum``): at most 1.092 for
every n >= 100 (every k in 2..40 up to n = 5,000; k = 2, 5, 10, 40 up to
n = 200,000), at most 1.05 for n >= 1000, and 1.01 on average; n=2000, k=40 costs 5101 steps against 5097. Below n = 100 the optimum is
a few dozen steps and integer effects dominate: no online schedule can stay within
10% there (for k = 2 every one exceeds 1.15x somewhere in n = 20..40, see
``tests/test_checkpointing.py``).

:func:`revolve_counts` runs the same schedule in NumPy and returns the counts, for
tests and the benchmark.

Example:
    >>> from jaxaot.checkpointing import revolve_counts
    >>> c = revolve_counts(1000, 10)
    >>> c.optimum, c.forward, c.vjps
    (3636, 3744, 1000)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from math import comb
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot import _compat as C
from jaxaot.loops import rules as P

_INT32_MAX = np.iinfo(np.int32).max
_MAX_REPS = 1024  # repetition numbers tabulated for split(); beyond, splits are still valid


# --------------------------------------------------------------------------- the schedule, in Python
def beta(s: int, r: int) -> int:
    """``C(s + r, s)``: the most steps s snapshots reverse with r repetitions."""
    return comb(s + r, s) if s >= 0 and r >= 0 else 0


def repetitions(n: int, k: int) -> int:
    """The smallest r with ``beta(k, r) >= n``."""
    r = 0
    while beta(k, r) < n:
        r += 1
    return r


def revolve_optimum(n: int, k: int) -> int:
    """Fewest forward steps (VJPs not counted) to reverse n steps with k snapshots."""
    if n <= 1:
        return 0
    r = repetitions(n, k)
    return r * n - beta(k + 1, r - 1)


def split(length: int, slots: int) -> int:
    """Where the optimal schedule stores its next snapshot when reversing ``length``
    steps from a stored state with ``slots`` snapshot slots (that one included)."""
    r = repetitions(length, slots)
    return min(max(beta(slots, r - 2), length - beta(slots - 1, r), 1), length - 1)


@functools.lru_cache(maxsize=None)
def beta_table(k: int) -> np.ndarray:
    """``beta(s, r)`` for ``s <= k``, ``r <= _MAX_REPS``, clipped to int32."""
    return np.asarray([[min(beta(s, r), _INT32_MAX) for r in range(_MAX_REPS + 1)] for s in range(k + 1)],
                      np.int64).astype(np.int32)


# The online placement below runs twice: in JAX inside the forward loop, and in NumPy
# for revolve_counts() and the tests. Both run the same code on an array module
# ``xp`` with integer arithmetic, so they take the same decision at every step.
def _cost_cap(k: int) -> int:
    """Costs saturate here, so a sum of k+1 of them still fits in int32."""
    return _INT32_MAX // (k + 2)


def _segment_cost(xp, length, slots: np.ndarray, k: int):
    """``revolve_optimum(length, slots)`` per lane, saturated at :func:`_cost_cap`.

    ``slots`` is static (one value per lane). ``r`` (the repetition number) is a
    binary search of the lane's row of :func:`beta_table`, then ``t = r*L -
    beta(s+1, r-1)``: about a dozen gathers of one element per lane. Lengths beyond
    ``beta(s, _MAX_REPS)``, and products that would overflow int32, saturate (an
    overflowing product means ``t`` is above the cap anyway).
    """
    table = beta_table(k + 1)
    width = table.shape[1]
    flat = table.reshape(-1) if xp is np else jnp.asarray(table.reshape(-1))
    row = np.clip(slots, 1, k) * width
    r = xp.zeros_like(length)  # how many entries of the row are below length
    step = 1 << (width - 1).bit_length()
    while step:
        cand = r + step
        below = xp.take(flat, row + xp.minimum(cand, width) - 1) < length
        r = xp.where((cand <= width) & below, cand, r)
        step >>= 1
    t = r * length - xp.take(flat, row + width + xp.clip(r - 1, 0, width - 1))
    fits = (r < width) & (length <= _INT32_MAX // xp.maximum(r, 1))
    cap = _cost_cap(k)
    return xp.where(r == 0, 0, xp.where(fits, xp.minimum(t, cap), cap))


def _place(xp, i, pos, slot_of, m, k: int):
    """One online decision, at the state before step ``i`` (so the loop runs >= i+1 steps).

    The snapshots are levels ``0..m-1`` at positions ``pos`` (ascending, level 0 the
    initial state); level ``a`` reverses its segment with ``k - a`` slots, so the
    backward costs ``n + sum_a t(len_a, k - a)`` forward steps. The choices are:
    keep the state (append it as level m, if a slot is free), drop level ``j`` and
    append the state (later levels move down one and gain a slot), or skip it. Take
    the one that is cheapest if the loop stopped right after this step. This greedy,
    myopic rule stays within 10% of the offline optimum for every n >= 100 we
    checked (see the module docstring), and within 2.5% for large n.

    ``slot_of[a]`` is the buffer slot holding level ``a`` (slots ``m..k-1`` free),
    so a decision writes one slot and never moves snapshots. Returns ``(slot,
    pos, slot_of, m)``, slot ``k`` meaning the scratch slot (not stored).
    """
    a = np.arange(k)
    nxt = xp.where(a + 1 < m, xp.roll(pos, -1), i)
    prev = xp.roll(pos, 1)
    valid = a < m
    # Four costs per level, in one batch of 4k lanes: its segment with the state
    # appended; the same after a level below is dropped (one more slot); the last
    # segment when the state is skipped (one step longer); level a dropped, its
    # segment joined to the one below.
    lengths = xp.concatenate([nxt - pos, nxt - pos, nxt - pos + 1, nxt - prev])
    slots = np.concatenate([k - a, k - a + 1, k - a, k - a + 1])
    costs = xp.where(xp.concatenate([valid] * 4), _segment_cost(xp, lengths, slots, k), 0)
    own, shifted, longer, merged = (costs[q * k:(q + 1) * k] for q in range(4))
    before = xp.cumsum(own) - own
    after = xp.sum(shifted) - xp.cumsum(shifted)
    big = _INT32_MAX
    skip = before[m - 1] + longer[m - 1]
    append = xp.where(m < k, xp.sum(own), big)
    drop = xp.where((a >= 1) & valid, xp.roll(before, 1) + merged + after, big)[1:]
    choice = xp.argmin(xp.concatenate([xp.stack([skip, append]), drop]))
    j = choice - 1  # the dropped level, when choice >= 2
    freed = slot_of[xp.clip(j, 0, k - 1)]
    new_pos = xp.where(a < j, pos, xp.where(a < m - 1, xp.roll(pos, -1), xp.where(a == m - 1, i, -1)))
    new_slot = xp.where((a < j) | (a >= m), slot_of, xp.where(a < m - 1, xp.roll(slot_of, -1), freed))
    is_drop, is_append = choice >= 2, choice == 1
    slot = xp.where(is_drop, freed, xp.where(is_append, slot_of[xp.minimum(m, k - 1)], k))
    pos = xp.where(is_drop, new_pos, xp.where(is_append & (a == m), i, pos))
    slot_of = xp.where(is_drop, new_slot, slot_of)
    return slot, pos, slot_of, m + is_append


def online_placement(k: int):
    """Yield ``(n, positions)`` for n = 1, 2, ...: the snapshots the forward holds
    when the loop stops after n steps (ascending, level 0 first).

    Example:
        >>> from itertools import islice
        >>> [p for _, p in islice(online_placement(3), 5)]
        [[0], [0, 1], [0, 1, 2], [0, 1, 2], [0, 2, 4]]
    """
    pos, slot_of, m, i = np.full(k, -1, np.int64), np.arange(k), 1, 0
    pos[0] = 0
    while True:
        if i:
            _, pos, slot_of, m = _place(np, i, pos, slot_of, m, k)
        i += 1
        yield i, [int(p) for p in pos[:m]]


def worst_ratio(k: int, *, first: int = 100, last: int = 3000) -> tuple[float, int]:
    """``(forward steps / optimum, n)`` at the worst trip count n in ``first..last``.

    Example:
        >>> ratio, n = worst_ratio(10, last=400)
        >>> ratio <= 1.10
        True
    """
    return max((placement_cost(n, k, held) / revolve_optimum(n, k), n)
               for n, held in itertools.islice(online_placement(k), last) if n >= first)


def snapshots_after_forward(n: int, k: int) -> list[int]:
    """Positions held per level once the online forward has run n steps (-1: empty)."""
    for steps, held in online_placement(k):
        if steps >= n:
            return held + [-1] * (k - len(held))
    raise AssertionError("unreachable")


def placement_cost(n: int, k: int, pos: Sequence[int]) -> int:
    """Forward steps to reverse n steps from the snapshots ``pos``: the n of the
    forward pass plus ``sum_a t(len_a, k - a)`` (:func:`backward_advances` runs it)."""
    held = [p for p in pos if p >= 0] + [n]
    return n + sum(revolve_optimum(held[a + 1] - held[a], k - a) for a in range(len(held) - 1))


def backward_advances(n: int, k: int, pos: Sequence[int]) -> int:
    """Forward steps the backward recomputes, from the snapshots ``pos``."""
    pos = list(pos)
    top = max(j for j in range(k) if pos[j] >= 0)
    fine, advances = n, 0
    while fine > 0:
        cur = pos[top]
        while cur < fine - 1:
            slots = k - top
            target = pos[top] + split(fine - pos[top], slots) if slots > 1 else -1
            cur += 1
            advances += 1
            if cur == target:
                top += 1
                pos[top] = cur
        fine -= 1
        if pos[top] == fine:
            pos[top] = -1
            top -= 1
    return advances


@dataclasses.dataclass(frozen=True)
class RevolveCounts:
    """Body evaluations for reversing ``n`` steps with ``k`` snapshots.

    ``forward`` counts forward steps: the n of the forward pass plus the backward's
    recomputation; ``vjps`` the n body VJPs (each also runs the body once more);
    ``optimum`` the revolve optimum ``t(n, k)`` (which counts its first sweep as n-1).
    """

    n: int
    k: int
    forward: int
    vjps: int
    optimum: int

    @property
    def ratio(self) -> float:
        return self.forward / max(self.optimum, 1)


def revolve_counts(n: int, k: int) -> RevolveCounts:
    """Count the forward steps of ``checkpoints=k`` on a loop of ``n`` iterations."""
    advances = backward_advances(n, k, snapshots_after_forward(n, k)) if n else 0
    return RevolveCounts(n=n, k=k, forward=n + advances, vjps=n, optimum=revolve_optimum(n, k))


# --------------------------------------------------------------------------- the schedule, in JAX
def _searchsorted(table, value):
    """``jnp.searchsorted(table, value)`` (side left) as one compare-and-count.

    jnp.searchsorted's default method is a ``lax.scan`` of log2(len) bisection
    steps: a nested while loop in every loop step (a dozen tiny kernels and a loop
    on a GPU, and a select-driven loop XLA tries to analyse); the tables here have
    at most ``_MAX_REPS + 1`` entries, so counting the entries below ``value`` is
    one fused reduction.
    """
    return jnp.sum(jnp.asarray(table) < value, dtype=jnp.int32)


def _split_jax(length, slots, k: int):
    table = beta_table(k)
    row = _table_row(table, jnp.clip(slots, 0, k))
    r = jnp.minimum(_searchsorted(row, length), _MAX_REPS)
    b_s = _read(row, jnp.maximum(r - 2, 0)) * (r >= 2)
    b_s1 = _read(_table_row(table, jnp.clip(slots - 1, 0, k)), r)
    return jnp.clip(jnp.maximum(b_s, length - b_s1), 1, length - 1)


def _write(buf, slot, x):
    return jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), slot, 0, allow_negative_indices=False)


def _read(buf, slot):
    return jax.lax.dynamic_index_in_dim(buf, slot, keepdims=False, allow_negative_indices=False)


def _table_row(table: np.ndarray, r):
    """``table[r]`` for a constant table: a one-hot masked sum, so no dynamic slice of a
    constant whose offset XLA might try to evaluate at compile time."""
    hit = np.arange(table.shape[0])[:, None] == r
    return jnp.sum(jnp.where(hit, jnp.asarray(table), 0), axis=0, dtype=table.dtype)


# --------------------------------------------------------------------------- the linear primitive
checkpointed_linear_p = C.new_loop_primitive("checkpointed_linear_loop")
"""The tangent map of a checkpointed loop: ``num_steps`` applications of the
linearized body, each recomputing its residuals from the replayed primal state.

Operands: ``num_steps, positions, slot_of, *snapshots, *known consts, *linear
consts, *linear carry`` (level ``a``'s snapshot is in slot ``slot_of[a]``).
Params: ``known_body`` ``(known consts, primal carry) -> (primal carry,
residuals)``, ``linear_body`` ``(residuals, linear consts, linear carry) ->
linear carry``, ``checkpoints``, ``num_known_consts``, ``num_linear_consts``.
Its transpose is the revolve backward."""


def _linear_split(args: Sequence[Any], params: dict):
    n, pos, slot_of, rest = args[0], args[1], args[2], list(args[3:])
    n_snap = len(C.out_avals_of(params["known_body"])) - _num_res(params)
    snaps, rest = rest[:n_snap], rest[n_snap:]
    kc, rest = rest[: params["num_known_consts"]], rest[params["num_known_consts"]:]
    lc, lt = rest[: params["num_linear_consts"]], rest[params["num_linear_consts"]:]
    return n, pos, slot_of, snaps, kc, lc, lt


def _num_res(params: dict) -> int:
    lin_in = len(C.in_avals_of(params["linear_body"]))
    n_lin_carry = len(C.out_avals_of(params["linear_body"]))
    return lin_in - params["num_linear_consts"] - n_lin_carry


def _step(params: dict, kc, x):
    outs = P._eval(params["known_body"], *kc, *x)
    nres = _num_res(params)
    return outs[: len(outs) - nres], outs[len(outs) - nres:]


def _linear_impl(*args, **params):
    n, _, _, snaps, kc, lc, lt = _linear_split(args, params)

    def body(state):
        i, x, t = state
        x2, res = _step(params, kc, x)
        t2 = P._eval(params["linear_body"], *res, *lc, *t)
        return i + 1, [P._strong(a) for a in x2], [P._strong(a) for a in t2]

    x0 = [P._strong(_read(s, 0)) for s in snaps]
    _, _, t = jax.lax.while_loop(lambda s: s[0] < n, body, (jnp.zeros((), jnp.int32), x0, [P._strong(a) for a in lt]))
    return list(t)


def _linear_abstract_eval(*avals, **params):
    return C.out_avals_of(params["linear_body"]), C.join_effects(
        C.effects_of(params["known_body"]), C.effects_of(params["linear_body"]))


checkpointed_linear_p.def_effectful_abstract_eval(_linear_abstract_eval)
C.register_lowering(checkpointed_linear_p, C.lower_fun(_linear_impl, multiple_results=True))


def _vjp_step(params: dict, kc, x, lc_avals, ct):
    """Cotangents ``(linear consts, linear carry)`` of one step at primal state ``x``."""
    _, res = _step(params, kc, x)
    lt_avals = C.out_avals_of(params["linear_body"])
    primals = [*res, *[C.UndefinedPrimal(a) for a in lc_avals], *[C.UndefinedPrimal(a) for a in lt_avals]]
    cts = C.backward_pass_closed(params["linear_body"], primals, ct)
    nres = len(res)
    ct_lc = [C.instantiate_zeros(g) for g in cts[nres: nres + len(lc_avals)]]
    ct_lt = [C.instantiate_zeros(g) for g in cts[nres + len(lc_avals):]]
    return ct_lc, ct_lt


def _linear_transpose(cts, *args, **params):
    from jaxaot.loops.api import while_loop

    n, pos, slot_of, snaps, kc, lc, lt = _linear_split(args, params)
    k = params["checkpoints"]
    lc_avals = [a.aval for a in lc]
    ct = [C.instantiate_zeros(c) for c in cts]
    acc = [jnp.zeros(a.shape, a.dtype) for a in lc_avals]
    top = jnp.sum(pos >= 0).astype(jnp.int32) - 1
    buf = [jnp.concatenate([s, jnp.zeros((1, *s.shape[1:]), s.dtype)]) for s in snaps]  # + scratch slot

    def advance(state, fine):
        x, cur, top, pos, buf = state
        slots = k - top
        p_top = _read(pos, top)
        target = jnp.where(slots > 1, p_top + _split_jax(fine - p_top, slots, k), -1)
        x = [P._strong(a) for a in _step(params, kc, x)[0]]
        cur = cur + 1
        push = cur == target
        slot = jnp.where(push, _read(slot_of, jnp.minimum(top + 1, k - 1)), k)
        buf = [_write(b, slot, a) for b, a in zip(buf, x)]
        pos = jnp.where(push & (jnp.arange(k) == top + 1), cur, pos)
        return x, cur, top + push.astype(jnp.int32), pos, buf

    def outer(state):
        fine, top, pos, buf, ct, acc = state
        x = [_read(b, _read(slot_of, top)) for b in buf]
        x, _, top, pos, buf = while_loop(lambda s: s[1] < fine - 1, lambda s: advance(s, fine),
                                         (x, _read(pos, top), top, pos, buf), checkpoints=k)
        ct_lc, ct = _vjp_step(params, kc, x, lc_avals, ct)
        acc = [a + g for a, g in zip(acc, ct_lc)]
        fine = fine - 1
        pop = _read(pos, top) == fine
        pos = jnp.where(pop & (jnp.arange(k) == top), -1, pos)
        return fine, top - pop.astype(jnp.int32), pos, buf, ct, acc

    state = (jnp.asarray(n, jnp.int32), top, pos, buf, ct, acc)
    _, _, _, _, ct, acc = while_loop(lambda s: s[0] > 0, outer, state, checkpoints=k)
    n_plain = 3 + len(snaps) + len(kc)
    return [None] * n_plain + list(acc) + list(ct)


C.primitive_transposes[checkpointed_linear_p] = _linear_transpose


def _linear_jvp(primals, tangents, **params):
    """Linear in (linear consts, linear carry): their tangents go through the same
    map, which stays transposable. Tangents of the replayed primal inputs (forward
    mode over a linearization) take the plain loop's JVP instead."""
    n, pos, slot_of, snaps, kc, lc, lt = _linear_split(primals, params)
    _, _, _, d_snaps, d_kc, d_lc, d_lt = _linear_split(tangents, params)
    if all(P._is_zero(t) for t in (*d_snaps, *d_kc)):
        d_lin = [C.instantiate_zeros(t) for t in (*d_lc, *d_lt)]
        return (checkpointed_linear_p.bind(*primals, **params),
                checkpointed_linear_p.bind(n, pos, slot_of, *snaps, *kc, *d_lin, **params))
    tangents = [C.instantiate_zeros(t) if not P._is_zero(t) or C.is_inexact(jnp.result_type(x))
                else C.zeros_float0(jnp.shape(x)) for x, t in zip(primals, tangents)]
    out, d_out = jax.jvp(functools.partial(_linear_impl, **params), tuple(primals), tuple(tangents))
    return list(out), list(d_out)


def _linear_batch(args, dims, **params):
    """vmap over linear consts / carry (``jax.vmap`` of a linearized function) keeps
    the primitive, with a vmapped linear body; lanes that replay different primal
    states run the plain loop under vmap (correct, but not transposable)."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    n, pos, slot_of, snaps, kc, lc, lt = _linear_split(args, params)
    dn, dp, ds, d_snaps, d_kc, d_lc, d_lt = _linear_split(dims, params)
    if any(d is not None for d in (dn, dp, ds, *d_snaps, *d_kc)):
        out = jax.vmap(functools.partial(_linear_impl, **params), in_axes=tuple(dims))(*args)
        return list(out), [0] * len(out)
    lc = [P._moveaxis(c, d, 0) if d is not None else c for c, d in zip(lc, d_lc)]
    lt = [P._moveaxis(t, d, 0) if d is not None else P._bcast(t, size) for t, d in zip(lt, d_lt)]
    nres = _num_res(params)
    in_axes = [None] * nres + [0 if d is not None else None for d in d_lc] + [0] * len(lt)
    vlin = jax.vmap(functools.partial(P._eval, params["linear_body"]), in_axes=tuple(in_axes))
    res_avals = C.in_avals_of(params["linear_body"])[:nres]
    linear_body = P._trace(vlin, [*res_avals, *[jax.typeof(c) for c in lc], *[jax.typeof(t) for t in lt]])
    out = checkpointed_linear_p.bind(n, pos, slot_of, *snaps, *kc, *lc, *lt, **dict(params, linear_body=linear_body))
    return list(out), [0] * len(out)


C.primitive_jvps[checkpointed_linear_p] = _linear_jvp
C.primitive_batchers[checkpointed_linear_p] = _linear_batch
checkpointed_linear_p._jaxaot_has_rules = True


# --------------------------------------------------------------------------- partial eval (from primitives)
def partial_eval(loop: Any, trace: Any, tracers: Sequence[Any], carry_uk, known_body, unknown_body, res_avals):
    """Split a ``checkpoints=k`` loop: an online-snapshotting primal loop (known) and
    a :data:`checkpointed_linear_p` eqn (unknown)."""
    from jaxaot.loops.api import while_loop

    k = loop.checkpoints
    _, consts, carry, _ = loop.split(tracers)
    consts_uk = [not C.is_known_pval(t) for t in consts]
    kc = [C.known_value(t) for t, u in zip(consts, consts_uk) if not u]
    kt = [C.known_value(t) for t, u in zip(carry, carry_uk) if not u]
    cond = P._known_cond(loop, consts_uk, carry_uk)
    n_known_out = len(C.out_avals_of(known_body)) - len(res_avals)
    primal_body, _ = C.dce_closed(known_body, [True] * n_known_out + [False] * len(res_avals), True)

    def fbody(state):
        # Store the state *before* the step: the state after the last step is never needed.
        x, i, (pos, slot_of, m), snaps = state
        slot, pos, slot_of, m = _place(jnp, i, pos, slot_of, m, k)
        snaps = [_write(s, slot, a) for s, a in zip(snaps, x)]
        return P._eval(primal_body, *kc, *x), i + 1, (pos, slot_of, m), snaps

    snaps0 = [jnp.zeros((k + 1, *jnp.shape(x)), jnp.result_type(x)).at[0].set(x) for x in kt]
    levels0 = (jnp.full((k,), -1, jnp.int32).at[0].set(0), jnp.arange(k, dtype=jnp.int32), jnp.ones((), jnp.int32))
    x, n, (pos, slot_of, _), snaps = while_loop(lambda s: P._eval(cond, *kc, *s[0])[0], fbody,
                                                (kt, jnp.zeros((), jnp.int32), levels0, snaps0), checkpoints=k)
    snaps = [s[:k] for s in snaps]

    lin_consts = [t for t, u in zip(consts, consts_uk) if u]
    lin_carry = [t for t, u in zip(carry, carry_uk) if u]
    params = dict(known_body=known_body, linear_body=unknown_body, checkpoints=k,
                  num_known_consts=len(kc), num_linear_consts=len(lin_consts))
    out_avals = C.out_avals_of(unknown_body)
    effs = C.join_effects(C.effects_of(known_body), C.effects_of(unknown_body))
    lin_out = C.stage_unknown_eqn(trace, checkpointed_linear_p, [n, pos, slot_of, *snaps, *kc, *lin_consts, *lin_carry],
                                  out_avals, params, effs)
    return P._merge(carry_uk, lin_out, list(x))
