"""optimistix's root finds, fixed points and minimisations with jaxaot's loops, against its own
``RecursiveCheckpointAdjoint`` gradients.

optimistix runs its solver loop through an adjoint's ``apply``. Here one that runs it as a plain
``lax.while_loop`` (through ``equinox.internal.while_loop(kind="lax")``, and no implicit
function theorem) is reverse-differentiated under ``jaxaot.loops.differentiable``: the
gradient of the unrolled iterations, which ``RecursiveCheckpointAdjoint`` computes too. Float64;
the lane is ``slow`` (each case compiles a solver and its gradient).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

optx = pytest.importorskip("optimistix", reason="optimistix is not installed (pip install -e '.[integration]')")
eqxi = pytest.importorskip("equinox.internal", reason="equinox is not installed (pip install -e '.[integration]')")

import jaxaot  # noqa: E402

pytestmark = pytest.mark.slow

_SEED = int(np.random.SeedSequence().entropy % 2**31)


class _LaxLoop(optx.AbstractAdjoint):
    """Run the solver's loop as ``lax.while_loop``: reverse mode differentiates its iterations."""

    def apply(self, primal_fn, rewrite_fn, inputs, tags):
        del rewrite_fn, tags
        return primal_fn(inputs + (functools.partial(eqxi.while_loop, kind="lax"),))


def _root(p, adjoint, solver):
    return optx.root_find(lambda y, p: y ** 3 + p[0] * y - p[1], solver, jnp.ones(2), args=p, adjoint=adjoint,
                          max_steps=64, throw=False).value


def _fixed_point(p, adjoint, solver):
    return optx.fixed_point(lambda y, p: jnp.cos(p[0] * y) * p[1], solver, jnp.zeros(2), args=p, adjoint=adjoint,
                            max_steps=256, throw=False).value


def _minimise(p, adjoint, solver):
    return optx.minimise(lambda y, p: jnp.sum((y - p[0]) ** 2 * p[1]) + 0.1 * jnp.sum(y ** 4), solver, jnp.zeros(2),
                         args=p, adjoint=adjoint, max_steps=128, throw=False).value


CASES = {
    "root_newton": (_root, lambda: optx.Newton(rtol=1e-10, atol=1e-10)),
    "root_chord": (_root, lambda: optx.Chord(rtol=1e-10, atol=1e-10)),
    "fixed_point_iteration": (_fixed_point, lambda: optx.FixedPointIteration(rtol=1e-10, atol=1e-10)),
    "minimise_bfgs": (_minimise, lambda: optx.BFGS(rtol=1e-8, atol=1e-8)),
    "minimise_nonlinear_cg": (_minimise, lambda: optx.NonlinearCG(rtol=1e-8, atol=1e-8)),
}


@pytest.mark.parametrize("mode", [dict(max_steps=256), dict(checkpoints=6)], ids=["max_steps", "checkpoints"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_equals_recursive_checkpoint_adjoint(case, mode):
    solve, solver = CASES[case]
    with jax.enable_x64(True):
        p = jnp.asarray(np.random.default_rng(_SEED).uniform(0.5, 1.5, (2, 2)))
        loss = lambda p, adjoint: jnp.sum(solve(p, adjoint, solver()) ** 2)  # noqa: E731
        ref = jax.jit(jax.grad(functools.partial(loss, adjoint=optx.RecursiveCheckpointAdjoint())))(p)
        got = jax.jit(jax.grad(jaxaot.loops.differentiable(functools.partial(loss, adjoint=_LaxLoop()), **mode)))(p)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12, err_msg=f"seed {_SEED}")
