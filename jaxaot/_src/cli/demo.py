"""``jaxaot demo``: compile an embedded MLP's training step with jaxaot and compare with plain JAX.

The report is a table of residual bytes and step times for jaxaot's two
partitioners next to ``jax.fwd_and_bwd`` and ``jax.jit(jax.value_and_grad)``,
a gradient check, and (with an output folder) the rendered split and the
exported forward/backward programs. Its progress goes through
:mod:`jaxaot._src.progress` (on stderr under the ``jaxaot`` command).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot._src import progress as _progress, viz
from jaxaot._src.viz import why_no_layout
from jaxaot._src.cli import demo_models
from jaxaot._src.cli.console import table


def demo_report(width: int = 256, depth: int = 4, batch: int = 64, out_dir: str | Path | None = None,
                *, rounds: int = 7) -> str:
    """Compile the embedded MLP's training step with jaxaot and compare with plain JAX.

    Progress goes to :mod:`jaxaot._src.progress`; the report is returned. Step
    times are the median and the min-max over ``rounds`` rounds, in each of
    which every program runs in turn. With ``out_dir``, also write
    :func:`demo_artifacts` and :func:`demo_export` there (and say on stderr, in
    one line, how to get Graphviz's picture when it is missing).
    """
    params, data = demo_models.mlp_init(jax.random.key(0), width=width, depth=depth, batch=batch)
    loss = demo_models.mlp_loss
    _progress.note(f"jaxaot demo: {depth}-layer gelu MLP, width {width}, batch {batch}, on {jax.default_backend()}")
    vg = jaxaot.value_and_grad(jaxaot.aot_function(loss))
    vg_mc = jaxaot.value_and_grad(jaxaot.aot_function(loss, partition_fn=jaxaot.partition.min_cut_rematerialization_partition))
    with _progress.task("tracing, partitioning and compiling with jaxaot") as compiling:
        low = vg.lower(params, data)
        low_mc = vg_mc.lower(params, data)
        jax.block_until_ready((vg(params, data), vg_mc(params, data)))
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=(0,))
    one = jnp.ones((), jnp.float32)
    fused = jax.jit(jax.value_and_grad(loss))
    with _progress.task("compiling plain JAX's programs"):
        _, res = fwd(params, data)
        jax.block_until_ready(fused(params, data))
    want = fused(params, data)[1]
    err = max(
        float(jnp.max(jnp.abs(a - b)))
        for got in (vg(params, data)[1], vg_mc(params, data)[1])
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
    )
    programs = {
        "aot": lambda: vg(params, data),
        "min_cut": lambda: vg_mc(params, data),
        "split": lambda: bwd(fwd(params, data)[1], one),
        "fused": lambda: fused(params, data),
    }
    with _progress.task(f"timing ({rounds} rounds)"):
        ms = time_rounds(programs, rounds=rounds)
    jax_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(res))
    rows = [("program", "residual bytes", "step ms: median (min-max)", "vs jit(value_and_grad)")]
    for name, label, saved in (("aot", "jaxaot (default partition)", _kib(low.saved_bytes)),
                               ("min_cut", "jaxaot (min-cut partition)", _kib(low_mc.saved_bytes)),
                               ("split", "jax.fwd_and_bwd", _kib(jax_bytes)),
                               ("fused", "jax.jit(jax.value_and_grad)", "(fused)")):
        ratios = [a / b for a, b in zip(ms[name], ms["fused"])]
        ratio = "1.00x (the reference)" if name == "fused" else _spread(ratios, "{:.2f}x")
        rows.append((label, saved, _spread(ms[name], "{:.3f}"), ratio))
    lines = [
        table(rows),
        "",
        f"step times over {rounds} rounds; each ratio compares the two programs within a round",
        f"gradients match jax.value_and_grad: max abs difference {err:.2e}",
        f"jaxaot saved {len(low.saved)} residuals (default partition), {len(low_mc.saved)} (min-cut); "
        f"tracing, partitioning and compiling both took {compiling.seconds:.2f} s",
    ]
    if out_dir is not None:
        missing = why_no_layout()
        if missing:
            print(f"jaxaot demo: drawing the split with jaxaot's built-in layout: {missing}", file=sys.stderr)
        with _progress.task(f"writing the picture of the split and the exported programs to {out_dir}"):
            paths = demo_artifacts(out_dir, low)
            exported = demo_export(out_dir, loss, params, data)
        lines.append("wrote " + ", ".join(str(p) for p in paths))
        lines.append(exported)
    return "\n".join(lines)


def demo_artifacts(out_dir: str | Path, lowered: Any) -> list[Path]:
    """Write what ``jaxaot demo --out DIR`` leaves behind for ``lowered``; return the paths.

    ``split.html`` (the graph of the split, its legend and the residual table)
    and ``split.svg`` (the graph alone), laid out by Graphviz's ``dot`` where it
    is installed, else by jaxaot's built-in layout (:func:`jaxaot._src.viz.plain_svg`).

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
    with warnings.catch_warnings():  # the demo says itself, once, when Graphviz is missing
        warnings.simplefilter("ignore", UserWarning)
        paths.append(viz.render(lowered, out_dir / "split.svg", format="svg", title="jaxaot demo"))
    return paths


def demo_export(out_dir: str | Path, fn: Callable, *args: Any) -> str:
    """Export ``fn``'s forward/backward programs to ``out_dir/artifact``; say what was written."""
    path = Path(out_dir) / "artifact"
    try:
        jaxaot.export.export(fn, *args).save(path)
    except ImportError as err:  # the 'export' extra is not installed
        return f"no exported artifact: {err}"
    return f"exported the forward/backward programs to {path} (reload with jaxaot.export.load({str(path)!r}))"


def _kib(n: int) -> str:
    # One unit for the whole column, so the rows compare at a glance.
    return f"{n / 1024:.1f} KiB"


def time_rounds(programs: dict[str, Callable[[], Any]], *, rounds: int = 7, calls: int = 5) -> dict[str, list[float]]:
    """Milliseconds per call of each program, one number per round.

    After two warm-up calls each, the programs take turns: in every round each
    runs ``calls`` times back to back (blocking on each result), so a slow
    moment of the machine hits all of them alike.

    Example:
        >>> ms = time_rounds({"add": lambda: jnp.ones(3) + 1}, rounds=3, calls=2)
        >>> len(ms["add"]), all(t > 0 for t in ms["add"])
        (3, True)
    """
    for fn in programs.values():
        for _ in range(2):
            jax.block_until_ready(fn())
    out: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, fn in programs.items():
            t = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn())
            out[name].append((time.perf_counter() - t) / calls * 1e3)
    return out


def _spread(values: list[float], fmt: str) -> str:
    """``median (min-max)`` of ``values``.

    Example:
        >>> _spread([3.0, 1.0, 2.0], "{:.1f}")
        '2.0 (1.0-3.0)'
    """
    v = sorted(values)
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}-{fmt.format(v[-1])})"
