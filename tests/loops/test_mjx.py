"""Gradients through a physics engine's constraint solver: MuJoCo MJX, and its failure mode in miniature.

MJX's solver is a ``lax.while_loop`` with convergence stopping, and its body runs a
line search as a masked scan whose *condition* reads a tolerance ``2 sqrt(rows_0 *
rows_2)``: at a state where that product is 0 the tolerance's derivative is
infinite. Reverse mode must never transpose that dead tangent (``0 * inf = nan``);
the linear body is dead-code-eliminated before reverse mode
(``jaxaot._src.loops.partial_eval._prune_residuals``).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import jaxaot

#: Every reverse mode: stacking, online binomial (several k), nested scans, and the bounded binomial schedule.
MODES = [dict(max_steps=20), dict(checkpoints=1), dict(checkpoints=3), dict(max_steps=20, checkpoints=10),
         dict(max_steps=20, checkpoints=2)]


def _masked_scan(cond, body, x, n):  # MJX's solver._while_loop_scan: the steps after cond fails do nothing
    def step(state, _):
        v, go = state
        return lax.cond(go, lambda v: (body(v), cond(body(v))), lambda v: (v, False), v), None

    return lax.scan(step, (x, cond(x)), None, length=n)[0][0]


def _solver_step(c):
    i, x = c
    tol = 2.0 * jnp.sqrt(jnp.maximum(x - 1.0, 0.0))  # sqrt at 0 while x <= 1; read only by a condition
    y = _masked_scan(lambda y: jnp.abs(y - x) > tol + 0.1, lambda y: 0.5 * (y + x), 0.0, 4)
    return i + 1, x * 0.9 + 0.1 * y


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_a_tangent_that_only_feeds_a_condition_is_never_transposed(mode):
    f = lambda x: jaxaot.loops.while_loop(lambda c: c[0] < 3, _solver_step, (0, x), **mode)[1]  # noqa: E731
    ref = jax.grad(lambda x: lax.fori_loop(0, 3, lambda i, c: _solver_step(c), (0, x))[1])(0.5)
    chex.assert_trees_all_close(jax.jit(jax.grad(f))(0.5), ref, rtol=1e-6)
    if mode == dict(checkpoints=3):  # eager too: no jit, no DCE pass of JAX's before the transpose
        chex.assert_trees_all_close(jax.grad(f)(0.5), ref, rtol=1e-6)


_SCENE = """
<mujoco>
  <option timestep="0.01" iterations="20" ls_iterations="4"/>
  <worldbody>
    <geom type="plane" size="1 1 .1" contype="2" conaffinity="1"/>
    <body pos="0 0 0.1"><joint type="slide" axis="1 0 0"/><joint type="slide" axis="0 0 1"/>
      <geom type="sphere" size=".1" mass="1" contype="1" conaffinity="2"/></body>
    <body pos="0.5 0 0.1"><joint type="slide" axis="1 0 0"/><joint type="slide" axis="0 0 1"/>
      <geom type="sphere" size=".1" mass="1" contype="1" conaffinity="2"/></body>
  </worldbody>
</mujoco>
"""


def test_mjx_contact_gradients_equal_the_masked_scan_in_every_mode():
    # Two balls on a plane, one lifting off (its contact rows go inactive, where the line
    # search's tolerance has an infinite derivative) and one resting; the gradient of the
    # next mjx.step w.r.t. two velocities, through the solver's while loop in every mode,
    # against MJX's own masked scan. All in one program: one compilation (MJX compiles slowly).
    mujoco = pytest.importorskip("mujoco")
    mjx = pytest.importorskip("mujoco.mjx")
    from mujoco.mjx._src import solver

    model = mujoco.MjModel.from_xml_string(_SCENE)
    data = mujoco.MjData(model)
    data.qvel[1] = 2.0  # the first ball moves up
    mujoco.mj_step(model, data)
    mujoco.mj_step(model, data)
    mx, start = mjx.put_model(model), mjx.put_data(model, data)

    def loss(v):
        d = start.replace(qvel=start.qvel.at[1].add(v[0]).at[2].add(v[1]))
        return jnp.sum(mjx.step(mx, d).qpos)

    def grads(v):
        lax_loop = jax.lax.while_loop
        jax.lax.while_loop = lambda c, b, x: solver._while_loop_scan(c, b, x, model.opt.iterations)
        try:
            ref = jax.grad(loss)(v)
        finally:
            jax.lax.while_loop = lax_loop
        out = []
        for mode in MODES:
            with jaxaot.loops.patch_while_loop(**mode):
                out.append(jax.grad(loss)(v))
        return ref, out

    fast = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)
    ref, got = jax.jit(grads).lower(jnp.zeros(2)).compile(compiler_options=fast)(jnp.zeros(2))
    assert bool(jnp.all(jnp.isfinite(ref))) and float(jnp.abs(ref[1])) > 1e-3  # the contact matters
    for mode, g in zip(MODES, got):
        chex.assert_trees_all_close(g, ref, rtol=1e-4, atol=1e-6, custom_message=str(mode))
