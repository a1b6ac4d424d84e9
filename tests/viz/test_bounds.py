"""Large programs draw in bounded time: split_graph honours max_nodes, and Graphviz's dot runs under a timeout."""

import os
import shutil
import stat
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot import viz
from jaxaot._src.viz.model import EQN_KINDS

LAYERS = 25


def _deep_mlp(params, x):
    for w, b in params:
        x = jax.nn.gelu(x @ w + b, approximate=False)
        x = x / (1e-5 + jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True)))
    return jnp.mean(x ** 2)


@pytest.fixture(scope="module")
def deep():
    """A 25-layer MLP: over a thousand eqns, still about two hundred nodes at one node per function."""
    keys = jax.random.split(jax.random.key(int(np.random.default_rng().integers(2**31))), LAYERS + 1)
    params = [(jax.random.normal(k, (16, 16)) / 4, jax.random.normal(k, (16,)) / 4) for k in keys[:LAYERS]]
    x = jax.random.normal(keys[-1], (8, 16))
    return jaxaot.aot_function(_deep_mlp, fw_compiler=jaxaot.compilers.nop).lower(params, x)


@pytest.mark.parametrize("max_nodes", [80, 25, 1])
def test_split_graph_fits_max_nodes_by_merging_blocks(deep, max_nodes):
    eqn = viz.split_graph(deep, group_by="eqn")
    g = viz.split_graph(deep, max_nodes=max_nodes)
    assert len(viz.split_graph(deep, group_by="function").nodes) > 80  # the grouping levels alone do not fit
    kinds = {n.kind for n in eqn.nodes}
    assert g.group_by == "block" and len(g.nodes) <= max(max_nodes, len(kinds))
    # Every eqn, saved value and input is still counted once, by a node of its own kind.
    assert sum(n.count for k in EQN_KINDS for n in g.of_kind(k)) == eqn.num_eqns
    assert sum(n.count for n in g.of_kind("saved")) == len(deep.saved)
    assert sum(n.count for n in g.of_kind("input")) == len(eqn.of_kind("input")) == 2 * LAYERS + 1
    assert {n.kind for n in g.nodes} == kinds
    ids = {n.id for n in g.nodes}
    kind = {n.id: n.kind for n in g.nodes}
    assert len(kind) == len(g.nodes) and all(a in kind and b in kind and a != b for a, b in g.edges)
    assert not [e for e in g.edges if kind[e[1]] in ("input", "cotangent")]  # values entering a program


def test_a_graph_that_fits_is_not_merged_further(small):
    assert viz.split_graph(small, max_nodes=80) == viz.split_graph(small, group_by="eqn")


def test_render_of_a_long_program_is_quick_and_says_how_it_grouped(deep, tmp_path):
    start = time.perf_counter()
    with warnings.catch_warnings():  # the built-in layout warns where dot is missing: not what this measures
        warnings.simplefilter("ignore", UserWarning)
        page = viz.render(deep, tmp_path / "deep.html", format="html", max_nodes=60)
        svg = viz.render(deep, max_nodes=60)
    assert time.perf_counter() - start < 30
    assert "in blocks of consecutive nodes" in page.read_text() and "<svg" in svg


def _slow_dot(folder):
    """A ``dot`` that never answers in time: the layout of a graph too large for Graphviz."""
    dot = folder / "dot"
    dot.write_text("#!/bin/sh\nexec sleep 60\n")
    dot.chmod(dot.stat().st_mode | stat.S_IXUSR)
    return str(dot)


@pytest.mark.skipif(os.name != "posix", reason="the stand-in dot is a shell script")
def test_dot_past_its_timeout_gives_the_built_in_layout_and_a_warning(small, monkeypatch, tmp_path):
    pytest.importorskip("graphviz")  # the Python package writes the source dot is given
    dot = _slow_dot(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: dot if name == "dot" else None)
    assert viz.layout_available()
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="built-in layout: Graphviz's dot took over 0.5 s"):
        svg = viz.render(small, timeout=0.5)
    with pytest.warns(UserWarning, match="took over 0.5 s"):  # Graphviz installed but too slow: the page warns
        page = viz.render(small, format="html", timeout=0.5)
    svg2, note = viz.draw_svg(viz.split_graph(small), timeout=0.5)
    assert time.perf_counter() - start < 20
    assert 'class="node saved"' in svg and "took over 0.5 s" in svg  # the picture's last line says why
    assert "<svg" in page and "took over" in page and "took over" in note and "<svg" in svg2


@pytest.mark.slow
@pytest.mark.usefixtures("needs_dot")
def test_real_dot_is_stopped_at_the_timeout(deep):
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="took over 2 s"):  # a thousand nodes take dot minutes
        svg = viz.render(deep, group_by="eqn", timeout=2)
    assert time.perf_counter() - start < 30 and "<svg" in svg
