"""jaxaot._src.viz.to_html and AOTLowered._repr_html_: the graph inline, the summary, the table."""

import html

import pytest

from jaxaot import viz


@pytest.mark.smoke
@pytest.mark.usefixtures("needs_dot")
def test_html_embeds_svg(small):
    frag = viz.to_html(small)
    assert "<svg" in frag and "<?xml" not in frag and "jaxaot-residuals" in frag


def test_repr_html(small, remat):
    for low in (small, remat):
        out = low._repr_html_()
        assert out.startswith('<div class="jaxaot-split">') and "jaxaot-residuals" in out
        assert f"{len(low.saved)} saved values" in out


def test_repr_html_without_dot(small, no_dot):
    out = small._repr_html_()
    assert "<svg" in out and "<?xml" not in out and "built-in layout" in out
    assert html.escape(viz.why_no_layout(), quote=False) in out  # what is missing here: Graphviz's dot, or its Python package


def test_repr_html_loads_viz_on_first_display():
    """The runtime never imports viz: the package face loads it the first time Jupyter displays."""
    import subprocess
    import sys

    code = ("import sys, jax.numpy as jnp, jaxaot\n"
            "low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))\n"
            "assert 'jaxaot._src.viz' not in sys.modules\n"
            "assert '<table' in low.residuals._repr_html_() and 'jaxaot._src.viz' in sys.modules\n"
            "assert low._repr_html_().startswith('<div class=\"jaxaot-split\">')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
