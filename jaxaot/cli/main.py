"""The ``jaxaot`` command: ``demo``, ``inspect`` and ``version``.

Example:
    $ jaxaot demo
    $ jaxaot inspect mypkg.model:loss --shapes "f32[8,16] f32[4,8]"
    $ jaxaot version
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp


# --------------------------------------------------------------------------- helpers
class _Progress:
    """Prints ``label ... done (0.3 s)`` around a long step."""

    def __init__(self, label: str, stream=None):
        self.label, self.stream = label, stream or sys.stderr

    def __enter__(self):
        self.t = time.perf_counter()
        print(f"  {self.label} ...", end="", flush=True, file=self.stream)
        return self

    def __exit__(self, *exc):
        print(f" done ({time.perf_counter() - self.t:.2f} s)", file=self.stream, flush=True)


def _table(rows: Sequence[Sequence[Any]]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _median_ms(fn: Callable[[], Any], iters: int = 30) -> float:
    for _ in range(3):
        jax.block_until_ready(fn())
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


_DTYPES = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16, "f64": jnp.float64,
           "i32": jnp.int32, "i64": jnp.int64, "i8": jnp.int8, "u8": jnp.uint8, "bool": jnp.bool_}


def parse_shapes(spec: str) -> list[jax.ShapeDtypeStruct]:
    """``"f32[8,16] i32[]"`` -> ShapeDtypeStructs, one per positional argument."""
    out = []
    for tok in spec.split():
        m = re.fullmatch(r"([a-z0-9]+)\[([0-9, ]*)\]", tok)
        if not m or m.group(1) not in _DTYPES:
            raise SystemExit(
                f"jaxaot: cannot read shape {tok!r}; write dtype[dims] with dtype one of "
                f"{', '.join(_DTYPES)}, e.g. f32[8,16] or i32[]"
            )
        dims = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
        out.append(jax.ShapeDtypeStruct(dims, _DTYPES[m.group(1)]))
    return out


def load_function(target: str) -> Callable:
    """``package.module:function`` -> the function."""
    if ":" not in target:
        raise SystemExit(f"jaxaot: expected MODULE:FUNCTION, got {target!r}")
    mod_name, _, attr = target.partition(":")
    sys.path.insert(0, ".")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise SystemExit(f"jaxaot: cannot import {mod_name!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"jaxaot: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"jaxaot: {target} is not callable")
    return obj


# --------------------------------------------------------------------------- commands
def cmd_version(args: argparse.Namespace) -> int:
    import jaxlib

    import jaxaot

    dev = jax.devices()[0]
    print(f"jaxaot {jaxaot.__version__}")
    print(f"jax    {jax.__version__}")
    print(f"jaxlib {jaxlib.__version__}")
    print(f"backend {jax.default_backend()} ({getattr(dev, 'device_kind', dev.platform)}, {jax.device_count()} devices)")
    return 0


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
    from jaxaot import viz

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [viz.render(lowered, out_dir / "split.html", format="html", title="jaxaot demo")]
    if viz.layout_available():
        paths.append(viz.render(lowered, out_dir / "split.svg", format="svg", title="jaxaot demo"))
    return paths


def demo_export(out_dir: str | Path, fn: Callable, *args: Any) -> str:
    """Export ``fn``'s forward/backward programs to ``out_dir/artifact``; say what was written."""
    import jaxaot

    path = Path(out_dir) / "artifact"
    try:
        jaxaot.export(fn, *args).save(path)
    except ImportError as err:  # the 'export' extra is not installed
        return f"no exported artifact: {err}"
    return f"exported the forward/backward programs to {path} (reload with jaxaot.load({str(path)!r}))"


def demo_report(width: int = 256, depth: int = 4, batch: int = 64, out_dir: str | Path | None = None) -> str:
    """Compile the embedded MLP's training step with jaxaot and compare with plain JAX.

    With ``out_dir``, also write :func:`demo_artifacts` there.
    """
    import jaxaot
    from jaxaot.cli import demo_models as examples

    params, data = examples.mlp_init(jax.random.key(0), width=width, depth=depth, batch=batch)
    loss = examples.mlp_loss
    print(f"jaxaot demo: {depth}-layer gelu MLP, width {width}, batch {batch}, on {jax.default_backend()}",
          file=sys.stderr)
    aot = jaxaot.aot_function(loss)
    vg = jaxaot.value_and_grad(aot)
    vg_mc = jaxaot.value_and_grad(jaxaot.aot_function(loss, partition_fn=jaxaot.min_cut_rematerialization_partition))
    with _Progress("tracing, partitioning and compiling with jaxaot"):
        low = vg.lower(params, data)
        low_mc = vg_mc.lower(params, data)
    fwd, bwd = jax.fwd_and_bwd(loss, argnums=(0,))
    one = jnp.ones((), jnp.float32)
    fused = jax.jit(jax.value_and_grad(loss))
    with _Progress("compiling plain JAX's programs"):
        _, res = fwd(params, data)
        jax.block_until_ready(fused(params, data))
    want = fused(params, data)[1]
    err = max(
        float(jnp.max(jnp.abs(a - b)))
        for got in (vg(params, data)[1], vg_mc(params, data)[1])
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
    )
    with _Progress("timing"):
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
        _table(rows),
        "",
        f"gradients match jax.value_and_grad: max abs difference {err:.2e}",
        f"jaxaot saved {len(low.saved)} residuals; compile times: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in low.compile_times.items()),
    ]
    if out_dir is not None:
        with _Progress(f"writing the picture of the split and the exported programs to {out_dir}"):
            paths = demo_artifacts(out_dir, low)
            exported = demo_export(out_dir, loss, params, data)
        lines.append("wrote " + ", ".join(str(p) for p in paths))
        lines.append(exported)
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    print(demo_report(args.width, args.depth, args.batch, args.out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import jaxaot

    fn = load_function(args.target)
    shapes = parse_shapes(args.shapes)
    partition_fn = jaxaot.default_partition
    if args.partition == "min_cut":
        partition_fn = jaxaot.min_cut_rematerialization_partition
    aot = jaxaot.aot_function(fn, partition_fn=partition_fn)
    with _Progress(f"lowering {args.target} at {args.shapes}"):
        low = aot.lower(*shapes)
    print(low)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxaot", description="AOTAutograd for JAX: split, inspect and compile "
                                "forward and backward programs.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="compile an embedded model's training step and compare with plain JAX",
                       description="Compile an embedded MLP's training step with jaxaot and print residual "
                       "bytes and step time next to jax.fwd_and_bwd and jax.jit(jax.value_and_grad).")
    d.add_argument("--width", type=int, default=256, help="MLP width (default 256)")
    d.add_argument("--depth", type=int, default=4, help="MLP layers (default 4)")
    d.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    d.add_argument("--out", metavar="DIR", default="jaxaot-demo",
                   help="where to write the rendered split (split.html, and split.svg with Graphviz) and the "
                   "exported forward/backward programs (artifact/); default ./jaxaot-demo")
    d.set_defaults(func=cmd_demo)
    i = sub.add_parser("inspect", help="print the forward/backward split of MODULE:FUNCTION at given shapes",
                       description="Trace MODULE:FUNCTION at the given argument shapes, partition it and print "
                       "the forward and backward programs and the residual table.")
    i.add_argument("target", help="MODULE:FUNCTION, e.g. mypkg.model:loss")
    i.add_argument("--shapes", required=True, help='positional argument shapes, e.g. "f32[8,16] f32[4,8]"')
    i.add_argument("--partition", choices=("default", "min_cut"), default="default", help="partitioner")
    i.set_defaults(func=cmd_inspect)
    v = sub.add_parser("version", help="print jaxaot, jax, jaxlib versions and the backend",
                       description="Print the versions of jaxaot, jax and jaxlib and the default backend.")
    v.set_defaults(func=cmd_version)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
