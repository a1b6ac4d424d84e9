"""Effectful test functions: callbacks recorded into a list, to count and order them per call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import io_callback


class Recorder:
    """Callbacks that append to one list; ``take()`` returns and clears it."""

    def __init__(self):
        self.log: list[str] = []

    def __call__(self, tag: str):
        def cb(*_):
            self.log.append(tag)

        return cb

    def take(self) -> list[str]:
        jax.effects_barrier()
        out, self.log = self.log, []
        return out


def effectful(rec: Recorder):
    """``x -> scalar`` with ordered forward effects and a callback in a custom_vjp backward."""

    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    def sin_fwd(x):
        return jnp.sin(x), x

    def sin_bwd(x, ct):
        jax.debug.callback(rec("bwd"), ct, ordered=True)
        return (ct * jnp.cos(x),)

    sin.defvjp(sin_fwd, sin_bwd)

    def f(x):
        jax.debug.callback(rec("a"), x, ordered=True)
        y = sin(x) * 2
        io_callback(rec("io"), None, jax.lax.stop_gradient(y), ordered=True)
        jax.debug.print("{}", y.sum(), ordered=True)
        jax.debug.callback(rec("b"), y)  # unordered: counted, not ordered
        return y.sum()

    return f


FWD = ["a", "io", "b"]
