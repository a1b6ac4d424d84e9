"""XLA's refusals to compile surface as a typed ``XlaCompileError`` that names the program and what to try."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot._src.runtime import signature_programs
from zoo import assert_trees_close


def _refusing(real, refused: str):
    """``cached_compile`` that raises XLA's error for the program whose jaxpr holds ``refused``."""

    def compile_(compiler, closed, avals, **options):
        if any(e.primitive.name == refused for e in closed.jaxpr.eqns):
            raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: Shapes must be equal rank, but are f32[16] and f32[2,8]")
        return real(compiler, closed, avals, **options)

    return compile_


def test_an_xla_refusal_is_typed_and_the_function_keeps_working(monkeypatch):
    fn = lambda w, x: jnp.sum(jnp.tanh(x @ w))  # noqa: E731
    w, x = jax.random.normal(jax.random.key(1), (4, 3)), jax.random.normal(jax.random.key(2), (5, 4))
    f = jaxaot.aot_function(fn)
    monkeypatch.setattr(signature_programs, "cached_compile", _refusing(signature_programs.cached_compile, "tanh"))
    with pytest.raises(jaxaot.errors.XlaCompileError) as info:
        f(w, x)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value.__cause__, jax.errors.JaxRuntimeError)
    message = str(info.value)
    assert "'inference'" in message and "Shapes must be equal rank" in message and "fused=False" in message
    monkeypatch.undo()  # nothing half-built was kept: the same function compiles and answers
    assert_trees_close(f(w, x), fn(w, x))
    assert_trees_close(jaxaot.value_and_grad(f)(w, x), jax.value_and_grad(fn)(w, x))
