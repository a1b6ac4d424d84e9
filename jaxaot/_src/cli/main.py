"""The ``jaxaot`` command's arguments (``jaxaot._src.cli.main:main``).

This module imports only the standard library: ``jaxaot --help`` and every
usage error argparse finds answer before JAX is imported. The commands live in
:mod:`jaxaot._src.cli.commands`, imported once a command runs.

Example:
    $ jaxaot demo --out /tmp/jaxaot-demo
    $ jaxaot inspect jaxaot._src.cli.demo_models:tanh_loss --shapes "f32[16, 4] f32[8, 16]"
    $ jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --args jaxaot._src.cli.demo_models:mlp_example_args
    $ jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --args jaxaot._src.cli.demo_models:mlp_example_args \
          --budget 0.5 --json
    $ jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --args jaxaot._src.cli.demo_models:mlp_example_args \
          --compare
    $ jaxaot version
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

#: The dtypes ``--shapes`` reads (``jaxaot._src.pytrees.short_dtype_names()``; spelled out so --help imports nothing).
DTYPES = ("f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "c64", "c128", "bool")

INSPECT_EPILOG = f"""\
arguments, one of:
  --shapes "f32[8,16] f32[4, 8]"
      one dtype[dims] per positional argument, separated by spaces
      (spaces inside the brackets are fine; i32[] is a scalar)
  --shapes '[{{"w": "f32[8,16]", "b": "f32[16]"}}, ["f32[4,8]", "f32[4,16]"]]'
      JSON, for pytree arguments: a JSON list holds the positional arguments,
      any other JSON value is the only one; inside, a "dtype[dims]" string is
      an array, a list a list and an object a dict
  --args MODULE:FUNCTION
      FUNCTION() returns example arguments as a tuple (arrays or
      jax.ShapeDtypeStruct leaves), e.g. jaxaot._src.cli.demo_models:mlp_example_args

dtypes: {', '.join(DTYPES)}, or their full names (float32, int64, ...).
float, int, uint and complex mean JAX's default widths: float32, int32,
uint32, complex64. Only a dtype named 64-bit (f64, float64, i64, int64, u64,
c128) turns on jax_enable_x64 before tracing, and says so on stderr.

the min-cut partitioner's options (either one chooses --partition min_cut):
  --budget 0.5      a fraction in [0, 1]: 0 recomputes every expensive eqn
                    the backward can, 1 none (the default)
  --budget 1.4GB    bytes (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB; or a whole
                    number: 4096, 2e9): the training step's compiled peak
                    device memory per device, which the planner fits
                  (read as Python's memory_budget reads them; 1.5 is refused:
                   did you mean 1.5GB?)
  --offload auto    also move saved values to host memory where the copies
                    hide behind compute (nothing moves on the CPU backend)

--json prints the residual table, saved bytes, recomputed eqns and stage
times as one JSON document on stdout; progress stays on stderr
(JAXAOT_QUIET=1 silences it).

--compare measures instead of printing the split: the gradient step of the
first argument, jaxaot's min-cut at each budget (--budget, else 1, 0.5 and 0)
next to jax.jit(jax.value_and_grad(f)) and jax.checkpoint(f, policy=P) for
JAX's dots_saveable, dots_with_no_batch_dims_saveable and nothing_saveable:
each step's compiled peak memory and its time per call (median and min-max
over --rounds rounds, default 5), as a table or, with --json, as JSON.
--shapes arguments become arrays for it: normal random floats, zero ints.

examples:
  jaxaot inspect jaxaot._src.cli.demo_models:tanh_loss --shapes "f32[16, 4] f32[8, 16]"
  jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --args jaxaot._src.cli.demo_models:mlp_example_args
  jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss --partition min_cut \\
      --shapes '[[{{"w": "f32[16,16]", "b": "f32[16]"}}], ["f32[4,16]", "f32[4,16]"]]'
  jaxaot inspect jaxaot._src.cli.demo_models:mlp_loss \\
      --args jaxaot._src.cli.demo_models:mlp_example_args --budget 0.5 --json
  jaxaot inspect jaxaot._src.cli.demo_models:tanh_loss --shapes "f32[16, 4] f32[8, 16]" --compare

A user error (an import that fails, an unreadable shape, a wrong number of
arguments, a function that does not trace at these shapes, an unreadable
--budget or one no plan fits) prints one line and exits with status 2.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxaot", description="AOTAutograd for JAX: split, inspect and compile "
                                "forward and backward programs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,inspect,version}")
    d = sub.add_parser("demo", help="compile an embedded model's training step and compare with plain JAX",
                       description="Compile an embedded MLP's training step with jaxaot and print residual "
                       "bytes and step time (median and min-max over rounds) next to jax.fwd_and_bwd and "
                       "jax.jit(jax.value_and_grad); write the picture of the split and the exported programs.")
    d.add_argument("--width", type=int, default=256, help="MLP width (default 256)")
    d.add_argument("--depth", type=int, default=4, help="MLP layers (default 4)")
    d.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    d.add_argument("--rounds", type=int, default=7, help="timing rounds; the programs take turns in each "
                   "(default 7)")
    d.add_argument("--out", metavar="DIR", default=None,
                   help="where to write the rendered split (split.html, and split.svg with Graphviz) and the "
                   "exported forward/backward programs (artifact/); default: a new temporary folder, printed")
    d.add_argument("--budget", metavar="BUDGET", default=None,
                   help="the min-cut's memory_budget: a fraction in [0, 1] or bytes such as 64KiB or 2e9 "
                   "(read as in Python, as inspect reads it; default 1)")
    d.add_argument("--json", action="store_true", help="print the report as one JSON document on stdout")
    i = sub.add_parser("inspect", help="print the forward/backward split of MODULE:FUNCTION",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=INSPECT_EPILOG,
                       description="Trace MODULE:FUNCTION at the given arguments, partition it and print "
                       "the forward and backward programs and the residual table.")
    i.add_argument("target", metavar="MODULE:FUNCTION",
                   help="the function to split, e.g. jaxaot._src.cli.demo_models:mlp_loss (the current folder is "
                   "importable)")
    given = i.add_mutually_exclusive_group(required=True)
    given.add_argument("--shapes", metavar="SPEC", help="argument shapes: plain or JSON (see below)")
    given.add_argument("--args", metavar="MODULE:FUNCTION", help="a function returning example arguments")
    i.add_argument("--partition", choices=("default", "min_cut"), default=None,
                   help="partitioner (default: default, or min_cut with --budget or --offload)")
    i.add_argument("--budget", metavar="BUDGET", default=None,
                   help="the min-cut's memory_budget: a fraction in [0, 1] or bytes such as 1.4GB or 2e9 (see below)")
    i.add_argument("--offload", choices=("auto", "off"), default=None,
                   help="the min-cut's host offload: auto moves saved values to host memory where it pays "
                   "(default: off)")
    i.add_argument("--json", action="store_true", help="print the split (or the comparison) as JSON on stdout "
                   "(see below)")
    i.add_argument("--compare", action="store_true", help="measure jaxaot's steps next to JAX's: compiled peak "
                   "and step time (see below)")
    i.add_argument("--rounds", type=int, default=None, help="timing rounds of --compare (default 5)")
    i.add_argument("--x64", action="store_true", help="turn on jax_enable_x64 before anything is built")
    i.add_argument("--traceback", action="store_true", help="on a user error, show the traceback too")
    sub.add_parser("version", help="print jaxaot, jax, jaxlib versions and the backend",
                   description="Print the versions of jaxaot, jax and jaxlib and the default backend.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``jaxaot ARGS``; the exit status: 0, 2 for a usage error, or 141 when the reader of stdout stopped
    before the output ended (:func:`jaxaot._src.cli.commands.run`)."""
    args = build_parser().parse_args(argv)
    try:
        from jaxaot._src.cli import commands  # deferred: --help must not import jax
    except ValueError as e:
        errors = sys.modules.get("jaxaot.errors")  # imported by now where jaxaot's settings read the environment
        if errors is None or not isinstance(e, errors.InvalidValueError):  # a JAXAOT_* variable that does not read
            raise
        print(f"jaxaot {args.command}: error: {e}", file=sys.stderr)
        return 2
    return commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
