"""``dynamic_capacity``: which loops it sizes, where their trip counts go, and bad input."""

from __future__ import annotations

import threading

import jax
import pytest

from jaxaot.errors import InvalidLoopOptionError, ReverseModeBoundError
from jaxaot._src.loops.wrappers import while_loop
from jaxaot._src.loops.capacity import dynamic_capacity


def _unbounded(x, n=3):
    return while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]


def _trip_count(x, capacity):
    with dynamic_capacity(capacity) as trips:
        jax.grad(_unbounded)(x)
    (trip,) = trips
    return trip


@pytest.mark.parametrize("bad, message", [(0, "must be a positive int, got 0"),
                                          (None, "must be a positive Python int, got NoneType None"),
                                          ("8", "must be a positive Python int, got str '8'"),
                                          (True, "must be a positive Python int, got bool True")])
def test_dynamic_capacity_rejects_bad_capacity_when_called(bad, message):
    with pytest.raises(InvalidLoopOptionError, match=f"dynamic_capacity: capacity {message}"):
        dynamic_capacity(bad)  # not only when the block is entered


def test_trip_count_or_capacity_plus_one():
    assert int(jax.jit(lambda x: _trip_count(x, 8))(1.0)) == 3
    assert int(jax.jit(lambda x: _trip_count(x, 2))(1.0)) == 3  # capacity + 1: "needed more"


def test_the_innermost_context_sizes_the_loop():
    with dynamic_capacity(8) as outer:
        with dynamic_capacity(4) as inner:
            jax.make_jaxpr(jax.grad(_unbounded))(1.0)
        assert len(inner) == 1 and not outer
    with pytest.raises(ReverseModeBoundError):  # the contexts are closed again
        jax.grad(_unbounded)(1.0)


def test_contexts_are_per_thread():
    errors = []

    def other_thread():
        try:
            jax.make_jaxpr(jax.grad(_unbounded))(1.0)
        except ReverseModeBoundError as e:
            errors.append(e)

    with dynamic_capacity(8) as trips:
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert len(errors) == 1 and not trips
