"""Loop primitives whose trip count is only known at run time, with reverse-mode rules.

Three primitives share one set of rules (the loop's kind selects the details):

* ``while_loop_p``: ``lax.while_loop`` with two extra parameters that say how
  to reverse-differentiate it (``max_steps``, ``checkpoints``).
* ``while_loop_stack_output_p``: a cond-driven loop that also stacks a
  per-iteration output into arrays of ``max_steps`` rows and returns its trip
  count ``num_steps`` and whether it stopped only because the stack was full.
* ``counted_loop_p``: runs exactly ``num_steps`` (an operand) iterations, reading
  row ``i`` of stacked inputs and writing row ``i`` of stacked outputs, forwards
  or in reverse. It is what reverse mode produces: a scan whose length is a
  run-time value.

Operands are ``[num_steps] (counted only) + consts + carry + xs``; the body jaxpr
maps ``(consts, carry, xs rows) -> (carry, ys rows)`` and the cond jaxpr maps
``(consts, carry) -> bool[]``.

Note [while_loop autograd]
--------------------------
Forward mode (JVP) is a loop of the same kind over primal and tangent carries.
Reverse mode goes through partial evaluation of that JVP loop: the known
(primal) half becomes a *stacking loop* that runs the primal iterations and
stacks, for each, the residuals the tangent map needs (loop-invariant residuals
are hoisted out, as ``lax.scan`` does); the unknown half becomes a *linear*
``counted_loop`` that applies the tangent map ``num_steps`` times, reading the
stacked residuals. Transposing that counted loop gives a counted loop running
the iterations in reverse, accumulating the cotangents of the carries and of
the closed-over consts: the backward runs ``num_steps`` iterations, never the
stack capacity. A loop with zero iterations transposes to the identity on the
carries and zeros for the consts.

The stack needs a capacity. ``while_loop(max_steps=N)`` stacks N rows and the
forward reports overflow as a run-time error; ``checkpoints=k`` stores k carry
snapshots instead and replays segments in the backward (see
:mod:`jaxaot.checkpointing`); inside :func:`jaxaot.while_loop.dynamic_capacity`
the caller chooses the capacity and receives the trip counts.

Example:
    >>> import jax, jax.numpy as jnp, jaxaot
    >>> f = lambda x: jaxaot.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x), max_steps=8)[1]
    >>> float(jax.grad(f)(1.0))
    8.0
"""

from __future__ import annotations

import dataclasses
import os
import threading
from functools import partial
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot import _compat as C
from jaxaot.errors import LoopOverflowError, ReverseModeBoundError

while_loop_p = C.new_loop_primitive("while_loop")
while_loop_stack_output_p = C.new_loop_primitive("while_loop_stack_output")
counted_loop_p = C.new_loop_primitive("counted_loop")

_INT = np.int32


# --------------------------------------------------------------------------- small helpers
def _split(xs: Sequence[Any], sizes: Sequence[int]) -> list[list]:
    out, start = [], 0
    for n in sizes:
        out.append(list(xs[start:start + n]))
        start += n
    out.append(list(xs[start:]))
    return out


def _merge(mask: Sequence[bool], if_true: Sequence[Any], if_false: Sequence[Any]) -> list:
    t, f = iter(if_true), iter(if_false)
    out = [next(t) if m else next(f) for m in mask]
    assert next(t, None) is None and next(f, None) is None
    return out


def _pick(mask: Sequence[bool], xs: Sequence[Any], keep: bool = True) -> list:
    return [x for m, x in zip(mask, xs) if bool(m) == keep]


def _or(a: Sequence[bool], b: Sequence[bool]) -> list[bool]:
    return [x or y for x, y in zip(a, b)]


def _sds(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _trace(fn: Callable[..., Sequence[Any]], avals: Sequence[Any]) -> Any:
    """Trace ``fn(*flat) -> list`` on ``avals`` to a closed jaxpr without consts."""
    closed = jax.make_jaxpr(lambda *a: list(fn(*a)))(*[_sds(a) for a in avals])
    jaxpr, consts = C.hoist_consts(closed)
    if consts:  # constants captured while tracing (numpy arrays): keep them closed over
        jaxpr = closed
    return jaxpr


def _eval(closed: Any, *args: Any) -> list:
    return C.eval_closed(closed, *args)


def _stacked(aval: Any, length: int) -> Any:
    return C.ShapedArray((length, *aval.shape), aval.dtype, weak_type=aval.weak_type)


def _row(aval: Any) -> Any:
    return C.ShapedArray(aval.shape[1:], aval.dtype, weak_type=aval.weak_type)


def _tangent_aval(aval: Any) -> Any:
    return aval.to_tangent_aval()


def _zero(aval: Any) -> Any:
    return C.Zero(_tangent_aval(aval))


def _is_zero(t: Any) -> bool:
    return type(t) is C.Zero


def _strong(x: Any) -> Any:
    # lax.while_loop demands identical carry types; weak types only matter at the edges.
    return lax.convert_element_type(x, jnp.result_type(x))


# --------------------------------------------------------------------------- the loop description
@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop eqn's parameters, uniform over the three primitives."""

    prim: Any
    body: Any
    cond: Any
    num_consts: int
    num_carry: int
    length: int | None = None
    reverse: bool = False
    max_steps: int | None = None
    checkpoints: int | None = None

    @property
    def counted(self) -> bool:
        return self.prim is counted_loop_p

    @property
    def stacks(self) -> bool:
        return self.prim is while_loop_stack_output_p

    @property
    def num_xs(self) -> int:
        return len(C.in_avals_of(self.body)) - self.num_consts - self.num_carry

    @property
    def num_ys(self) -> int:
        return len(C.out_avals_of(self.body)) - self.num_carry

    @property
    def num_extra(self) -> int:
        return 2 if self.stacks else 0

    @property
    def carry_avals(self) -> list:
        return C.out_avals_of(self.body)[: self.num_carry]

    @property
    def y_row_avals(self) -> list:
        return C.out_avals_of(self.body)[self.num_carry:]

    @property
    def const_avals(self) -> list:
        return C.in_avals_of(self.body)[: self.num_consts]

    @property
    def x_row_avals(self) -> list:
        return C.in_avals_of(self.body)[self.num_consts + self.num_carry:]

    def split(self, args: Sequence[Any]) -> tuple[Any, list, list, list]:
        """``(num_steps or None, consts, carry, xs)`` of an operand list."""
        n, rest = (args[0], args[1:]) if self.counted else (None, args)
        consts, carry, xs = _split(rest, [self.num_consts, self.num_carry])
        return n, consts, carry, xs

    def join(self, n: Any, consts: Sequence, carry: Sequence, xs: Sequence) -> list:
        return ([n] if self.counted else []) + [*consts, *carry, *xs]

    def split_out(self, outs: Sequence[Any]) -> tuple[list, list, list]:
        carry, ys, extra = _split(outs, [self.num_carry, self.num_ys])
        return carry, ys, extra

    def out_avals(self) -> list:
        ys = [_stacked(a, self.length) for a in self.y_row_avals]
        extra = [C.ShapedArray((), _INT), C.ShapedArray((), np.bool_)] if self.stacks else []
        return [*self.carry_avals, *ys, *extra]

    def params(self) -> dict:
        if self.prim is while_loop_p:
            return dict(cond_jaxpr=self.cond, body_jaxpr=self.body, num_consts=self.num_consts,
                        max_steps=self.max_steps, checkpoints=self.checkpoints)
        if self.stacks:
            return dict(cond_jaxpr=self.cond, body_jaxpr=self.body, num_consts=self.num_consts,
                        num_carry=self.num_carry, max_steps=self.length)
        return dict(body_jaxpr=self.body, num_consts=self.num_consts, num_carry=self.num_carry,
                    length=self.length, reverse=self.reverse)

    def replace(self, **changes: Any) -> "Loop":
        return dataclasses.replace(self, **changes)

    def bind(self, args: Sequence[Any]) -> list:
        return list(self.prim.bind(*args, **self.params()))

    def effects(self) -> Any:
        effs = [C.effects_of(self.body)] + ([C.effects_of(self.cond)] if self.cond is not None else [])
        return C.join_effects(*effs)


def loop_of(prim: Any, params: dict) -> Loop:
    """The :class:`Loop` of an eqn of ``prim`` with ``params``."""
    body = params["body_jaxpr"]
    if prim is while_loop_p:
        return Loop(prim, body, params["cond_jaxpr"], params["num_consts"], len(C.out_avals_of(body)),
                    max_steps=params["max_steps"], checkpoints=params["checkpoints"])
    if prim is while_loop_stack_output_p:
        return Loop(prim, body, params["cond_jaxpr"], params["num_consts"], params["num_carry"],
                    length=params["max_steps"])
    return Loop(prim, body, None, params["num_consts"], params["num_carry"], length=params["length"],
                reverse=params["reverse"])


def stack_loop(cond: Any, body: Any, num_consts: int, num_carry: int, length: int) -> Loop:
    return Loop(while_loop_stack_output_p, body, cond, num_consts, num_carry, length=length)


def counted_loop(body: Any, num_consts: int, num_carry: int, length: int, reverse: bool) -> Loop:
    return Loop(counted_loop_p, body, None, num_consts, num_carry, length=length, reverse=reverse)


# --------------------------------------------------------------------------- evaluation
def run_loop(loop: Loop, args: Sequence[Any], blocked: bool = False) -> list:
    """Evaluate a loop with ``lax.while_loop`` (the impl and the MLIR lowering).

    ``blocked`` (the GPU lowering) runs the loop in blocks of a constant trip count;
    see :func:`_blocked_counted`."""
    n, consts, carry, xs = loop.split(args)
    carry = [_strong(c) for c in carry]

    def cond_value(c):
        return _eval(loop.cond, *consts, *c)[0]

    if loop.prim is while_loop_p:
        def plain_body(c):
            return [_strong(x) for x in _eval(loop.body, *consts, *c)]
        return list(lax.while_loop(cond_value, plain_body, carry))

    ys0 = [jnp.zeros((loop.length, *a.shape), a.dtype) for a in loop.y_row_avals]

    def cond(state):
        i, c, _ = state
        if loop.counted:
            return i < n
        return jnp.logical_and(i < loop.length, cond_value(c))

    def body(state):
        i, c, ys = state
        j = n - 1 - i if loop.reverse else i
        rows = [lax.dynamic_index_in_dim(x, j, keepdims=False, allow_negative_indices=False) for x in xs]
        new_c, y_rows = _split(_eval(loop.body, *consts, *c, *rows), [loop.num_carry])
        ys = [lax.dynamic_update_index_in_dim(y, r.astype(y.dtype), j, 0, allow_negative_indices=False)
              for y, r in zip(ys, y_rows)]
        return i + 1, [_strong(x) for x in new_c], ys

    state0 = (jnp.zeros((), _INT), carry, ys0)
    if loop.counted and blocked:
        i, c, ys = _blocked_counted(body, n, loop.length, state0)
    elif loop.stacks and blocked and _speculate(loop):
        i, c, ys = _speculative_stack(loop, consts, state0, cond_value, cond, body)
    else:
        i, c, ys = lax.while_loop(cond, body, state0)
    outs = [*c, *ys]
    if loop.stacks:
        overflowed = jnp.logical_and(i >= loop.length, cond_value(c))
        outs += [i, overflowed]
    return outs


# A while loop whose trip count XLA cannot infer costs, on a GPU, a device-to-host
# copy of its predicate and a stream synchronisation per iteration (XLA's WhileThunk
# evaluates the condition on the host); a loop with a constant trip count does not.
# So the counted loops run as ``num_steps // B`` blocks of a constant-trip-count inner
# loop of B iterations, then a remainder loop of fewer than B iterations: about
# ``2 * sqrt(length)`` synchronisations instead of ``num_steps``, no extra work.
# The stacking loop, whose trip count depends on its condition, runs B iterations per
# outer step speculatively: an iteration after the condition turned false leaves
# the carry, the counter and the stack unchanged (selects), so at most B - 1 body
# evaluations are wasted. Only bodies and conditions without effects speculate.
# CPU and TPU run while loops without a host round trip per iteration, so they keep
# the plain loop; JAXAOT_BLOCKED_LOOPS=1 selects the blocked form everywhere (tests).
_BLOCKED_PLATFORMS = ("cuda", "rocm")
_BLOCK_EVERYWHERE = os.environ.get("JAXAOT_BLOCKED_LOOPS", "") not in ("", "0")
_MIN_BLOCKED_LENGTH = 16
_SPECULATE_BLOCK = 8


def _block_size(length: int) -> int:
    return max(1, int(np.sqrt(length))) if length >= _MIN_BLOCKED_LENGTH else 1


def _blocked_counted(body: Callable, n: Any, length: int, state0: Any) -> Any:
    def plain(state):
        return lax.while_loop(lambda s: s[0] < n, body, state)

    b = _block_size(length)
    if b <= 1:
        return plain(state0)
    full = (n // b) * b

    def block(state):
        return lax.fori_loop(0, b, lambda _, s: body(s), state)

    return plain(lax.while_loop(lambda s: s[0] < full, block, state0))


_UNBOUNDED_LOOPS = ("while", "while_loop", "while_loop_stack_output")


def _has_unbounded_loop(closed: Any) -> bool:
    """Whether a jaxpr runs a cond-driven loop (one that, speculatively run on a state
    past the outer loop's end, might never stop)."""
    for eqn in C.jaxpr_of(closed).eqns:
        if str(eqn.primitive) in _UNBOUNDED_LOOPS:
            return True
        if any(_has_unbounded_loop(sub) for sub in C.eqn_subjaxprs(eqn)):
            return True
    return False


def _speculate(loop: Loop) -> bool:
    return (loop.num_xs == 0 and loop.length >= _MIN_BLOCKED_LENGTH and not loop.effects()
            and not _has_unbounded_loop(loop.body))


def _speculative_stack(loop: Loop, consts: Sequence[Any], state0: Any, cond_value: Callable,
                       cond: Callable, body: Callable) -> Any:
    """The stacking loop, ``_SPECULATE_BLOCK`` iterations per outer step while that many
    rows are free, then the plain loop for the rest (at most one check if it stopped).

    Inside a block the row index stays below the capacity, so each iteration writes
    its row unconditionally (an iteration after the stop rewrites row ``num_steps``,
    which is unspecified); only the carry and the counter are selected."""
    b = _SPECULATE_BLOCK

    def step(_, state):
        i, c, ys, running = state
        pred = jnp.logical_and(running, cond_value(c))
        new_c, y_rows = _split(_eval(loop.body, *consts, *c), [loop.num_carry])
        new_c = [lax.select(pred, _strong(a), a0) for a, a0 in zip(new_c, c)]
        ys = [lax.dynamic_update_index_in_dim(y, r.astype(y.dtype), i, 0, allow_negative_indices=False)
              for y, r in zip(ys, y_rows)]
        return i + pred.astype(_INT), new_c, ys, pred

    def block(state):
        return lax.fori_loop(0, b, step, state)

    def block_cond(state):
        return jnp.logical_and(state[3], state[0] <= loop.length - b)

    i, c, ys, _ = lax.while_loop(block_cond, block, (*state0, jnp.asarray(True)))
    return lax.while_loop(cond, body, (i, c, ys))


def _run_prim(prim, *args, blocked=False, **params):
    return run_loop(loop_of(prim, params), args, blocked)


def _abstract_eval(prim, *avals, **params):
    loop = loop_of(prim, params)
    return loop.out_avals(), loop.effects()


for _p in (while_loop_p, while_loop_stack_output_p, counted_loop_p):
    _p.def_effectful_abstract_eval(partial(_abstract_eval, _p))
    C.register_lowering(_p, C.lower_fun(partial(_run_prim, _p, blocked=_BLOCK_EVERYWHERE), multiple_results=True))
    for _platform in _BLOCKED_PLATFORMS:
        C.register_lowering(_p, C.lower_fun(partial(_run_prim, _p, blocked=True), multiple_results=True),
                            platform=_platform)


# --------------------------------------------------------------------------- run-time checks
def _raise_overflow(overflowed: Any, max_steps: int) -> None:
    if np.any(np.asarray(overflowed)):
        raise LoopOverflowError(
            f"while_loop needed more than max_steps={max_steps} iterations. Its reverse mode "
            f"stacks at most max_steps carries: raise max_steps, or pass checkpoints=k instead."
        )


def check_overflow(overflowed: Any, max_steps: int) -> None:
    """Raise :class:`LoopOverflowError` at run time when a stack overflowed."""
    jax.debug.callback(partial(_raise_overflow, max_steps=max_steps), overflowed)


# --------------------------------------------------------------------------- dynamic capacity (mode 3)
_STATE = threading.local()


def capacity_frames() -> list:
    """The stack of active ``dynamic_capacity`` frames: ``[(capacity, trip_counts), ...]``."""
    if not hasattr(_STATE, "frames"):
        _STATE.frames = []
    return _STATE.frames


def _stack_capacity(loop: Loop) -> tuple[int, Callable[[Any, Any], None]]:
    """The stack length for reverse-differentiating ``loop`` and what to do on overflow."""
    if loop.prim is not while_loop_p:
        return loop.length, lambda num_steps, overflowed: None
    if loop.max_steps is not None:
        return loop.max_steps, lambda num_steps, overflowed: check_overflow(overflowed, loop.max_steps)
    frames = capacity_frames()
    if frames:
        capacity, trip_counts = frames[-1]

        def report(num_steps, overflowed):
            trip_counts.append(jnp.where(overflowed, jnp.asarray(capacity + 1, _INT), num_steps))

        return capacity, report
    raise ReverseModeBoundError(
        "jaxaot.while_loop was reverse-differentiated (jax.grad / jax.vjp / jax.linearize) "
        "without a bound on its trip count. Pass max_steps=N (stack up to N carries; more is "
        "an error) or checkpoints=k (store k snapshots and recompute), or call it inside an "
        "aot_function, whose runtime sizes the stack itself."
    )


# --------------------------------------------------------------------------- JVP
def _jvp(prim, primals, tangents, **params):
    loop = loop_of(prim, params)
    n, consts, carry, xs = loop.split(primals)
    _, cdot, tdot, xdot = loop.split(tangents)
    cnz = [not _is_zero(t) for t in cdot]
    xnz = [not _is_zero(t) for t in xdot]
    tnz = [not _is_zero(t) for t in tdot]
    for _ in range(1 + loop.num_carry):
        body_jvp, out_nz = C.jvp_jaxpr(loop.body, cnz + tnz + xnz, tnz + [False] * loop.num_ys)
        if out_nz[: loop.num_carry] == tnz:
            break
        tnz = _or(tnz, out_nz[: loop.num_carry])
    ynz = out_nz[loop.num_carry:]
    nc, nt, nx = sum(cnz), sum(tnz), sum(xnz)
    ny = sum(ynz)
    k, m, x = loop.num_consts, loop.num_carry, loop.num_xs
    jvp_in = C.in_avals_of(body_jvp)
    primal_in, tan_in = jvp_in[: k + m + x], jvp_in[k + m + x:]
    c_av, t_av, x_av = _split(primal_in, [k, m])
    dc_av, dt_av, dx_av = _split(tan_in, [nc, nt])

    def body(*args):
        c, dc, t, dt, xr, dxr = _split(args, [k, nc, m, nt, x, nx])[:6]
        out = _eval(body_jvp, *c, *t, *xr, *dc, *dt, *dxr)
        t_o, y_o, dt_o, dy_o = _split(out, [m, loop.num_ys, nt])
        return [*t_o, *dt_o, *y_o, *dy_o]

    new_body = _trace(body, [*c_av, *dc_av, *t_av, *dt_av, *x_av, *dx_av])
    new_cond = None
    if loop.cond is not None:
        cond = loop.cond
        new_cond = _trace(lambda *a: _eval(cond, *a[:k], *a[k + nc: k + nc + m]),
                          [*c_av, *dc_av, *t_av, *dt_av])
    new_loop = loop.replace(body=new_body, cond=new_cond, num_consts=k + nc, num_carry=m + nt)
    inst = C.instantiate_zeros
    args = new_loop.join(
        n,
        [*consts, *_pick(cnz, cdot)],
        [*carry, *[inst(t) for t, nz in zip(tdot, tnz) if nz]],
        [*xs, *_pick(xnz, xdot)],
    )
    outs = new_loop.bind(args)
    t_out, dt_out, y_out, dy_out, extra = _split(outs, [m, nt, loop.num_ys, ny])
    primal_out = [*t_out, *y_out, *extra]
    tan_out = (_merge(tnz, dt_out, [_zero(a) for a in _pick(tnz, loop.carry_avals, False)])
               + _merge(ynz, dy_out, [_zero(_stacked(a, loop.length)) for a in _pick(ynz, loop.y_row_avals, False)])
               + [_zero(C.ShapedArray((), _INT)), _zero(C.ShapedArray((), np.bool_))][: loop.num_extra])
    return primal_out, tan_out


# --------------------------------------------------------------------------- partial eval
def _carry_unknowns(loop: Loop, consts_uk, carry_uk, xs_uk):
    """Fixpoint of which carries are unknown, and the body split for it."""
    carry_uk = list(carry_uk)
    for _ in range(1 + loop.num_carry):
        split = C.partial_eval_jaxpr_nounits(
            loop.body, [*consts_uk, *carry_uk, *xs_uk], [*carry_uk, *([False] * loop.num_ys)])
        out_uk = split[2]
        if out_uk[: loop.num_carry] == carry_uk:
            return carry_uk, split
        carry_uk = _or(carry_uk, out_uk[: loop.num_carry])
    raise AssertionError("carry fixpoint not reached")


def _cond_unknown(loop: Loop, consts_uk, carry_uk) -> bool:
    if loop.cond is None:
        return False
    _, _, (uk,), _ = C.partial_eval_jaxpr_nounits(loop.cond, [*consts_uk, *carry_uk], False)
    return bool(uk)


def _known_cond(loop: Loop, consts_uk, carry_uk) -> Any:
    if loop.cond is None:
        return None
    known, _, _, _ = C.partial_eval_jaxpr_nounits(loop.cond, [*consts_uk, *carry_uk], False)
    return known


def _hoist(known_body: Any, num_consts: int, num_outs: int, num_res: int):
    """Split ``known_body`` into a consts-only part and a per-iteration part.

    Returns ``(hoist, loop_body, loop_dep)``: ``hoist(consts) -> (invariant residuals,
    loop consts)``, ``loop_body(loop consts, carry, xs) -> (outs, varying residuals)``
    and, per residual, whether it varies with the iteration (and so is stacked).
    """
    n_in = len(C.in_avals_of(known_body))
    hoist, loop_body, dep, _ = C.partial_eval_jaxpr_nounits(
        known_body, [False] * num_consts + [True] * (n_in - num_consts), [True] * num_outs + [False] * num_res)
    return hoist, loop_body, dep[num_outs:]


def _partial_eval(prim, trace, *tracers, **params):
    loop = loop_of(prim, params)
    uk = [not C.is_known_pval(t) for t in tracers]
    n_uk, consts_uk, carry_uk, xs_uk = loop.split(uk)
    if (loop.counted and n_uk) or not any(uk):
        return trace.default_process_primitive(prim, tracers, params)
    carry_uk, (known_body, unknown_body, out_uk, res_avals) = _carry_unknowns(loop, consts_uk, carry_uk, xs_uk)
    if _cond_unknown(loop, consts_uk, carry_uk):
        return trace.default_process_primitive(prim, tracers, params)
    if prim is while_loop_p and loop.checkpoints is not None:
        from jaxaot.loops import checkpointed as checkpointing
        return checkpointing.partial_eval(loop, trace, tracers, carry_uk, known_body, unknown_body, res_avals)
    ys_uk = out_uk[loop.num_carry:]
    length, on_overflow = _stack_capacity(loop)
    k, m = loop.num_consts, loop.num_carry
    kc_n, kt_n = k - sum(consts_uk), m - sum(carry_uk)
    num_res = len(res_avals)
    num_known_outs = kt_n + loop.num_ys - sum(ys_uk)

    n, consts, carry, xs = loop.split(tracers)
    known = lambda ts, uks: [C.known_value(t) for t, u in zip(ts, uks) if not u]  # noqa: E731
    k_consts, k_carry, k_xs = known(consts, consts_uk), known(carry, carry_uk), known(xs, xs_uk)

    # The known loop: hoisted residuals once, the varying ones stacked per iteration.
    hoist, loop_body, res_dep = _hoist(known_body, kc_n, num_known_outs, num_res)
    hoisted = _eval(hoist, *k_consts)
    n_inv = len(res_dep) - sum(res_dep)
    inv_res, loop_consts = hoisted[:n_inv], hoisted[n_inv:]
    n_lc = len(loop_consts)
    cond = _known_cond(loop, consts_uk, carry_uk)
    if cond is not None:  # the known loop's consts are (cond consts, loop consts)
        cond_k = cond
        cond = _trace(lambda *a: _eval(cond_k, *a[:kc_n], *a[kc_n + n_lc:]),
                      [*C.in_avals_of(cond_k)[:kc_n], *C.in_avals_of(loop_body)[:n_lc],
                       *C.in_avals_of(cond_k)[kc_n:]])
        lb = loop_body
        loop_body = _trace(lambda *a: _eval(lb, *a[kc_n:]), [*C.in_avals_of(cond_k)[:kc_n], *C.in_avals_of(lb)])
        loop_consts = [*k_consts, *loop_consts]
    if loop.counted:
        known_loop = counted_loop(loop_body, len(loop_consts), kt_n, length, loop.reverse)
    else:
        known_loop = stack_loop(cond, loop_body, len(loop_consts), kt_n, length)
    known_outs = known_loop.bind(known_loop.join(C.known_value(n) if loop.counted else None,
                                                 loop_consts, k_carry, k_xs))
    k_t_out, k_rest, extra = _split(known_outs, [kt_n, known_loop.num_ys])
    k_y_out, ext_res = k_rest[: num_known_outs - kt_n], k_rest[num_known_outs - kt_n:]
    if loop.counted:
        num_steps = C.known_value(n)
    else:
        num_steps, overflowed = extra
        on_overflow(num_steps, overflowed)
        extra = extra if loop.stacks else []

    # The unknown loop: a linear counted loop over the stacked residuals.
    res_dep = list(res_dep)
    ub = unknown_body
    u_k, u_m = sum(consts_uk), sum(carry_uk)

    def linear_body(*a):
        inv, uc, ut, ux, ext = _split(a, [n_inv, u_k, u_m, sum(xs_uk)])[:5]
        return _eval(ub, *_merge(res_dep, ext, inv), *uc, *ut, *ux)

    u_in = C.in_avals_of(ub)
    res_in, rest_in = u_in[:num_res], u_in[num_res:]
    lin_body = _trace(linear_body, [*_pick(res_dep, res_in, False), *rest_in, *_pick(res_dep, res_in)])
    lin_loop = counted_loop(lin_body, n_inv + u_k, u_m, length, loop.reverse)
    u_consts = [t for t, u in zip(consts, consts_uk) if u]
    u_carry = [t for t, u in zip(carry, carry_uk) if u]
    u_xs = [t for t, u in zip(xs, xs_uk) if u]
    in_tracers = lin_loop.join(num_steps, [*inv_res, *u_consts], u_carry, [*u_xs, *ext_res])
    out_tracers = C.stage_unknown_eqn(trace, counted_loop_p, in_tracers, lin_loop.out_avals(),
                                      lin_loop.params(), lin_loop.effects())
    u_t_out, u_y_out = _split(out_tracers, [u_m])[:2]
    return [*_merge(carry_uk, u_t_out, k_t_out), *_merge(ys_uk, u_y_out, k_y_out), *extra]


# --------------------------------------------------------------------------- transpose
def _transpose_counted(cts, *args, **params):
    loop = loop_of(counted_loop_p, params)
    n, consts, carry, xs = loop.split(args)
    if C.is_undefined_primal(n):
        raise ValueError("counted_loop: the trip count cannot be linear")
    c_lin = [C.is_undefined_primal(c) for c in consts]
    x_lin = [C.is_undefined_primal(x) for x in xs]
    ct_carry, ct_ys = _split(cts, [loop.num_carry])[:2]
    ct_carry = [C.instantiate_zeros(ct) for ct in ct_carry]
    y_nz = [not _is_zero(ct) for ct in ct_ys]
    res_c, res_x = _pick(c_lin, consts, False), _pick(x_lin, xs, False)
    lin_c_avals = [_tangent_aval(a) for a in _pick(c_lin, loop.const_avals)]
    lin_x_rows = [_tangent_aval(a) for a in _pick(x_lin, loop.x_row_avals)]
    y_rows = [_tangent_aval(a) for a in loop.y_row_avals]
    carry_ct_avals = [_tangent_aval(a) for a in loop.carry_avals]
    body = loop.body
    nrc, nlc, m, nrx = len(res_c), len(lin_c_avals), loop.num_carry, len(res_x)

    def transposed(*a):
        rc, acc, ctc, rx, cty = _split(a, [nrc, nlc, m, nrx])
        primals = [*_merge(c_lin, [C.UndefinedPrimal(av) for av in _pick(c_lin, loop.const_avals)], rc),
                   *[C.UndefinedPrimal(av) for av in loop.carry_avals],
                   *_merge(x_lin, [C.UndefinedPrimal(av) for av in _pick(x_lin, loop.x_row_avals)], rx)]
        cts_out = [*ctc, *_merge(y_nz, cty, [C.Zero(av) for av in _pick(y_nz, y_rows, False)])]
        cts_in = C.backward_pass_closed(body, primals, cts_out)
        ct_c, ct_t, ct_x = _split(cts_in, [loop.num_consts, m])
        new_acc = [a_ + C.instantiate_zeros(g) for a_, g in zip(acc, _pick(c_lin, ct_c))]
        return [*new_acc, *[C.instantiate_zeros(g) for g in ct_t],
                *[C.instantiate_zeros(g) for g in _pick(x_lin, ct_x)]]

    res_c_avals = [jax.typeof(c) for c in res_c]
    res_x_rows = [_row(jax.typeof(x)) for x in res_x]
    t_body = _trace(transposed, [*res_c_avals, *lin_c_avals, *carry_ct_avals, *res_x_rows,
                                 *_pick(y_nz, y_rows)])
    t_loop = counted_loop(t_body, nrc, nlc + m, loop.length, not loop.reverse)
    acc0 = [jnp.zeros(a.shape, a.dtype) for a in lin_c_avals]
    outs = t_loop.bind(t_loop.join(n, res_c, [*acc0, *ct_carry], [*res_x, *_pick(y_nz, ct_ys)]))
    ct_c, ct_t, ct_x = _split(outs, [nlc, m])
    return [None, *_merge(c_lin, ct_c, [None] * (len(consts) - nlc)), *ct_t,
            *_merge(x_lin, ct_x, [None] * (len(xs) - len(lin_x_rows)))]


def _no_transpose(prim, cts, *args, **params):
    raise ReverseModeBoundError(
        f"{prim} cannot be transposed directly: its condition depends on a differentiated "
        "value, so its trip count is not known to the backward pass."
    )


# --------------------------------------------------------------------------- batching
def _moveaxis(x, src, dst):
    return jnp.moveaxis(x, src, dst) if src != dst else x


def _bcast(x, size, axis=0):
    return jnp.broadcast_to(jnp.expand_dims(x, axis), (*x.shape[:axis], size, *x.shape[axis:]))


def _lane_select(p, new, old):
    return jnp.where(p.reshape(p.shape + (1,) * (new.ndim - 1)), new, old)


def _uses_batched(closed: Any, batched: Sequence[bool]) -> bool:
    _, used = C.dce_closed(closed, [True] * len(C.out_avals_of(closed)))
    return any(u and b for u, b in zip(used, batched))


def _batched_outputs(closed: Any, batched: Sequence[bool]) -> list[bool]:
    """Which outputs depend on a batched input (a safe over-approximation of vmap's)."""
    n_out = len(C.out_avals_of(closed))
    out = []
    for j in range(n_out):
        _, used = C.dce_closed(closed, [i == j for i in range(n_out)])
        out.append(any(u and b for u, b in zip(used, batched)))
    return out


def _batched_carries(loop: Any, cb: Sequence[bool], tb: Sequence[bool], xb: Sequence[bool]) -> tuple[list, list]:
    """Fixpoint of which carries (and stacked outputs) vmap must batch.

    Only carries that a batched value reaches get a batch axis, so ``jax.jacfwd``
    (a vmap over tangents) leaves the primal carries unbatched, as lax.while_loop
    does.
    """
    m = loop.num_carry
    tb = list(tb)
    while True:
        outs = _batched_outputs(loop.body, [*cb, *tb, *xb])
        new = [a or b for a, b in zip(tb, outs[:m])]
        if new == tb:
            return tb, outs[m:]
        tb = new


def _batch(prim, args, dims, **params):
    loop = loop_of(prim, params)
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    n, consts, carry, xs = loop.split(args)
    nd, cd, td, xd = loop.split(dims)
    cb = [d is not None for d in cd]
    xb = [d is not None for d in xd]
    k, m, nx, ny = loop.num_consts, loop.num_carry, loop.num_xs, loop.num_ys
    tb, yb = _batched_carries(loop, cb, [d is not None for d in td], xb)
    pred_batched = loop.cond is not None and _uses_batched(loop.cond, cb + tb)
    n_batched = loop.counted and nd is not None
    if pred_batched or n_batched:
        # Lanes stop at different steps: every carry and row is selected per lane.
        tb, yb = [True] * m, [True] * ny
    consts = [_moveaxis(c, d, 0) if d is not None else c for c, d in zip(consts, cd)]
    carry = [_moveaxis(c, d, 0) if d is not None else (_bcast(c, size) if b else c)
             for c, d, b in zip(carry, td, tb)]
    xs = [_moveaxis(x, d, 1) if d is not None else x for x, d in zip(xs, xd)]
    body_in_axes = tuple([0 if b else None for b in cb] + [0 if b else None for b in tb]
                         + [0 if b else None for b in xb])
    body_out_axes = [0 if b else None for b in tb] + [0 if b else None for b in yb]
    vbody = jax.vmap(partial(_eval, loop.body), in_axes=body_in_axes, out_axes=body_out_axes)
    vcond = (jax.vmap(partial(_eval, loop.cond), in_axes=body_in_axes[: k + m])
             if loop.cond is not None else None)
    count_lanes = loop.stacks and pred_batched
    lane_mask = []
    if n_batched:
        n = _moveaxis(n, nd, 0)
        lane_mask = [jnp.arange(loop.length)[:, None] < n[None, :]]
        n = jnp.max(n)

    def body(*a):
        c, t, xr, extra = _split(a, [k, m, nx])
        outs = vbody(*c, *t, *xr)
        new_t, y = outs[:m], outs[m:]
        if pred_batched:
            p = vcond(*c, *t)[0]
            new_t = [_lane_select(p, a_, b_) for a_, b_ in zip(new_t, t)]
        if n_batched:
            (mask,) = extra
            new_t = [_lane_select(mask, a_, b_) for a_, b_ in zip(new_t, t)]
            y = [_lane_select(mask, a_, jnp.zeros_like(a_)) for a_ in y]
        counter = [t_extra + p.astype(_INT) for t_extra in extra] if count_lanes else []
        return [*new_t, *counter, *y]

    const_avals = [jax.typeof(c) for c in consts]
    carry_avals = [jax.typeof(c) for c in carry]
    x_rows = [_row(jax.typeof(x)) for x in xs]
    counter0 = [jnp.zeros((size,), _INT)] if count_lanes else []
    extra_rows = [_row(jax.typeof(lm)) for lm in lane_mask]
    if count_lanes:
        def counted_body(*a):
            c, t, cnt, xr = _split(a, [k, m, 1])
            return body(*c, *t, *xr, *cnt)
        new_body = _trace(counted_body, [*const_avals, *carry_avals, C.ShapedArray((size,), _INT), *x_rows])
    else:
        new_body = _trace(body, [*const_avals, *carry_avals, *x_rows, *extra_rows])
    new_cond = None
    if loop.cond is not None:
        def cond(*a):
            return [jnp.any(vcond(*a[: k + m])[0])]
        new_cond = _trace(cond, [*const_avals, *carry_avals, *([C.ShapedArray((size,), _INT)] if count_lanes else [])])
    new_loop = loop.replace(body=new_body, cond=new_cond, num_carry=m + len(counter0))
    outs = new_loop.bind(new_loop.join(n, consts, [*carry, *counter0], [*xs, *lane_mask]))
    t_out, cnt, y_out, extra = _split(outs, [m, len(counter0), ny])
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
        used_t = _or(used_t, cond_t)
    for _ in range(2 + m):
        _, used_in = C.dce_closed(loop.body, used_t + used_y, [False] * k + used_t + [False] * nx)
        if used_in[k:k + m] == used_t:
            break
        used_t = _or(used_t, used_in[k:k + m])
    used_c = _or(used_in[:k], used_c_cond)
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


# --------------------------------------------------------------------------- partial eval for jax.checkpoint
def _partial_eval_custom(prim, saveable, unks_in, inst_in, eqn):
    # The loop is recomputed whole in the staged (backward) part; its residuals are
    # only its inputs. Splitting it into stacking and linear loops happens later,
    # when remat's transpose partially evaluates the staged eqn with _partial_eval.
    del saveable
    loop = loop_of(prim, eqn.params)
    new_inst = [x for x, inst in zip(eqn.invars, inst_in) if C.is_jaxpr_var(x) and not inst]
    n_out = len(eqn.outvars)
    stage_all = (None, eqn, [True] * n_out, [True] * n_out, new_inst)
    n_uk, consts_uk, carry_uk, xs_uk = loop.split(unks_in)
    if loop.counted and n_uk:
        return stage_all
    carry_uk, (known_body, _, out_uk, res_avals) = _carry_unknowns(loop, consts_uk, carry_uk, xs_uk)
    if _cond_unknown(loop, consts_uk, carry_uk) or not any(out_uk):
        return stage_all
    n_known_outs = len(C.out_avals_of(known_body)) - len(res_avals)
    known_body, _ = C.dce_closed(known_body, [True] * n_known_outs + [False] * len(res_avals), True)
    ys_uk = out_uk[loop.num_carry:]
    known_loop = loop.replace(body=known_body, cond=_known_cond(loop, consts_uk, carry_uk),
                              num_consts=loop.num_consts - sum(consts_uk),
                              num_carry=loop.num_carry - sum(carry_uk))
    unks = ([False] if loop.counted else []) + [*consts_uk, *carry_uk, *xs_uk]
    known_in = [v for v, u in zip(eqn.invars, unks) if not u]
    out_uk_all = [*carry_uk, *ys_uk, *([False] * loop.num_extra)]
    known_out = [v for v, u in zip(eqn.outvars, out_uk_all) if not u]
    eqn_known = C.new_eqn(known_in, known_out, prim, known_loop.params(), known_loop.effects(), eqn)
    return eqn_known, eqn, out_uk_all, [True] * n_out, new_inst


for _p in (while_loop_p, while_loop_stack_output_p, counted_loop_p):
    C.primitive_jvps[_p] = partial(_jvp, _p)
    C.custom_partial_eval_rules[_p] = partial(_partial_eval, _p)
    C.primitive_batchers[_p] = partial(_batch, _p)
    C.dce_rules[_p] = partial(_dce, _p)
    C.partial_eval_jaxpr_custom_rules[_p] = partial(_partial_eval_custom, _p)
    _p._jaxaot_has_rules = True
C.primitive_transposes[counted_loop_p] = _transpose_counted
C.primitive_transposes[while_loop_p] = partial(_no_transpose, while_loop_p)
C.primitive_transposes[while_loop_stack_output_p] = partial(_no_transpose, while_loop_stack_output_p)
