"""Binomial (revolve) checkpointing for ``while_loop(..., checkpoints=k)``.

Reverse mode of a loop of n steps needs every step's state, in reverse order.
Storing only k of them and recomputing the rest costs at least
``t(n, k) = r*n - C(k + r, r - 1)`` forward steps (Griewank & Walther's revolve;
``r`` is the smallest integer with ``C(k + r, k) >= n``), the first sweep included.

The forward does not know n, so it places snapshots *online*: while the trip
count so far lies in ``(C(k+r-1, k), C(k+r, k)]`` it keeps the snapshots that the
optimal first sweep for ``n = C(k+r, k)`` keeps, starting afresh (dropping all
but the initial state) when the count enters the next range. The backward knows
n and the stored positions, and reverses each segment with the optimal offline
schedule for the snapshot slots still free (:func:`split`). For n near the top
of a range this is within a few steps of the optimum (n=1000, k=10: 3640 forward
steps against 3636); just past a range boundary the forward's snapshots are
poorly placed and it costs up to about 1.5x the optimum.

:func:`revolve_counts` runs the same schedule in pure Python and returns the
counts, for tests and the benchmark.

Example:
    >>> from jaxaot.checkpointing import revolve_counts
    >>> c = revolve_counts(1000, 10)
    >>> c.optimum, c.forward, c.vjps
    (3636, 3640, 1000)
"""

from __future__ import annotations

import dataclasses
import functools
from math import comb
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxaot import _compat as C
from jaxaot import primitives as P

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


def first_sweep(n_hat: int, k: int) -> list[int]:
    """Snapshot positions of the optimal first sweep for ``n_hat`` steps (0 included)."""
    out, start, slots, length = [0], 0, k, n_hat
    while slots > 1 and length > 1:
        m = split(length, slots)
        start += m
        out.append(start)
        length -= m
        slots -= 1
    return out


@functools.lru_cache(maxsize=None)
def placement_table(k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ends, table)``: range r covers trip counts ``(ends[r-1], ends[r]]`` and
    ``table[r, j]`` is the position slot j holds during range r (-1: none)."""
    ends, rows, r = [], [], 0
    while True:
        end = beta(k, r)
        pos = first_sweep(min(end, _INT32_MAX), k)
        rows.append(pos + [-1] * (k - len(pos)))
        ends.append(min(end, _INT32_MAX))
        if end >= _INT32_MAX or r >= _MAX_REPS:
            break
        r += 1
    return np.asarray(ends, np.int64).clip(max=_INT32_MAX).astype(np.int32), np.asarray(rows, np.int32)


@functools.lru_cache(maxsize=None)
def beta_table(k: int) -> np.ndarray:
    """``beta(s, r)`` for ``s <= k``, ``r <= _MAX_REPS``, clipped to int32."""
    return np.asarray([[min(beta(s, r), _INT32_MAX) for r in range(_MAX_REPS + 1)] for s in range(k + 1)],
                      np.int64).astype(np.int32)


def online_slot(i: int, k: int) -> int | None:
    """The slot the forward writes the state after step ``i`` to, or None."""
    ends, table = placement_table(k)
    r = min(int(np.searchsorted(ends, i + 1)), len(ends) - 1)
    hits = np.nonzero(table[r] == i)[0]
    return int(hits[0]) if hits.size and i > 0 else None


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


def snapshots_after_forward(n: int, k: int) -> list[int]:
    """Positions held per slot once the online forward has run n steps (-1: empty)."""
    pos = [0] + [-1] * (k - 1)
    for i in range(1, n):
        slot = online_slot(i, k)
        if slot is not None:
            if slot == 1:
                pos[2:] = [-1] * (k - 2)
            pos[slot] = i
    return pos


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


def _online_update(i, pos, k: int):
    """``(slot to write, new positions)`` after step ``i`` (slot k: a scratch slot)."""
    ends, table = placement_table(k)
    r = jnp.minimum(_searchsorted(ends, i + 1), len(ends) - 1)
    row = _table_row(table, r)
    hit = (row == i) & (i > 0)
    slot = jnp.where(jnp.any(hit), jnp.argmax(hit), k).astype(jnp.int32)
    slots = jnp.arange(k)
    pos = jnp.where((slot == 1) & (slots >= 2), -1, pos)  # a new range: start afresh
    pos = jnp.where(slots == slot, i, pos)
    return slot, pos


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

Operands: ``num_steps, positions, *snapshots, *known consts, *linear consts,
*linear carry``. Params: ``known_body`` ``(known consts, primal carry) ->
(primal carry, residuals)``, ``linear_body`` ``(residuals, linear consts, linear
carry) -> linear carry``, ``checkpoints``, ``num_known_consts``,
``num_linear_consts``. Its transpose is the revolve backward."""


def _linear_split(args: Sequence[Any], params: dict):
    n, pos, rest = args[0], args[1], list(args[2:])
    n_snap = len(C.out_avals_of(params["known_body"])) - _num_res(params)
    snaps, rest = rest[:n_snap], rest[n_snap:]
    kc, rest = rest[: params["num_known_consts"]], rest[params["num_known_consts"]:]
    lc, lt = rest[: params["num_linear_consts"]], rest[params["num_linear_consts"]:]
    return n, pos, snaps, kc, lc, lt


def _num_res(params: dict) -> int:
    lin_in = len(C.in_avals_of(params["linear_body"]))
    n_lin_carry = len(C.out_avals_of(params["linear_body"]))
    return lin_in - params["num_linear_consts"] - n_lin_carry


def _step(params: dict, kc, x):
    outs = P._eval(params["known_body"], *kc, *x)
    nres = _num_res(params)
    return outs[: len(outs) - nres], outs[len(outs) - nres:]


def _linear_impl(*args, **params):
    n, pos, snaps, kc, lc, lt = _linear_split(args, params)

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
    from jaxaot.while_loop import while_loop

    n, pos, snaps, kc, lc, lt = _linear_split(args, params)
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
        slot = jnp.where(push, top + 1, k)
        buf = [_write(b, slot, a) for b, a in zip(buf, x)]
        pos = jnp.where(push & (jnp.arange(k) == top + 1), cur, pos)
        return x, cur, top + push.astype(jnp.int32), pos, buf

    def outer(state):
        fine, top, pos, buf, ct, acc = state
        x = [_read(b, top) for b in buf]
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
    n_plain = 2 + len(snaps) + len(kc)
    return [None] * n_plain + list(acc) + list(ct)


C.primitive_transposes[checkpointed_linear_p] = _linear_transpose
checkpointed_linear_p._jaxaot_has_rules = True


# --------------------------------------------------------------------------- partial eval (from primitives)
def partial_eval(loop: Any, trace: Any, tracers: Sequence[Any], carry_uk, known_body, unknown_body, res_avals):
    """Split a ``checkpoints=k`` loop: an online-snapshotting primal loop (known) and
    a :data:`checkpointed_linear_p` eqn (unknown)."""
    from jaxaot.while_loop import while_loop

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
        x, i, pos, snaps = state
        slot, pos = _online_update(i, pos, k)
        snaps = [_write(s, slot, a) for s, a in zip(snaps, x)]
        return P._eval(primal_body, *kc, *x), i + 1, pos, snaps

    snaps0 = [jnp.zeros((k + 1, *jnp.shape(x)), jnp.result_type(x)).at[0].set(x) for x in kt]
    pos0 = jnp.full((k,), -1, jnp.int32).at[0].set(0)
    x, n, pos, snaps = while_loop(lambda s: P._eval(cond, *kc, *s[0])[0], fbody,
                                  (kt, jnp.zeros((), jnp.int32), pos0, snaps0), checkpoints=k)
    snaps = [s[:k] for s in snaps]

    lin_consts = [t for t, u in zip(consts, consts_uk) if u]
    lin_carry = [t for t, u in zip(carry, carry_uk) if u]
    params = dict(known_body=known_body, linear_body=unknown_body, checkpoints=k,
                  num_known_consts=len(kc), num_linear_consts=len(lin_consts))
    out_avals = C.out_avals_of(unknown_body)
    effs = C.join_effects(C.effects_of(known_body), C.effects_of(unknown_body))
    lin_out = C.stage_unknown_eqn(trace, checkpointed_linear_p, [n, pos, *snaps, *kc, *lin_consts, *lin_carry],
                                  out_avals, params, effs)
    return P._merge(carry_uk, lin_out, list(x))
