"""A small tanh-MLP ODE for the while_loop tests, with its lax.fori_loop reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import jaxaot


def mlp_loss(w, b, x, n, **kw):
    """``sum(x_n ** 2)`` for ``x <- x + 0.1 tanh(x w + b)`` run n times by ``jaxaot.loops.while_loop(**kw)``."""
    out = jaxaot.loops.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 0.1 * jnp.tanh(c[1] @ w + b)),
                            (jnp.int32(0), x), **kw)
    return jnp.sum(out[1] ** 2)


def mlp_ref(w, b, x, n):
    """The same loss by ``lax.fori_loop``."""
    return jnp.sum(lax.fori_loop(0, n, lambda i, c: c + 0.1 * jnp.tanh(c @ w + b), x) ** 2)


def inputs(seed, width=8):
    """Fresh ``(w, b, x)`` with a (4, width) carry."""
    kw, kb, kx = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kw, (width, width)) / width ** 0.5, jax.random.normal(kb, (width,)),
            jax.random.normal(kx, (4, width)))
