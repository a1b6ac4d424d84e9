"""The loop primitives, the :class:`Loop` view of their parameters, and shared helpers.

Three primitives share one set of rules: ``while_loop_p`` (``lax.while_loop`` plus
``max_steps`` and ``checkpoints``), ``while_loop_stack_output_p`` (a cond-driven
loop stacking a per-iteration output) and ``counted_loop_p`` (``num_steps``
iterations over stacked rows, what reverse mode produces). A :class:`Loop` reads
any of their eqns the same way (:func:`loop_of`), splits operand lists and rebuilds
params after a rule changed the bodies. Nothing here registers a rule.

Example:
    >>> import jax
    >>> body = jax.make_jaxpr(lambda c, x: [c + x, c])(0.0, 0.0)
    >>> loop = counted_loop(body, num_consts=0, num_carry=1, length=4, reverse=False)
    >>> [a.shape for a in loop.out_avals()]  # the carry, and the stacked ys
    [(), (4,)]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxaot._src import compat as C

from jaxaot.errors import InvalidLoopOptionError

while_loop_p = C.new_loop_primitive("while_loop")
while_loop_stack_output_p = C.new_loop_primitive("while_loop_stack_output")
counted_loop_p = C.new_loop_primitive("counted_loop")

#: The three primitives that share :mod:`jaxaot._src.loops.rules`.
LOOP_PRIMITIVES = (while_loop_p, while_loop_stack_output_p, counted_loop_p)

#: The dtype of trip counts and row indices.
INT = np.int32


# --------------------------------------------------------------------------- options
#: The largest ``max_steps``, ``checkpoints`` or capacity: trip counts and row indices are int32, and a
#: capacity's "needed more" count (capacity + 1) must fit too.
MAX_COUNT = 2**31 - 2
#: The largest ``checkpoints``: the online schedule reads a table of (k + 2) rows of 1025 int32 repetition
#: counts (:mod:`jaxaot._src.loops.revolve`) by flat int32 index.
MAX_CHECKPOINTS = (2**31 - 1) // 1025 - 2


def check_positive(name: str, value: Any, who: str = "while_loop", optional: bool = True) -> None:
    """Raise :class:`InvalidLoopOptionError` unless ``value`` is a positive int of at most :data:`MAX_COUNT`, or
    None where ``optional`` (``who``: the function the message names)."""
    if value is None and optional:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidLoopOptionError(
            f"{who}: {name} must be a positive Python int{' or None' if optional else ''}, "
            f"got {type(value).__name__} {value!r}."
        )
    if value < 1:
        raise InvalidLoopOptionError(f"{who}: {name} must be a positive int, got {value}.")
    if value > MAX_COUNT:
        raise InvalidLoopOptionError(
            f"{who}: {name} must be at most 2**31 - 2 = {MAX_COUNT} (trip counts are int32), got {value}.")


#: Where ``checkpoint_memory`` may keep a checkpointed loop's snapshots.
CHECKPOINT_MEMORY = ("device", "host")


def check_options(max_steps: Any, checkpoints: Any, checkpoint_memory: Any = "device", who: str = "while_loop"
                  ) -> None:
    """Check ``while_loop``'s reverse-mode options: each None or a positive int, and
    ``checkpoint_memory`` one of :data:`CHECKPOINT_MEMORY`.

    ``max_steps`` alone stacks up to N carries; ``checkpoints`` alone keeps k snapshots
    and recomputes the rest (the online schedule); both together bound the trip count
    by N for an offline schedule of k snapshots (:mod:`jaxaot._src.loops.offline`), whose
    snapshots ``checkpoint_memory="host"`` keeps in host memory. ``who`` is the function the
    messages name (``while_loop``, ``patch_while_loop``).
    """
    check_positive("max_steps", max_steps, who)
    check_positive("checkpoints", checkpoints, who)
    if checkpoints is not None and checkpoints > MAX_CHECKPOINTS:
        raise InvalidLoopOptionError(
            f"{who}: checkpoints must be at most {MAX_CHECKPOINTS} (the schedule's table of repetition counts is "
            f"indexed by int32), got {checkpoints}. Snapshots beyond a few thousand rarely pay: each holds a carry; "
            "with max_steps=N, checkpoints=N stores every step.")
    if not isinstance(checkpoint_memory, str) or checkpoint_memory not in CHECKPOINT_MEMORY:
        raise InvalidLoopOptionError(
            f"{who}: checkpoint_memory must be one of {CHECKPOINT_MEMORY}, got {checkpoint_memory!r}."
        )
    if checkpoint_memory == "host" and (max_steps is None or checkpoints is None):
        raise InvalidLoopOptionError(
            f"{who}: checkpoint_memory='host' keeps the snapshots of the offline schedule in host memory, "
            f"so it needs both max_steps (a bound on the trip count) and checkpoints (the number of host "
            f"snapshots); got max_steps={max_steps}, checkpoints={checkpoints}."
        )


# --------------------------------------------------------------------------- lists
def pick(mask: Sequence[bool], xs: Sequence[Any], keep: bool = True) -> list:
    """The ``xs`` whose mask entry is ``keep``."""
    return [x for m, x in zip(mask, xs) if bool(m) == keep]


def either(a: Sequence[bool], b: Sequence[bool]) -> list[bool]:
    """Elementwise ``or`` of two masks."""
    return [x or y for x, y in zip(a, b)]


# --------------------------------------------------------------------------- avals and values
def stacked_aval(aval: Any, length: int) -> Any:
    return C.reshaped_aval(aval, (length, *aval.shape))


def row_aval(aval: Any) -> Any:
    return C.reshaped_aval(aval, aval.shape[1:])


def zero_tangent(aval: Any) -> Any:
    """The symbolic zero tangent of a primal of type ``aval``."""
    return C.Zero(aval.to_tangent_aval())


def is_zero(t: Any) -> bool:
    return type(t) is C.Zero


def strong(x: Any) -> Any:
    """``x`` without a weak type: ``lax.while_loop`` demands identical carry types."""
    return lax.convert_element_type(x, jnp.result_type(x))


def read_row(buf: Any, i: Any) -> Any:
    """Row ``i`` of ``buf`` (a traced index, never negative)."""
    return lax.dynamic_index_in_dim(buf, i, keepdims=False, allow_negative_indices=False)


def write_row(buf: Any, i: Any, x: Any) -> Any:
    """``buf`` with row ``i`` set to ``x`` (cast to the buffer's dtype)."""
    buf, x = C.on_one_mesh(buf, x.astype(buf.dtype))
    return lax.dynamic_update_index_in_dim(buf, x, i, 0, allow_negative_indices=False)


def moveaxis(x: Any, src: int, dst: int) -> Any:
    return jnp.moveaxis(x, src, dst) if src != dst else x


def broadcast_lanes(x: Any, size: int, axis: int = 0) -> Any:
    """``x`` repeated ``size`` times along a new batch axis."""
    shape = jnp.shape(x)
    return jnp.broadcast_to(jnp.expand_dims(x, axis), (*shape[:axis], size, *shape[axis:]))


def as_operand(x: Any, aval: Any) -> Any:
    """``x`` as an array of ``aval``'s dtype: a rule may get a jaxpr literal (a Python or typed
    scalar, in a loop nested in another loop's body) where the loop has an array operand."""
    if isinstance(x, (jax.Array, C.Tracer)):
        return x
    return jnp.asarray(x, aval.dtype)


def forwarded_carries(body: Any, num_consts: int, num_carry: int) -> list[bool]:
    """Per carry, whether ``body`` returns its input unchanged (a read-only carry).

    Such a carry keeps its initial value whatever the trip count, so a rule may
    leave it as it is (unbatched under vmap, as ``lax.while_loop`` does by moving
    it to the consts).
    """
    invars = body.jaxpr.invars[num_consts:num_consts + num_carry]
    outvars = body.jaxpr.outvars[:num_carry]
    return [o is i for o, i in zip(outvars, invars)]


def trace_flat(fn: Callable[..., Sequence[Any]], avals: Sequence[Any]) -> Any:
    """Trace ``fn(*flat) -> list`` on ``avals`` to a closed jaxpr without consts."""
    closed = jax.make_jaxpr(lambda *a: list(fn(*a)))(*[C.abstract_input(a) for a in avals])  # shard_map: variance kept
    jaxpr, consts = C.hoist_consts(closed)
    if consts:  # constants captured while tracing (numpy arrays): keep them closed over
        jaxpr = closed
    return jaxpr


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
    checkpoint_memory: str = "device"

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
        """Outputs after the ys: ``(num_steps, overflowed)`` of a stacking loop."""
        return 2 if self.stacks else 0

    @property
    def read_only(self) -> list[bool]:
        """Per carry, whether the body passes it through unchanged (:func:`forwarded_carries`)."""
        return forwarded_carries(self.body, self.num_consts, self.num_carry)

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

    def operand_avals(self) -> list:
        """The avals of the operands (``[num_steps] + consts + carry + stacked xs``)."""
        body_in = C.in_avals_of(self.body)
        xs = [stacked_aval(a, self.length) for a in self.x_row_avals]
        return ([C.ShapedArray((), INT)] if self.counted else []) + body_in[: self.num_consts + self.num_carry] + xs

    def split(self, args: Sequence[Any]) -> tuple[Any, list, list, list]:
        """``(num_steps or None, consts, carry, xs)`` of an operand list."""
        n, rest = (args[0], args[1:]) if self.counted else (None, args)
        consts, carry, xs = C.split_list(rest, [self.num_consts, self.num_carry])
        return n, consts, carry, xs

    def join(self, n: Any, consts: Sequence, carry: Sequence, xs: Sequence) -> list:
        """The operand list of :meth:`split`'s parts."""
        return ([n] if self.counted else []) + [*consts, *carry, *xs]

    def split_out(self, outs: Sequence[Any]) -> tuple[list, list, list]:
        """``(carry, ys, extra)`` of an output list."""
        carry, ys, extra = C.split_list(outs, [self.num_carry, self.num_ys])
        return carry, ys, extra

    def out_avals(self) -> list:
        ys = [stacked_aval(a, self.length) for a in self.y_row_avals]
        extra = [C.ShapedArray((), INT), C.ShapedArray((), np.bool_)] if self.stacks else []
        return [*self.carry_avals, *ys, *extra]

    def params(self) -> dict:
        if self.prim is while_loop_p:
            return dict(cond_jaxpr=self.cond, body_jaxpr=self.body, num_consts=self.num_consts,
                        max_steps=self.max_steps, checkpoints=self.checkpoints,
                        checkpoint_memory=self.checkpoint_memory)
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
                    max_steps=params["max_steps"], checkpoints=params["checkpoints"],
                    checkpoint_memory=params["checkpoint_memory"])
    if prim is while_loop_stack_output_p:
        return Loop(prim, body, params["cond_jaxpr"], params["num_consts"], params["num_carry"],
                    length=params["max_steps"])
    return Loop(prim, body, None, params["num_consts"], params["num_carry"], length=params["length"],
                reverse=params["reverse"])


def stack_loop(cond: Any, body: Any, num_consts: int, num_carry: int, length: int) -> Loop:
    """A ``while_loop_stack_output`` of ``length`` rows."""
    return Loop(while_loop_stack_output_p, body, cond, num_consts, num_carry, length=length)


def counted_loop(body: Any, num_consts: int, num_carry: int, length: int, reverse: bool) -> Loop:
    """A ``counted_loop`` over stacks of ``length`` rows."""
    return Loop(counted_loop_p, body, None, num_consts, num_carry, length=length, reverse=reverse)
