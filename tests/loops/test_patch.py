"""``patch_while_loop``: a library's ``jax.lax.while_loop`` swapped for jaxaot's.

The "third-party" solvers below are written as a library would write them: they
call ``jax.lax.while_loop`` (looked up at call time) and stop on convergence.
Patched, their forward results and gradients must equal a ``lax.scan`` of the same
body unrolled to the trip count the loop ran.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot
import jaxaot._src.loops
from jaxaot._src import compat as C
from jaxaot.errors import InvalidLoopOptionError, LoopOverflowError


# --------------------------------------------------------------------------- the "library"
def newton_step(a, b):
    """One Newton step on ``x**3 + a*x - b = 0``; the carry is ``(iteration, x)``."""
    def step(c):
        i, x = c
        return i + 1, x - (x ** 3 + a * x - b) / (3 * x ** 2 + a)
    return step


def newton_solve(a, b, tol=1e-5, maxiter=50):
    step = newton_step(a, b)
    cond = lambda c: (jnp.abs(c[1] ** 3 + a * c[1] - b) > tol) & (c[0] < maxiter)  # noqa: E731
    return jax.lax.while_loop(cond, step, (0, b))


def pgd_step(A, y, lo, hi, lr):
    """One projected-gradient step on ``0.5 |A w - y|^2`` over the box ``[lo, hi]``."""
    def step(c):
        i, w, _ = c
        new = jnp.clip(w - lr * A.T @ (A @ w - y), lo, hi)
        return i + 1, new, jnp.max(jnp.abs(new - w))
    return step


def pgd_solve(A, y, lo=-0.5, hi=0.5, lr=0.1, tol=1e-4, maxiter=200):
    step = pgd_step(A, y, lo, hi, lr)
    w0 = jnp.zeros(A.shape[1], A.dtype)
    return jax.lax.while_loop(lambda c: (c[2] > tol) & (c[0] < maxiter), step, (0, w0, jnp.asarray(jnp.inf, A.dtype)))


# --------------------------------------------------------------------------- helpers
def _unrolled(step, init, n):
    return lax.scan(lambda c, _: (step(c), None), init, None, length=n)[0]


def _rng():
    return np.random.default_rng(np.random.SeedSequence().entropy)


@pytest.mark.parametrize("mode", [dict(max_steps=64), dict(checkpoints=4)])
def test_patched_newton_solver_matches_unrolled_scan(mode):
    a, b = (jnp.float32(v) for v in _rng().uniform(0.5, 2.0, 2))
    n = int(newton_solve(a, b)[0])
    ref = lambda a, b: _unrolled(newton_step(a, b), (0, b), n)[1]  # noqa: E731
    with jaxaot.loops.patch_while_loop(**mode):
        x, g = jax.jit(jax.value_and_grad(lambda a, b: newton_solve(a, b)[1], argnums=(0, 1)))(a, b)
    np.testing.assert_allclose(x, ref(a, b), rtol=1e-6)
    np.testing.assert_allclose(g, jax.grad(ref, argnums=(0, 1))(a, b), rtol=1e-4)


def test_patched_projected_gradient_solver_matches_unrolled_scan():
    rng = _rng()
    A = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    y = jnp.asarray(rng.normal(size=6), jnp.float32)
    n = int(pgd_solve(A, y)[0])
    init = (0, jnp.zeros(4), jnp.float32(jnp.inf))
    ref = lambda A, y: jnp.sum(_unrolled(pgd_step(A, y, -0.5, 0.5, 0.1), init, n)[1] ** 2)  # noqa: E731
    with jaxaot.loops.patch_while_loop(max_steps=256):
        loss = jax.jit(lambda A, y: jnp.sum(pgd_solve(A, y)[1] ** 2))
        g = jax.grad(loss, argnums=(0, 1))(A, y)
    np.testing.assert_allclose(loss(A, y), ref(A, y), rtol=1e-5)
    for got, want in zip(g, jax.grad(ref, argnums=(0, 1))(A, y)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _loop_options(fn, *args):
    """``(max_steps, checkpoints)`` of each loop in ``fn``'s program; ``"lax"`` for a ``lax.while_loop``."""
    eqns = C.iter_eqns(jax.make_jaxpr(fn)(*args))
    return [(e.params["max_steps"], e.params["checkpoints"]) if str(e.primitive) == "while_loop" else "lax"
            for e in eqns if str(e.primitive) in ("while", "while_loop")]


def test_blocks_nest_and_end_even_on_error():
    x = jnp.float32(_rng().uniform(1.0, 3.0))
    with pytest.raises(ZeroDivisionError):
        with jaxaot.loops.patch_while_loop(max_steps=8):
            assert _loop_options(newton_solve, x, x) == [(8, None)]
            with jaxaot.loops.patch_while_loop(checkpoints=2):  # the innermost options apply
                assert _loop_options(newton_solve, x, x) == [(None, 2)]
            assert _loop_options(newton_solve, x, x) == [(8, None)]
            1 / 0
    assert _loop_options(newton_solve, x, x) == ["lax"]


def test_patch_checks_its_options():
    x = jnp.float32(1.5)
    with jaxaot.loops.patch_while_loop(max_steps=8, checkpoints=2):  # any k: the bounded binomial schedule
        assert _loop_options(newton_solve, x, x) == [(8, 2)]
    with jaxaot.loops.patch_while_loop(max_steps=8, checkpoints=6):  # nested scans fit
        assert _loop_options(newton_solve, x, x) == [(8, 6)]
    with pytest.raises(InvalidLoopOptionError, match="positive"):
        jaxaot.loops.patch_while_loop(max_steps=0)  # refused when called, before any block


def test_no_jit_cache_serves_another_blocks_program():
    # A library's jitted entry point: traced once before the block (lax's loop), then in blocks of
    # other options. Each block traces it again (the options are part of every jit key).
    a, b = (jnp.float32(v) for v in _rng().uniform(0.5, 2.0, 2))
    solve = jax.jit(lambda a, b: newton_solve(a, b)[1])
    n = int(newton_solve(a, b)[0])
    ref = jax.grad(lambda a: _unrolled(newton_step(a, b), (0, b), n)[1])(a)
    solve(a, b)  # a plain forward call first: its program has lax's loop
    with jaxaot.loops.patch_while_loop(max_steps=64):
        np.testing.assert_allclose(jax.grad(solve)(a, b), ref, rtol=1e-4)
    with jaxaot.loops.patch_while_loop(max_steps=n - 1):  # too few steps: an overflow, never the 64-step program
        with pytest.raises(LoopOverflowError), jaxaot._src.loops.reraise_overflow():
            jax.block_until_ready(jax.grad(solve)(a, b))
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(solve)(a, b)  # after the blocks: lax's loop again


def test_every_caller_of_jaxs_while_is_reached():
    # Code that bound JAX's loop before the block, JAX's internal loop, and fori_loop with dynamic bounds.
    from jax._src.lax.control_flow.loops import while_loop as internal_while_loop

    x = jnp.float32(_rng().uniform(0.5, 1.5))
    n = jnp.int32(5)
    ref = jax.grad(lambda x: _unrolled(lambda c: jnp.sin(c) * 1.1, x, 5))(x)
    with jaxaot.loops.patch_while_loop(max_steps=16):
        g1 = jax.grad(lambda x: internal_while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1]) * 1.1),
                                                    (0, x))[1])(x)
        g2 = jax.grad(lambda x: lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * 1.1, x))(x)
    np.testing.assert_allclose(g1, ref, rtol=1e-5)
    np.testing.assert_allclose(g2, ref, rtol=1e-5)


def test_swapped_in_directly_there_is_no_recursion(monkeypatch):
    # What users do by hand: the attribute replaced for good, jaxaot's own loops included.
    monkeypatch.setattr(jax.lax, "while_loop", jaxaot.loops.while_loop)
    monkeypatch.setattr(jax.lax, "fori_loop", lambda *a, **k: pytest.fail("jaxaot called jax.lax.fori_loop"))
    x = jnp.float32(_rng().uniform(0.5, 1.5))
    f = lambda x: jaxaot.loops.while_loop(lambda c: c[1] < 9.0, lambda c: (c[0] + 1, c[1] * 1.5 + x), (0, x),  # noqa: E731
                                    checkpoints=3)[1]
    n = int(lax.while_loop(lambda c: c[1] < 9.0, lambda c: (c[0] + 1, c[1] * 1.5 + x), (0, x))[0])
    ref = lambda x: _unrolled(lambda c: (c[0] + 1, c[1] * 1.5 + x), (0, x), n)[1]  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x), jax.grad(ref)(x), rtol=1e-5)


def test_real_library_solver_under_patch():
    """jaxopt keeps its solvers' loop in ``jax.lax.while_loop`` (no reverse mode
    unless unrolled into a scan): patched, its gradient equals its unrolled scan's."""
    jaxopt = pytest.importorskip("jaxopt")  # the [integration] extra
    rng = _rng()
    X = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
    t = jnp.asarray(rng.normal(size=8), jnp.float32)

    def fit(lam, unroll):
        ridge = lambda w, lam: jnp.mean((X @ w - t) ** 2) + lam * jnp.sum(w ** 2)  # noqa: E731
        solver = jaxopt.GradientDescent(ridge, stepsize=0.1, maxiter=60, tol=1e-3, implicit_diff=False,
                                        unroll=unroll, jit=True)
        return jnp.sum(solver.run(jnp.zeros(3), lam).params)

    lam = jnp.float32(rng.uniform(0.1, 0.5))
    with pytest.raises(ValueError):
        jax.grad(fit)(lam, False)  # lax.while_loop refuses reverse mode
    with jaxaot.loops.patch_while_loop(max_steps=64):
        got, g = jax.value_and_grad(fit)(lam, False)
    want, g_ref = jax.value_and_grad(fit)(lam, True)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4)


def test_jax_s_refusal_of_a_lax_loop_gradient_is_kept_and_says_how_jaxaot_takes_it():
    """The same ``ValueError`` as ``jax.grad``'s (a drop-in raises what it replaces), with a note naming jaxaot's
    remedies, from every gradient: the eager one, an ``aot_function``'s and compiled autograd's."""
    def f(a):
        return lax.while_loop(lambda s: s < 10 * a, lambda s: s * 1.5, a)

    a = jnp.float32(np.random.default_rng().uniform(0.5, 2.0))
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work") as theirs:
        jax.grad(f)(a)
    for g in (jaxaot.value_and_grad(f), jaxaot.grad(jaxaot.aot_function(f)), jaxaot.compiled_value_and_grad(f)):
        with pytest.raises(ValueError, match="Reverse-mode differentiation does not work") as ours:
            g(a)
        assert str(ours.value) == str(theirs.value)
        assert [n for n in ours.value.__notes__ if "jaxaot.loops.differentiable" in n], g
    n = _steps(a)  # the remedy named: the same gradient as the loop of known trip count
    np.testing.assert_allclose(jax.grad(jaxaot.loops.differentiable(f, max_steps=16))(a),
                               jax.grad(lambda a: lax.fori_loop(0, n, lambda i, s: s * 1.5, a))(a), rtol=1e-6)


def _steps(a):
    n, s = 0, float(a)
    while s < 10 * float(a):
        s, n = s * 1.5, n + 1
    return n
