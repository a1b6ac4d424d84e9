"""``jaxaot demo``: compile an embedded MLP's training step with jaxaot and compare with plain JAX.

The report (a :class:`DemoReport`) holds residual bytes and step times for
jaxaot's two partitioners next to ``jax.fwd_and_bwd`` and
``jax.jit(jax.value_and_grad)``, a gradient check, and (with an output folder)
the rendered split and the exported forward/backward programs; it prints as
text or as JSON. Its progress goes through :mod:`jaxaot._src.progress` (on
stderr under the ``jaxaot`` command).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

import jaxaot
from jaxaot._src import progress as _progress, viz
from jaxaot._src.artifacts import is_artifact_file
from jaxaot._src.compare import max_abs_diff, time_rounds
from jaxaot._src.files import check_replaceable
from jaxaot._src.viz import why_no_layout
from jaxaot._src.cli import demo_models
from jaxaot._src.tables import median_spread, table

#: The programs of the report: key, label.
PROGRAMS = (("aot", "jaxaot (default partition)"), ("min_cut", "jaxaot (min-cut partition)"),
            ("split", "jax.fwd_and_bwd"), ("fused", "jax.jit(jax.value_and_grad)"))
#: The files :func:`demo_artifacts` writes in the output folder, and the folder :func:`demo_export` writes.
PICTURES = ("split.html", "split.svg")
ARTIFACT = "artifact"


@dataclasses.dataclass(frozen=True)
class DemoProgram:
    """One program of the demo: its residual bytes (None for the fused reference) and milliseconds per step,
    one per round, with the ratio to the reference's step within each round."""

    key: str
    label: str
    residual_bytes: int | None
    times_ms: tuple[float, ...]
    ratios: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class DemoReport:
    """What ``jaxaot demo`` measured and wrote; ``str()`` is the text report, :meth:`to_dict` the JSON one."""

    width: int
    depth: int
    batch: int
    rounds: int
    budget: str | None
    backend: str
    programs: tuple[DemoProgram, ...]
    max_abs_diff: float
    residual_counts: tuple[int, int]  # the default partition's, the min-cut's
    compile_seconds: float
    predicted_peak: Any = None  # the min-cut plan's StepPeak under a byte budget
    files: tuple[str, ...] = ()
    export: str | None = None  # the exported artifact's folder
    export_note: str = ""

    def __str__(self) -> str:
        rows = [("program", "residual bytes", "step ms: median (min-max)", "vs jit(value_and_grad)")]
        for p in self.programs:
            saved = "(fused)" if p.residual_bytes is None else f"{p.residual_bytes / 1024:.1f} KiB"
            ratio = "1.00x (the reference)" if p.key == "fused" else median_spread(p.ratios, "{:.2f}x")
            rows.append((p.label, saved, median_spread(p.times_ms, "{:.3f}"), ratio))
        lines = [
            table(rows),
            "",
            f"step times over {self.rounds} rounds; each ratio compares the two programs within a round",
            f"gradients match jax.value_and_grad: max abs difference {self.max_abs_diff:.2e}",
            f"jaxaot saved {self.residual_counts[0]} residuals (default partition), {self.residual_counts[1]} "
            f"(min-cut); tracing, partitioning and compiling both took {self.compile_seconds:.2f} s",
        ]
        if self.predicted_peak is not None:
            lines.append(f"the min-cut plan under --budget {self.budget}: compiled peak {self.predicted_peak}")
        if self.files:
            lines.append("wrote " + ", ".join(self.files))
        if self.export_note:
            lines.append(self.export_note)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``jaxaot demo --json``)."""
        peak = self.predicted_peak
        return {
            "model": {"name": "gelu MLP", "width": self.width, "depth": self.depth, "batch": self.batch},
            "backend": self.backend,
            "budget": self.budget,
            "rounds": self.rounds,
            "programs": [{"name": p.key, "label": p.label, "residual_bytes": p.residual_bytes,
                          "step_ms": _stats(p.times_ms), "vs_fused": _stats(p.ratios)} for p in self.programs],
            "max_abs_diff": self.max_abs_diff,
            "residuals": {"default": self.residual_counts[0], "min_cut": self.residual_counts[1]},
            "compile_seconds": self.compile_seconds,
            "predicted_peak": None if peak is None else {
                "fused": peak.fused, "forward": peak.forward, "backward": peak.backward, "budget": peak.budget},
            "files": list(self.files),
            "export": self.export,
            "export_note": self.export_note,
        }


def _stats(values: tuple[float, ...]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def demo_report(width: int = 256, depth: int = 4, batch: int = 64, out_dir: str | Path | None = None,
                *, rounds: int = 7, budget: str | float | None = None) -> DemoReport:
    """Compile the embedded MLP's training step with jaxaot and compare with plain JAX.

    Progress goes to :mod:`jaxaot._src.progress`; the report is returned. Step
    times are the median and the min-max over ``rounds`` rounds, in each of
    which every program runs in turn. ``budget`` is the min-cut's
    ``memory_budget`` (read by :func:`jaxaot._src.partition.parse_memory_budget`; default 1).
    With ``out_dir``, also write :func:`demo_artifacts` and :func:`demo_export`
    there (and say on stderr, in one line, how to get Graphviz's picture when it is missing).

    Raises:
      MemoryBudgetError: no plan of the MLP fits a byte ``budget``.
    """
    params, data = demo_models.mlp_init(jax.random.key(0), width=width, depth=depth, batch=batch)
    loss = demo_models.mlp_loss
    _progress.note(f"jaxaot demo: {depth}-layer gelu MLP, width {width}, batch {batch}, on {jax.default_backend()}")
    min_cut = jaxaot.partition.min_cut_rematerialization_partition
    vg = jaxaot.value_and_grad(jaxaot.aot_function(loss))
    vg_mc = jaxaot.value_and_grad(jaxaot.aot_function(
        loss, partition_fn=min_cut if budget is None else min_cut(memory_budget=budget)))
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
    err = max(max_abs_diff(vg(params, data)[1], want), max_abs_diff(vg_mc(params, data)[1], want))
    programs = {
        "aot": lambda: vg(params, data),
        "min_cut": lambda: vg_mc(params, data),
        "split": lambda: bwd(fwd(params, data)[1], one),
        "fused": lambda: fused(params, data),
    }
    with _progress.task(f"timing ({rounds} rounds)"):
        ms = {k: [t * 1e3 for t in v] for k, v in time_rounds(programs, rounds=rounds, calls=5).items()}
    saved = {"aot": low.saved_bytes, "min_cut": low_mc.saved_bytes, "fused": None,
             "split": sum(x.nbytes for x in jax.tree_util.tree_leaves(res))}
    labels = dict(PROGRAMS)
    if budget is not None:
        labels["min_cut"] = f"jaxaot (min-cut partition, --budget {budget})"
    rows = tuple(DemoProgram(key, labels[key], saved[key], tuple(ms[key]),
                             tuple(a / b for a, b in zip(ms[key], ms["fused"]))) for key, _ in PROGRAMS)
    report = DemoReport(width, depth, batch, rounds, None if budget is None else str(budget), jax.default_backend(),
                        rows, err, (len(low.saved), len(low_mc.saved)), compiling.seconds, low_mc.predicted_peak)
    if out_dir is None:
        return report
    missing = why_no_layout()
    if missing:
        print(f"jaxaot demo: drawing the split with jaxaot's built-in layout: {missing}", file=sys.stderr)
    with _progress.task(f"writing the picture of the split and the exported programs to {out_dir}"):
        paths = demo_artifacts(out_dir, low)
        exported, note = demo_export(out_dir, loss, params, data)
    return dataclasses.replace(report, files=tuple(str(p) for p in paths), export=exported, export_note=note)


def demo_artifacts(out_dir: str | Path, lowered: Any) -> list[Path]:
    """Write what ``jaxaot demo --out DIR`` leaves behind for ``lowered``; return the paths.

    ``split.html`` (the graph of the split, its legend and the residual table)
    and ``split.svg`` (the graph alone), laid out by Graphviz's ``dot`` where it
    is installed, else by jaxaot's built-in layout (:func:`jaxaot._src.viz.plain_drawing`).

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     demo_artifacts(folder, low)[0].name
        'split.html'
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [viz.render(lowered, out_dir / PICTURES[0], format="html", title="jaxaot demo")]
    with warnings.catch_warnings():  # the demo says itself, once, when Graphviz is missing
        warnings.simplefilter("ignore", UserWarning)
        paths.append(viz.render(lowered, out_dir / PICTURES[1], format="svg", title="jaxaot demo"))
    return paths


def out_dir_conflict(out_dir: str | Path) -> str | None:
    """Why the demo could not write its files into the existing folder ``out_dir`` (None: nothing in the way).

    A picture's name taken by a folder, or an ``artifact`` entry that is not a folder or holds files the
    export's save would refuse to replace (the check ``save`` makes, run before the demo writes anything).
    """
    out_dir = Path(out_dir)
    for name in PICTURES:
        if (out_dir / name).is_dir():
            return f"{out_dir / name} is a folder, where the demo writes a file"
    target = out_dir / ARTIFACT
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        return f"{target} is not a folder, where the demo writes the exported programs"
    try:
        check_replaceable(target, is_artifact_file)
    except FileExistsError as err:
        return f"{target}: {err.strerror.partition(': refusing')[0]}, where the demo writes the exported programs"
    return None


def demo_export(out_dir: str | Path, fn: Callable, *args: Any) -> tuple[str | None, str]:
    """Export ``fn``'s forward/backward programs to ``out_dir/artifact``: ``(its folder or None, what was done)``."""
    path = Path(out_dir) / ARTIFACT
    try:
        jaxaot.export.export(fn, *args).save(path)
    except ImportError as err:  # the 'export' extra is not installed
        return None, f"no exported artifact: {err}"
    return str(path), (f"exported the forward/backward programs to {path} (reload with "
                       f"jaxaot.export.load({str(path)!r}))")
