"""Compilers: xla, nop, print_jaxpr, and the Compiler protocol they share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxaot._src.compile import Compiler, compilers

AVALS = [jax.ShapeDtypeStruct((3,), jnp.float32)]


def _closed():
    return jax.make_jaxpr(lambda x: [jnp.sin(x) * 2.0])(jnp.ones(3))


@pytest.mark.parametrize("compiler", [compilers.xla, compilers.nop, compilers.print_jaxpr])
def test_every_compiler_takes_donate_argnums(compiler: Compiler, capsys):
    run = compiler(_closed(), AVALS, donate_argnums=(0,))
    (out,) = run(jnp.zeros(3))
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_xla_returns_a_compiled_executable():
    assert isinstance(compilers.xla(_closed(), AVALS), jax.stages.Compiled)
    assert not isinstance(compilers.nop(_closed(), AVALS), jax.stages.Compiled)


def test_print_jaxpr_prints_the_program(capsys):
    compilers.print_jaxpr(_closed(), AVALS)
    assert "sin" in capsys.readouterr().out
