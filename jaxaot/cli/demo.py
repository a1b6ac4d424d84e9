"""``jaxaot demo``: compile an embedded MLP's training step with jaxaot and compare with plain JAX.

The report is a table of residual bytes and step times for jaxaot's two
partitioners next to ``jax.fwd_and_bwd`` and ``jax.jit(jax.value_and_grad)``,
a gradient check, and (with an output folder) the rendered split and the
exported forward/backward programs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot import viz
from jaxaot.cli import demo_models
from jaxaot.cli.console import Progress, table


def demo_report(width: int = 256, depth: int = 4, batch: int = 64, out_dir: str | Path | None = None) -> str:
    """Compile the embedded MLP's training step with jaxaot and compare with plain JAX.

    Progress goes to stderr; the report is returned. With ``out_dir``, also
    write :func:`demo_artifacts` and :func:`demo_export` there.
    """
    params, data = demo_models.mlp_init(jax.random.key(0), width=width, depth=depth, batch=batch)
    loss = demo_models.mlp_loss
    print(f"jaxaot demo: {depth}-layer gelu MLP, width {width}, batch {batch}, on {jax.default_backend()}",
          file=sys.stderr)
    vg = jaxaot.value_and_grad(jaxaot.aot_function(loss))
    vg_mc = jaxaot.value_and_grad(jaxaot.aot_function(loss, partition_fn=jaxaot.min_cut_rematerialization_partition))
    with Progress("tracing, partitioning and compiling with jaxaot"):
        low = vg.lower(params, data)
        low_mc = vg_mc.lower(params, data)
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=(0,))
    one = jnp.ones((), jnp.float32)
    fused = jax.jit(jax.value_and_grad(loss))
    with Progress("compiling plain JAX's programs"):
        _, res = fwd(params, data)
        jax.block_until_ready(fused(params, data))
    want = fused(params, data)[1]
    err = max(
        float(jnp.max(jnp.abs(a - b)))
        for got in (vg(params, data)[1], vg_mc(params, data)[1])
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
    )
    with Progress("timing"):
        t_aot = _median_ms(lambda: vg(params, data))
        t_mc = _median_ms(lambda: vg_mc(params, data))
        t_split = _median_ms(lambda: bwd(fwd(params, data)[1], one))
        t_fused = _median_ms(lambda: fused(params, data))
    jax_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(res))
    rows = [
        ("program", "residual bytes", "step ms", "vs jit(value_and_grad)"),
        ("jaxaot (default partition)", _kib(low.saved_bytes), f"{t_aot:.3f}", f"{t_aot / t_fused:.2f}x"),
        ("jaxaot (min-cut partition)", _kib(low_mc.saved_bytes), f"{t_mc:.3f}", f"{t_mc / t_fused:.2f}x"),
        ("jax.fwd_and_bwd", _kib(jax_bytes), f"{t_split:.3f}", f"{t_split / t_fused:.2f}x"),
        ("jax.jit(jax.value_and_grad)", "(fused)", f"{t_fused:.3f}", "1.00x"),
    ]
    lines = [
        table(rows),
        "",
        f"gradients match jax.value_and_grad: max abs difference {err:.2e}",
        f"jaxaot saved {len(low.saved)} residuals; compile times: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in low.compile_times.items()),
    ]
    if out_dir is not None:
        with Progress(f"writing the picture of the split and the exported programs to {out_dir}"):
            paths = demo_artifacts(out_dir, low)
            exported = demo_export(out_dir, loss, params, data)
        lines.append("wrote " + ", ".join(str(p) for p in paths))
        lines.append(exported)
    return "\n".join(lines)


def demo_artifacts(out_dir: str | Path, lowered: Any) -> list[Path]:
    """Write what ``jaxaot demo --out DIR`` leaves behind for ``lowered``; return the paths.

    ``split.html`` (the graph of the split, its legend and the residual table,
    or the table alone without Graphviz) and, where Graphviz's ``dot`` is
    installed, ``split.svg`` (the graph alone).

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> paths = demo_artifacts(tempfile.mkdtemp(), low)
        >>> paths[0].name
        'split.html'
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [viz.render(lowered, out_dir / "split.html", format="html", title="jaxaot demo")]
    if viz.layout_available():
        paths.append(viz.render(lowered, out_dir / "split.svg", format="svg", title="jaxaot demo"))
    return paths


def demo_export(out_dir: str | Path, fn: Callable, *args: Any) -> str:
    """Export ``fn``'s forward/backward programs to ``out_dir/artifact``; say what was written."""
    path = Path(out_dir) / "artifact"
    try:
        jaxaot.export(fn, *args).save(path)
    except ImportError as err:  # the 'export' extra is not installed
        return f"no exported artifact: {err}"
    return f"exported the forward/backward programs to {path} (reload with jaxaot.load({str(path)!r}))"


def _kib(n: int) -> str:
    # One unit for the whole column, so the rows compare at a glance.
    return f"{n / 1024:.1f} KiB"


def _median_ms(fn: Callable[[], Any], iters: int = 30) -> float:
    """Median wall time of ``fn()`` in milliseconds, after three warm-up calls."""
    for _ in range(3):
        jax.block_until_ready(fn())
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3
