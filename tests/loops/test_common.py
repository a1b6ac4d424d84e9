"""The ``Loop`` view of a loop eqn's parameters and operands."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxaot._src import compat as C
from jaxaot._src.loops.wrappers import while_loop, while_loop_stack_output
from jaxaot._src.loops.common import LOOP_PRIMITIVES, counted_loop, loop_of


def _loop_eqns(closed):
    return [e for e in C.iter_eqns(closed) if e.primitive in LOOP_PRIMITIVES]


def test_params_round_trip_for_every_primitive():
    def f(x):
        y = while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1]) * x), (0, x), max_steps=4)[1]
        z, _ = while_loop_stack_output(lambda c: c < 2.0, lambda c: c + y, 0.0, max_steps=3)
        return z.sum()

    eqns = _loop_eqns(jax.make_jaxpr(lambda x: (f(x), jax.grad(f)(x)))(1.0))  # reverse mode adds counted loops
    assert {e.primitive for e in eqns} == set(LOOP_PRIMITIVES)
    for eqn in eqns:
        loop = loop_of(eqn.primitive, eqn.params)
        assert loop.params() == eqn.params
        assert [v.aval for v in eqn.outvars] == loop.out_avals()
        n, consts, carry, xs = loop.split(eqn.invars)
        assert loop.join(n, consts, carry, xs) == eqn.invars
        assert len(consts) == loop.num_consts and len(carry) == loop.num_carry and len(xs) == loop.num_xs
        carry_out, ys, extra = loop.split_out(eqn.outvars)
        assert (len(carry_out), len(ys), len(extra)) == (loop.num_carry, loop.num_ys, loop.num_extra)


@pytest.mark.parametrize("reverse", [False, True])
def test_counted_loop_binds_its_own_params(reverse):
    body = jax.make_jaxpr(lambda c, x: [c + x, c])(0.0, 0.0)
    loop = counted_loop(body, num_consts=0, num_carry=1, length=3, reverse=reverse)
    c, ys = loop.bind(loop.join(2, [], [0.0], [jnp.array([1.0, 2.0, 4.0])]))
    assert float(c) == 3.0
    assert ys.tolist() == ([2.0, 0.0, 0.0] if reverse else [0.0, 1.0, 0.0])


@pytest.mark.parametrize("option", ["max_steps", "checkpoints"])
def test_counts_beyond_int32_are_refused_at_the_option_check(option):
    from jaxaot._src.loops import dynamic_capacity
    from jaxaot._src.loops.common import MAX_COUNT
    from jaxaot.errors import InvalidLoopOptionError

    loop = lambda x, n: while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x), **{option: n})  # noqa: E731
    for n in (MAX_COUNT + 1, 2**31, 2**40):
        with pytest.raises(InvalidLoopOptionError, match=f"{option} must be at most 2\\*\\*31 - 2.*int32"):
            jax.grad(lambda x: loop(x, n)[1])(0.5)
    with pytest.raises(InvalidLoopOptionError, match="at most"):
        while_loop_stack_output(lambda c: c < 2.0, lambda c: c + 1.0, 0.0, max_steps=2**31)
    with pytest.raises(InvalidLoopOptionError, match=r"max_steps must be a positive Python int, got float"):
        while_loop_stack_output(lambda c: c < 2.0, lambda c: c + 1.0, 0.0, max_steps=2.0)  # required: no "or None"
    with pytest.raises(InvalidLoopOptionError, match="at most"):
        with dynamic_capacity(2**31):
            pass
    ref = jax.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(jnp.sin(jnp.sin(x))))))(0.5)
    assert jnp.allclose(jax.grad(lambda x: loop(x, 64)[1])(0.5), ref)


def test_checkpoints_beyond_the_schedule_table_s_int32_index_are_refused_when_the_loop_is_called():
    """The online schedule's table has 1025 entries per snapshot, indexed by int32: a count whose index would
    overflow is refused with the largest one, before the forward runs (not as an overflow inside the gradient)."""
    from jaxaot._src.loops.common import MAX_CHECKPOINTS
    from jaxaot.errors import InvalidLoopOptionError

    assert (MAX_CHECKPOINTS + 2) * 1025 <= 2**31 - 1 < (MAX_CHECKPOINTS + 3) * 1025
    for k in (MAX_CHECKPOINTS + 1, 10**8):
        with pytest.raises(InvalidLoopOptionError, match=f"checkpoints must be at most {MAX_CHECKPOINTS}"):
            while_loop(lambda s: s < 10.0, lambda s: s * 1.5 + 1, 0.0, checkpoints=k)
