"""``jaxaot._src.loops.differentiable``: every ``lax.while_loop`` of a traced program replaced by jaxaot's.

Library-style code runs its loops through ``lax.while_loop`` inside jitted entry
points, control flow, ``jax.checkpoint`` and custom derivatives; JAX's own
``jax.scipy.optimize`` through JAX's internal loop. Transformed, their gradients
must equal an unrolled ``lax.scan`` of the same steps (or float64 finite
differences), and where a loop cannot be rewritten the transform must say so.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxaot._src import compat as C
from jaxaot.errors import InvalidLoopOptionError, LoopFunctionError, LoopOverflowError, LoopRewriteError
from jaxaot._src.loops import differentiable, reraise_overflow

_SEED = int(np.random.SeedSequence().entropy % 2**31)


def _rng():
    return np.random.default_rng(_SEED)


def _step(c, a):
    return c[0] + 1, c[1] - 0.3 * (c[1] ** 3 - a) / (3 * c[1] ** 2)


def _solve(a):  # a cube root by damped Newton: its trip count depends on a
    return lax.while_loop(lambda c: jnp.abs(c[1] ** 3 - a) > 1e-4, lambda c: _step(c, a), (0, a))


def _unrolled(a, n):
    return lax.scan(lambda c, _: (_step(c, a), None), (0, a), None, length=n)[0][1]


@pytest.mark.parametrize("mode", [dict(max_steps=64), pytest.param(dict(checkpoints=3), marks=pytest.mark.slow),
                                  pytest.param(dict(max_steps=64, checkpoints=4), marks=pytest.mark.slow)])
def test_a_jitted_library_loop_differentiates_as_its_unrolled_steps(mode):
    a = jnp.float32(_rng().uniform(2.0, 6.0))
    library = jax.jit(lambda a: _solve(a)[1])
    library(a)  # its jit cache holds lax's loop already
    n = int(_solve(a)[0])
    got = jax.jit(jax.value_and_grad(differentiable(library, **mode)))(a)
    want = jax.value_and_grad(lambda a: _unrolled(a, n))(a)
    np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=f"seed {_SEED}")


@jax.custom_jvp
def _newton_sqrt(a):
    return lax.while_loop(lambda x: jnp.abs(x * x - a) > 1e-6, lambda x: 0.5 * (x + a / x), a)


@_newton_sqrt.defjvp
def _newton_sqrt_jvp(primals, tangents):  # a JVP rule with a loop on the tangent path
    (a,), (t,) = primals, tangents
    y = _newton_sqrt(a)
    return y, lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] * jnp.sqrt(0.5 / y)), (0, t))[1]


@jax.custom_vjp
def _cube_root(a):
    return _solve(a)[1]


_cube_root.defvjp(lambda a: (_solve(a)[1], _solve(a)[1]), lambda y, g: (g / (3 * y ** 2),))


def _everywhere(a):
    """Loops inside jit, cond, scan, jax.checkpoint, a custom_jvp (primal and rule), a custom_vjp, another loop."""
    x = jax.jit(lambda a: _solve(a)[1])(a)
    x = x + lax.cond(a > 0, lambda a: _solve(a + 1.0)[1], lambda a: a, a)
    x = x + lax.scan(lambda c, _: (c + _solve(c)[1] * 0.1, None), a, None, length=2)[0]
    x = x + jax.checkpoint(lambda a: _solve(a * 2.0)[1])(a)
    x = x + _newton_sqrt(a) + _cube_root(a)
    return x + lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + _solve(c[1])[1]), (0, a))[1]


def test_loops_in_calls_control_flow_checkpoints_custom_rules_and_loops():
    a = jnp.float32(_rng().uniform(2.0, 6.0))
    f = differentiable(_everywhere, max_steps=64)
    assert not [e for e in C.iter_eqns(jax.make_jaxpr(f)(a)) if e.primitive is C.lax_while_p]
    with jax.enable_x64(True):  # float64 central differences of the same program
        a64, eps = jnp.float64(a), 1e-6
        fd = (_everywhere(a64 + eps) - _everywhere(a64 - eps)) / (2 * eps)
    got = jax.grad(f)(a)
    np.testing.assert_allclose(f(a), _everywhere(a), rtol=1e-6)
    np.testing.assert_allclose(got, fd, rtol=2e-3, err_msg=f"seed {_SEED}")


@pytest.mark.slow  # 50 s on 2 cores: three nested loops of a 200-step bound compile in float64
def test_bfgs_of_jax_scipy_optimize():
    # minimize() runs JAX's internal while_loop (BFGS, its line search and zoom): not jax.lax.while_loop.
    from jax.scipy.optimize import minimize

    w = jnp.asarray(_rng().uniform(1.0, 3.0, 3))

    def fitted(p):
        def objective(x):
            return jnp.sum(w * (x - p) ** 2) + 0.1 * jnp.sum(x ** 4)
        return jnp.sum(minimize(objective, jnp.zeros_like(p), method="BFGS").x ** 2)

    with jax.enable_x64(True):
        p = jnp.asarray(_rng().uniform(-0.5, 0.5, 3), jnp.float64)
        got = jax.jit(jax.grad(differentiable(fitted, max_steps=200)))(p)
        eps = 1e-6
        fd = jnp.stack([(fitted(p + eps * e) - fitted(p - eps * e)) / (2 * eps) for e in jnp.eye(3)])
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-8, err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("solver,options", [("gmres", dict(restart=3)),
                                            ("gmres", dict(restart=3, solve_method="batched")),
                                            ("bicgstab", dict()), ("cg", dict())])
def test_krylov_solvers_of_jax_scipy(solver, options):
    # GMRES nests its loops four deep (restarts, Arnoldi steps, reorthogonalization), conditions reading
    # residual norms; cg and bicgstab run one. Gradients w.r.t. the matrix and the right-hand side equal
    # those of a dense solve.
    from jax.scipy.sparse import linalg

    rng, n = _rng(), 6
    a = jnp.asarray(np.eye(n) * 3.0 + rng.normal(size=(n, n)) * 0.3, jnp.float32)
    b = jnp.asarray(rng.normal(size=n), jnp.float32)

    def loss(a, b, solve):
        m = a @ a.T if solver == "cg" else a  # cg wants a symmetric positive definite matrix
        return jnp.sum(jnp.sin(solve(m, b)))

    def krylov(m, b):
        return getattr(linalg, solver)(lambda v: m @ v, b, tol=1e-7, atol=0.0, **options)[0]

    got = jax.grad(differentiable(lambda a, b: loss(a, b, krylov), max_steps=100), (0, 1))(a, b)
    want = jax.grad(lambda a, b: loss(a, b, jnp.linalg.solve), (0, 1))(a, b)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-5, custom_message=f"seed {_SEED}")


@pytest.mark.slow  # 6 s
def test_fori_loop_with_dynamic_bounds_under_vmap_and_grad():
    xs = jnp.asarray(_rng().uniform(0.5, 1.5, 3), jnp.float32)
    ns = jnp.array([2, 5, 0], jnp.int32)
    f = differentiable(lambda x, n: lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * 1.1 + 0.01 * i, x),
                       max_steps=8)
    ref = [jax.grad(lambda x: lax.fori_loop(0, int(n), lambda i, c: jnp.sin(c) * 1.1 + 0.01 * i, x))(x)
           for x, n in zip(xs, ns)]
    np.testing.assert_allclose(jax.vmap(jax.grad(f))(xs, ns), ref, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda xs: jax.vmap(f)(xs, ns).sum())(xs), ref, rtol=1e-5)


@pytest.mark.slow  # 4 s
def test_a_loop_vmapped_before_the_rewrite():
    # vmap inside fn: lax batches the predicate, and the rewrite keeps finished lanes as they are.
    a = jnp.asarray(_rng().uniform(2.0, 6.0, 4), jnp.float32)
    f = differentiable(lambda a: jax.vmap(lambda a: _solve(a)[1])(a).sum(), max_steps=64)
    ref = [jax.grad(lambda a: _unrolled(a, int(_solve(a)[0])))(x) for x in a]
    np.testing.assert_allclose(jax.grad(f)(a), ref, rtol=2e-5)


def test_the_options_are_part_of_the_program():
    a = jnp.float32(_rng().uniform(2.0, 6.0))
    library = jax.jit(lambda a: _solve(a)[1])
    n = int(_solve(a)[0])
    # tight: well below the trip count (a jitted loop may round its way to one step fewer or more than eagerly)
    roomy, tight = (jax.jit(jax.grad(differentiable(library, max_steps=m))) for m in (64, max(n // 2, 1)))
    np.testing.assert_allclose(roomy(a), jax.grad(lambda a: _unrolled(a, n))(a), rtol=2e-5)
    with pytest.raises(LoopOverflowError), reraise_overflow():
        jax.block_until_ready(tight(a))  # never the 64-step program
    np.testing.assert_allclose(roomy(a), jax.grad(lambda a: _unrolled(a, n))(a), rtol=2e-5)


def test_static_leaves_pass_through():
    def fn(x, config):
        y = lax.while_loop(lambda c: c[0] < config["steps"], lambda c: (c[0] + 1, c[1] * config["scale"]), (0, x))[1]
        return {"y": y, "name": config["name"]}

    f = differentiable(fn, max_steps=8)
    out = f(jnp.float32(1.5), {"steps": 3, "scale": 2.0, "name": "solver"})
    assert out["name"] == "solver" and float(out["y"]) == 12.0
    g = jax.grad(lambda x: f(x, {"steps": 3, "scale": 2.0, "name": "solver"})["y"])(jnp.float32(1.5))
    assert float(g) == 8.0


def test_refusals():
    from jax.custom_batching import custom_vmap

    @custom_vmap
    def opaque(x):  # custom_vmap's batching rule is Python: the rewrite cannot reach its loops
        return lax.while_loop(lambda c: c < 3.0, lambda c: c + x, 0.0)

    opaque.def_vmap(lambda size, batched, x: (x * 2.0, True))
    with pytest.raises(LoopRewriteError, match="custom_vmap"):
        differentiable(opaque, max_steps=8)(1.0)
    with pytest.raises(InvalidLoopOptionError, match="max_steps"):
        differentiable(_solve, max_steps=-1)
    with pytest.raises(LoopFunctionError, match="callable"):
        differentiable(3, max_steps=8)


@pytest.mark.slow  # 40 s: a fresh process compiles BFGS's three nested loops
def test_bfgs_at_500_steps_needs_megabytes_not_gigabytes():
    # Each nested loop's forward is recomputed in its outer loop's backward, so memory is linear in each
    # bound, not 500**3 rows (jaxaot._src.loops.partial_eval.recompute_inner_loops): the compiled program's
    # memory stays far below 1 GiB, and so does the fresh process's peak (compiling it included; 0.6 GiB
    # on a 2-core CPU, where XLA's compiler holds most of it), or the accelerator's allocator's peak.
    script = textwrap.dedent("""
        import resource, jax, jax.numpy as jnp, jaxaot
        from jax.scipy.optimize import minimize
        def fitted(p):
            objective = lambda x: jnp.sum((x - p) ** 2 * jnp.arange(1, 1 + p.size)) + 0.1 * jnp.sum(x ** 4)
            return minimize(objective, 0 * p, method="BFGS").x.sum()
        p = jnp.linspace(-0.5, 0.5, 8)
        compiled = jax.jit(jax.grad(jaxaot.loops.differentiable(fitted, max_steps=500))).lower(p).compile()
        m = compiled.memory_analysis()
        assert bool(jnp.all(jnp.isfinite(compiled(p))))
        stats = jax.devices()[0].memory_stats()
        peak = stats["peak_bytes_in_use"] if stats else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes, peak)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    program, peak = (int(v) for v in r.stdout.split()[-2:])
    assert program < 2**26, f"program {program / 2**20:.1f} MiB"  # 1 MiB of temporaries
    assert peak < 2**31, f"peak {peak / 2**20:.0f} MiB"
