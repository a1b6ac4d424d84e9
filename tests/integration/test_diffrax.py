"""diffrax's solvers with jaxaot's loops: reverse mode through ``diffrax.ForwardMode`` (plain
``lax.while_loop`` steps, not reverse-differentiable by themselves) under
``jaxaot.loops.differentiable``, against diffrax's own ``RecursiveCheckpointAdjoint`` gradients.

Float64, where both differentiate the same discrete solve (adaptive step control and, for
implicit solvers, their Newton iterations included): they must agree to rounding. Each case
compiles a diffrax solve and its gradient (10-30 s on 2 cores): the lane is ``slow``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

dfx = pytest.importorskip("diffrax", reason="diffrax is not installed (pip install -e '.[integration]')")

import jaxaot  # noqa: E402

pytestmark = pytest.mark.slow

_SEED = int(np.random.SeedSequence().entropy % 2**31)
SOLVERS = {"euler": dfx.Euler, "heun": dfx.Heun, "tsit5": dfx.Tsit5, "dopri5": dfx.Dopri5, "dopri8": dfx.Dopri8,
           "kvaerno5": dfx.Kvaerno5}
SAVEAT = {"t1": lambda: dfx.SaveAt(t1=True), "ts": lambda: dfx.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
          "steps": lambda: dfx.SaveAt(steps=True)}
MODES = {"max_steps": dict(max_steps=1024), "checkpoints": dict(checkpoints=8),
         "max_steps_checkpoints": dict(max_steps=1024, checkpoints=8)}


def _loss(args, y0, solver: str, saveat: str, adjoint):
    # A damped oscillator with a forcing term: a, b, c parametrise it, y0 starts it.
    def field(t, y, p):
        return jnp.stack([y[1], -p[0] * y[0] - p[1] * y[1] + p[2] * jnp.sin(t)])

    fixed = solver in ("euler", "heun")  # Heun's error estimate needs about 800 adaptive steps here
    sol = dfx.diffeqsolve(
        dfx.ODETerm(field), SOLVERS[solver](), 0.0, 2.0, 0.05 if fixed else 0.1, y0, args=args,
        stepsize_controller=dfx.ConstantStepSize() if fixed else dfx.PIDController(rtol=1e-5, atol=1e-7),
        saveat=SAVEAT[saveat](), adjoint=adjoint, max_steps=1024)
    ys = jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0)  # SaveAt(steps=True) pads with inf
    return jnp.sum(ys ** 2)


def _inputs(lanes: int):
    rng = np.random.default_rng(_SEED)
    return (jnp.asarray(rng.uniform(0.5, 2.0, (lanes, 3))), jnp.asarray(rng.uniform(-1.0, 1.0, (lanes, 2))))


def _check(solver: str, saveat: str, mode: dict, batch_outside: bool):
    args, y0 = _inputs(3)
    ref = jax.jit(jax.vmap(jax.grad(lambda a, y: _loss(a, y, solver, saveat, dfx.RecursiveCheckpointAdjoint()),
                                    argnums=(0, 1))))(args, y0)
    f = jaxaot.loops.differentiable(lambda a, y: _loss(a, y, solver, saveat, dfx.ForwardMode()), **mode)
    if batch_outside:  # vmap(grad): each lane its own trip count
        got = jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1))))(args, y0)
    else:  # grad(vmap): one loop runs until every lane stopped
        got = jax.jit(jax.grad(lambda a, y: jnp.sum(jax.vmap(f)(a, y)), argnums=(0, 1)))(args, y0)
    # On a CPU both programs round alike: equal to rounding. A GPU's compiler autotunes each program's
    # matmul algorithms by timing, so the two may round differently, and an adaptive step controller
    # can turn that into another accepted step (4e-5 relative seen on an H200 under load; equal when alone).
    rtol = 1e-10 if jax.default_backend() == "cpu" else 1e-4
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=1e-12, err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("saveat", sorted(SAVEAT))
def test_vmap_of_grad_equals_recursive_checkpoint_adjoint(solver, saveat):
    with jax.enable_x64(True):
        _check(solver, saveat, MODES["max_steps"], batch_outside=True)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_grad_of_vmap_in_every_mode(mode):
    with jax.enable_x64(True):
        _check("tsit5", "ts", MODES[mode], batch_outside=False)
