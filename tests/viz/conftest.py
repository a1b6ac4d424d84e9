"""Lowered functions the viz tests draw, and switches for Graphviz being there or not."""

import functools
import shutil

import jax
import jax.numpy as jnp
import pytest

import jaxaot
from jaxaot import viz
from jaxaot._src.cli import demo_models as examples


def tanh_loss(w, x):
    return jnp.tanh(x @ w).sum()


@pytest.fixture(scope="session")
def small():
    """A known function under the default partition: it saves w, x and a tanh-derived value."""
    return jaxaot.aot_function(tanh_loss).lower(jnp.ones((3, 2)), jnp.ones((4, 3)))


@pytest.fixture(scope="session")
def remat():
    """min-cut at budget 0 saves only the input and recomputes sin/exp in the backward."""
    f = jaxaot.aot_function(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) ** 2),
                            partition_fn=functools.partial(jaxaot.partition.min_cut_rematerialization_partition,
                                                           memory_budget=0.0))
    return f.lower(jnp.ones(100))


@pytest.fixture(scope="session")
def block():
    p = examples.block_init(jax.random.key(0), width=32, heads=2, dtype=jnp.float32)
    x = jax.random.normal(jax.random.key(1), (2, 8, 32))
    # compilers.nop: the picture needs the programs, not XLA executables (saves seconds).
    f = jaxaot.aot_function(lambda p, x: jnp.mean(examples.block_apply(p, x, heads=2) ** 2),
                            fw_compiler=jaxaot.compilers.nop)
    return f.lower(p, x)


@pytest.fixture
def needs_dot():
    """Skip the test where Graphviz's dot (or the graphviz package) is missing."""
    if not viz.layout_available():
        pytest.skip("Graphviz's dot is not installed")


@pytest.fixture
def no_dot(monkeypatch):
    """As if Graphviz's dot were not installed."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert not viz.layout_available()
