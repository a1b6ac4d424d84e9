"""jaxaot._src.viz.residual_table_html: one row per saved value, the total, the recomputed eqns."""

import html
import re

from jaxaot._src import viz


def test_residual_table_lists_every_residual(block):
    table = viz.residual_table_html(block)
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1].split("</tbody>")[0])
    assert len(rows) == len(block.saved)
    for row, r, label in zip(rows, block.saved, block.residuals):
        assert html.escape(label.label, quote=False) in row  # inputs by pytree path, temporaries by position
        assert (label.kind, label.nbytes) == (r.source, r.nbytes)
        assert str(list(r.aval.shape)) in row and str(r.aval.dtype) in row
        assert f'title="{r.nbytes} bytes"' in row
        assert r.producer in row
        if r.source_line:
            assert viz.short_source(r.source_line)[0] in row
    assert f'title="{block.saved_bytes} bytes"' in table  # the total row
    assert "arg[0]['qkv']" in table  # inputs carry their pytree path


def test_recomputed_list_in_table(remat):
    table = viz.residual_table_html(remat)
    assert f"{len(remat.recomputed)} eqns recomputed in the backward" in table and "<code>sin</code>" in table


def test_offloaded_residuals_are_marked_and_totalled():
    import functools

    import jax
    import jax.numpy as jnp

    import jaxaot
    from jaxaot._src.partition import DeviceModel

    def fn(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    ws, x = [jnp.full((128, 128), 0.01)] * 3, jnp.ones((512, 128))  # residuals over offload's 64 KiB floor
    fast = DeviceModel(host_bandwidth=1e12, device_flops=1e12)
    low = jaxaot.aot_function(fn, partition_fn=functools.partial(
        jaxaot.partition.min_cut_rematerialization_partition, offload=True, device_model=fast)).lower(ws, x)
    page = viz.residual_table_html(low)
    assert page.count("<td>offloaded</td>") == sum(r.offloaded for r in low.partition.residuals) > 0
    assert "offloaded to host memory" in page
    auto = jaxaot.aot_function(fn, partition_fn=functools.partial(
        jaxaot.partition.min_cut_rematerialization_partition, offload="auto")).lower(ws, x)
    note, offloaded = auto.partition.offload_note, sum(r.offloaded for r in auto.partition.residuals)
    assert bool(note) != bool(offloaded)  # the measured device offloads, or the table says why it does not
    assert note in viz.residual_table_html(auto)
    assert bool(note) or jax.default_backend() != "cpu"  # a CPU's "host memory" is its device memory


def test_a_stage_s_table_shows_where_each_residual_lives_on_a_mesh():
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxaot

    n = max(k for k in (1, 2, 4, 8) if k <= jax.device_count())
    if n < 2:
        pytest.skip("a residual split over a mesh needs two or more devices")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))
    x = jax.device_put(jax.random.normal(jax.random.key(3), (4 * n, 16)), NamedSharding(mesh, P("data")))
    low = jaxaot.aot_function(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)).lower(jnp.ones((16, 4)), x)
    for stage in (low, low.compile()):
        where = re.findall(r"<td>((?:saved|offloaded)[^<]*)</td>", viz.residual_table_html(stage))
        assert where and where == [f"saved {r.sharding}".strip() for r in stage.residuals]
        assert any("'data'" in w for w in where)
