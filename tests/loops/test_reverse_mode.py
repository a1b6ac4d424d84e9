"""One decision picks each loop's reverse mode from its options, the settings and the platform."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.loops import common, segments
from jaxaot._src.loops.reverse_mode import MODES, reverse_mode


def _loop(**options):
    """The Loop of ``jaxaot.loops.while_loop`` with ``options``, as its primitive's rules see it."""
    f = lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x), **options)
    (eqn,) = [e for e in jax.make_jaxpr(f)(jnp.ones(4)).eqns if e.primitive in common.LOOP_PRIMITIVES]
    return common.loop_of(eqn.primitive, eqn.params)


@pytest.mark.parametrize("options, setting, mode", [
    ({}, {}, "unbounded"),
    ({"max_steps": 64}, {}, "stack"),
    ({"checkpoints": 4}, {}, "checkpointed"),
    ({"max_steps": 100, "checkpoints": 16}, {"offline_schedule": "nested"}, "nested"),
    ({"max_steps": 64, "checkpoints": 2}, {"offline_schedule": "nested"}, "checkpointed"),  # no nested plan fits
    ({"max_steps": 100, "checkpoints": 16}, {"offline_schedule": "binomial"}, "checkpointed"),
])
def test_each_option_picks_its_mode(options, setting, mode):
    with jaxaot.config.override(**setting):
        assert reverse_mode(_loop(**options)) == mode
    assert mode in MODES


def test_a_run_time_capacity_bounds_a_loop_and_a_large_stack_runs_in_segments_where_set():
    loop = _loop()
    with jaxaot.loops.dynamic_capacity(16):
        assert reverse_mode(loop) == "stack"
    big = _loop(max_steps=1 << 14)
    row = [jax.ShapeDtypeStruct((1024,), jnp.float32)]  # 4 KiB a step: 64 MiB over the bound
    for on in (True, False):
        with jaxaot.config.override(stack_segments=on):
            assert reverse_mode(big, row) == ("segments" if on else "stack")
            assert (segments.applies(big, row) is not None) == on
