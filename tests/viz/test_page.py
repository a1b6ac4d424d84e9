"""jaxaot.viz.to_html and AOTLowered._repr_html_: the graph inline, the summary, the table."""

import pytest

from jaxaot import viz


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
    assert "No graph" in small._repr_html_()
