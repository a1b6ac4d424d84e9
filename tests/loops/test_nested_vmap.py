"""``vmap`` of loops nested in loops, against ``lax.while_loop`` under the same ``vmap``.

A loop in another loop's body is batched by the outer loop's batching rule, which
meets the inner loop's initial carry as jaxpr literals wherever the program wrote a
Python scalar (``False``, ``0``, ``0.0``). Each case nests 1 to 3 loops whose carries
hold such a scalar, at a position and of a kind that change with the level, so every
position and kind appears; the predicate is per lane (``y < bound``, batched) or a
step counter (unbatched). Forward values, dtypes and JVPs must equal lax's; reverse
mode (``vmap(grad)`` and ``grad(vmap)``), which lax refuses, must equal lax's
forward-mode derivative.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxaot

_SEED = int(np.random.SeedSequence().entropy % 2**31)
_KINDS = ("bool", "int", "float")
_LITERAL = {"bool": False, "int": 0, "float": 0.0}


def _nest(wl, depth: int, batched: bool, shift: int, x):
    """``depth`` nested loops; level ``d``'s carry holds a Python scalar of kind ``_KINDS[(d + shift) % 3]`` at
    position ``(d + shift) % 3`` of three (the others: a step counter, also a Python ``0``, and ``y``)."""

    def level(d, y):
        pos = kind_i = (d + shift) % 3
        kind = _KINDS[kind_i]

        def unpack(c):
            c = list(c)
            f = c.pop(pos)
            return c[0], c[1], f

        def pack(i, y, f):
            c = [i, y]
            c.insert(pos, f)
            return tuple(c)

        def cond(c):
            i, y, _ = unpack(c)
            return y < 2.0 + d if batched else i < 1 + d

        def body(c):
            i, y, f = unpack(c)
            y = y * 1.3 + 0.1 + 0.1 * jnp.sin(x)
            if d > 1:
                y = level(d - 1, y)
            f = {"bool": lambda: jnp.logical_not(f), "int": lambda: f + 1, "float": lambda: f + 0.01 * y}[kind]()
            return pack(i + 1, y, f)

        i, y, f = unpack(wl(cond, body, pack(0, y, _LITERAL[kind])))
        return y + 0.01 * jnp.asarray(f, y.dtype) + 0.001 * i

    return level(depth, x)


def _lanes():
    return jnp.asarray(np.random.default_rng(_SEED).uniform(0.2, 0.9, 3), jnp.float32)


def _params(cases, default, name):
    """``cases`` as pytest params, those not in ``default`` in the slow suite (each costs 1-25 s of compiling)."""
    return [pytest.param(*c, id=name(*c), marks=() if c in default else pytest.mark.slow) for c in cases]


#: Depth 3 holds every kind at every position; the default suite keeps two cases (the rest: -m slow).
CASES = _params(list(itertools.product((1, 2, 3), (True, False), (0, 1, 2))),
                [(2, True, 2), (3, False, 0)],
                lambda d, b, s: f"depth{d}-{'batched' if b else 'unbatched'}-shift{s}")


@pytest.mark.parametrize("depth,batched,shift", CASES)
def test_vmap_of_nested_loops_is_lax_while_loop(depth, batched, shift):
    x = _lanes()

    def run(wl):
        f = functools.partial(_nest, wl, depth, batched, shift)
        return jax.vmap(f)(x), jax.vmap(lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),)))(x)

    (got, (got_y, got_t)), (ref, (ref_y, ref_t)) = run(jaxaot.loops.while_loop), run(lax.while_loop)
    assert jax.typeof(got) == jax.typeof(ref)
    np.testing.assert_allclose(got, ref, rtol=1e-6, err_msg=f"seed {_SEED}")
    np.testing.assert_allclose(got_y, ref_y, rtol=1e-6, err_msg=f"seed {_SEED}")
    np.testing.assert_allclose(got_t, ref_t, rtol=1e-5, err_msg=f"seed {_SEED}")


_MAX16, _CKPT3, _BOTH = dict(max_steps=16), dict(checkpoints=3), dict(max_steps=16, checkpoints=3)
REVERSE = _params([(d, b, _MAX16) for d, b in itertools.product((1, 2, 3), (True, False))]
                  + [(2, True, _CKPT3), (2, False, _BOTH)],
                  [(2, False, _MAX16)],
                  lambda d, b, m: f"depth{d}-{'batched' if b else 'unbatched'}-"
                                  + "-".join(f"{k}{v}" for k, v in m.items()))


@pytest.mark.parametrize("depth,batched,mode", REVERSE)
def test_reverse_mode_of_vmapped_nested_loops_is_the_forward_derivative(depth, batched, mode):
    x = _lanes()
    ref = jax.vmap(lambda x: jax.jvp(functools.partial(_nest, lax.while_loop, depth, batched, 1), (x,),
                                     (jnp.ones_like(x),))[1])(x)
    f = functools.partial(_nest, functools.partial(jaxaot.loops.while_loop, **mode), depth, batched, 1)
    np.testing.assert_allclose(jax.vmap(jax.grad(f))(x), ref, rtol=1e-5, err_msg=f"seed {_SEED}")
    np.testing.assert_allclose(jax.grad(lambda x: jax.vmap(f)(x).sum())(x), ref, rtol=1e-5, err_msg=f"seed {_SEED}")


@pytest.mark.parametrize("shape,mode", [((2, 3), _MAX16), ((2, 2), _CKPT3), ((2, 1, 3), _MAX16)],
                         ids=["2x3-max_steps", "2x2-checkpoints", "2x1x3-max_steps"])
def test_a_loop_vmapped_over_several_axes_has_one_predicate_axis_per_level(shape, mode):
    """``vmap(vmap(while_loop))`` (``jnp.vectorize`` over a 2-D input, as ``jax.scipy.special.expn`` does)
    gives the predicate an axis per vmap level; the rewritten loop selects lanes with all of them."""
    a = jnp.asarray(np.random.default_rng(_SEED).uniform(0.5, 2.0, shape), jnp.float32)

    def newton(a):
        return lax.while_loop(lambda s: jnp.abs(s * s - a) > 1e-5 * a, lambda s: 0.5 * (s + a / s), a)

    def f(a):
        g = newton
        for _ in shape:
            g = jax.vmap(g)
        return jnp.sum(g(a) ** 2)

    ours = jaxaot.loops.differentiable(f, **mode)
    np.testing.assert_allclose(ours(a), f(a), rtol=1e-6, err_msg=f"seed {_SEED}")
    np.testing.assert_allclose(jax.grad(ours)(a), jax.jacfwd(f)(a), rtol=1e-4, err_msg=f"seed {_SEED}")
    expn = lambda x: jnp.sum(jax.scipy.special.expn(3, x))  # noqa: E731
    np.testing.assert_allclose(jax.grad(jaxaot.loops.differentiable(expn, **mode))(a), jax.grad(expn)(a),
                               rtol=1e-5, err_msg=f"seed {_SEED}")
