"""The ``jaxaot`` command: its arguments, and the ``demo``, ``inspect`` and ``version`` commands.

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
from typing import Callable, Sequence

import jax
import jaxlib

import jaxaot
from jaxaot._pytrees import dtype_from_short, short_dtype_names
from jaxaot.cli.console import Progress
from jaxaot.cli.demo import demo_report
from jaxaot.errors import InvalidValueError

# One token of --shapes: dtype[dims] (spaces allowed inside the brackets), or anything up to a space.
_TOKEN = re.compile(r"[^\s\[]*\[[^\[\]]*\](?!\S)|\S+")
_SHAPE = re.compile(r"(?P<dtype>\w+)\[(?P<dims>[\d\s,]*)\]")
_SHAPES_HELP = 'positional argument shapes, e.g. "f32[8,16] f32[4,8]" (dtypes: {})'


# --------------------------------------------------------------------------- reading arguments
def parse_shapes(spec: str) -> list[jax.ShapeDtypeStruct]:
    """``"f32[8,16] i32[]"`` -> ShapeDtypeStructs, one per positional argument.

    Raises :class:`~jaxaot.errors.InvalidValueError` naming the token it cannot read.

    Example:
        >>> [(s.shape, s.dtype.name) for s in parse_shapes("f32[8, 16] i32[]")]
        [((8, 16), 'float32'), ((), 'int32')]
        >>> parse_shapes("q8[2]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxaot.errors.InvalidValueError: cannot read shape 'q8[2]': unknown dtype 'q8'; use one of f64, f32, ...
    """
    tokens = _TOKEN.findall(spec)
    if not tokens:
        raise InvalidValueError("cannot read shapes from an empty --shapes: give one dtype[dims] per positional "
                                "argument, e.g. \"f32[8,16] f32[4,8]\"")
    return [_parse_shape(tok) for tok in tokens]


def _parse_shape(tok: str) -> jax.ShapeDtypeStruct:
    m = _SHAPE.fullmatch(tok)
    if not m:
        raise InvalidValueError(f"cannot read shape {tok!r}: write dtype[dims], e.g. f32[8,16] or i32[] "
                                f"(dtype one of {', '.join(short_dtype_names())})")
    dtype = dtype_from_short(m["dtype"])
    if dtype is None:
        raise InvalidValueError(f"cannot read shape {tok!r}: unknown dtype {m['dtype']!r}; use one of "
                                f"{', '.join(short_dtype_names())}")
    dims = tuple(int(d) for d in m["dims"].replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(dims, dtype)


def load_function(target: str) -> Callable:
    """``package.module:function`` -> the function (the current folder is importable).

    Raises :class:`~jaxaot.errors.InvalidValueError` when ``target`` names no callable.
    """
    if ":" not in target:
        raise InvalidValueError(f"expected MODULE:FUNCTION, got {target!r}")
    mod_name, _, attr = target.partition(":")
    sys.path.insert(0, ".")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise InvalidValueError(f"cannot import {mod_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidValueError(f"{mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidValueError(f"{target} is not callable")
    return obj


# --------------------------------------------------------------------------- commands
def cmd_version(args: argparse.Namespace) -> int:
    dev = jax.devices()[0]
    print(f"jaxaot {jaxaot.__version__}")
    print(f"jax    {jax.__version__}")
    print(f"jaxlib {jaxlib.__version__}")
    kind = getattr(dev, "device_kind", dev.platform)
    print(f"backend {jax.default_backend()} ({kind}, {jax.device_count()} devices)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    print(demo_report(args.width, args.depth, args.batch, args.out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        fn, shapes = load_function(args.target), parse_shapes(args.shapes)
    except InvalidValueError as e:  # a usage error: one line, no traceback
        raise SystemExit(f"jaxaot: {e}") from None
    partition_fn = jaxaot.default_partition
    if args.partition == "min_cut":
        partition_fn = jaxaot.min_cut_rematerialization_partition
    aot = jaxaot.aot_function(fn, partition_fn=partition_fn)
    with Progress(f"lowering {args.target} at {args.shapes}"):
        low = aot.lower(*shapes)
    print(low)
    return 0


# --------------------------------------------------------------------------- the parser
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
    i.add_argument("--shapes", required=True, help=_SHAPES_HELP.format(", ".join(short_dtype_names())))
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
