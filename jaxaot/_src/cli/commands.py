"""The ``jaxaot`` commands themselves: ``demo``, ``inspect`` and ``version``.

:mod:`jaxaot._src.cli.main` reads the arguments and imports this module only once a
command runs, so ``--help`` never pays for importing JAX. A mistake of the
user's (a module that does not import, an unreadable shape, a wrong number of
arguments, a function JAX cannot trace at those shapes, a ``--budget`` that is
unreadable or that no plan fits) ends the command with one line on stderr and
exit status 2; ``--traceback`` shows the whole story. ``demo`` checks every
argument before it creates a folder, and removes the folders it created when it
fails or is interrupted. While a command runs, the
``jaxaot`` logger's progress lines show on stderr (:func:`jaxaot._src.progress.to_stderr`;
none under ``JAXAOT_QUIET=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jaxlib

import jaxaot
from jaxaot._src import progress as _progress
from jaxaot._src.cli.demo import demo_report, out_dir_conflict
from jaxaot._src.cli.inspect_json import inspect_document
from jaxaot._src.cli.shapes import example_arrays, needs_x64, parse_shapes
from jaxaot._src.compare import DEFAULT_BUDGETS, compare
from jaxaot._src.files import discard_output
from jaxaot.errors import InvalidInputError, InvalidValueError, JaxaotError, MemoryBudgetError

#: The exit status of a command that stopped on a user error (argparse's, for its own errors).
USAGE_ERROR = 2
#: The exit status when the reader of stdout stops early: 128 + SIGPIPE, what a shell reports for git or cat.
BROKEN_PIPE = 141
#: The most bytes of weights and activations ``jaxaot demo``'s MLP may hold.
DEMO_MAX_BYTES = 4 * 2**30


class UsageError(InvalidValueError):
    """A command cannot run as asked; the message is the whole explanation (one line)."""


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; a usage error becomes one line on stderr (after its traceback, with
    ``--traceback``) and status 2; a reader of stdout that stops early (a closed pipe) ends the command
    quietly with status :data:`BROKEN_PIPE`.

    Usage errors are :class:`UsageError` and the ``InvalidValueError`` of an unreadable ``--shapes``.
    """
    try:
        with _progress.to_stderr():
            status = COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader that stopped early is met here, not in the interpreter's last flush
        return status
    except BrokenPipeError:  # `jaxaot ... | head`: end quietly, as a program SIGPIPE ends
        discard_output(sys.stdout)
        return BROKEN_PIPE
    except InvalidValueError as e:
        if getattr(args, "traceback", False):
            traceback.print_exc()  # the whole story, then the same line and status as without the flag
        print(f"jaxaot {args.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR


# --------------------------------------------------------------------------- loading user code
def load_object(target: str, what: str = "MODULE:FUNCTION") -> Callable:
    """``package.module:function`` -> the function (the current folder is importable).

    Raises :class:`UsageError` when ``target`` names no callable.

    Example:
        >>> load_object("jaxaot._src.cli.demo_models:mlp_loss").__name__
        'mlp_loss'
        >>> load_object("jaxaot._src.cli.demo_models")
        Traceback (most recent call last):
        ...
        jaxaot._src.cli.commands.UsageError: expected MODULE:FUNCTION, got 'jaxaot._src.cli.demo_models'
    """
    mod_name, colon, attr = target.partition(":")
    if not colon or not mod_name or not attr:
        raise UsageError(f"expected {what}, got {target!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # as `python -m` does: modules in the current folder import
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise UsageError(f"cannot import {mod_name!r}: {e}") from e
    except Exception as e:  # the user's module raised while importing
        raise UsageError(f"importing {mod_name!r} raised {type(e).__name__}: {_first_line(e)}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{target} is not callable")
    return obj


def example_args(target: str) -> tuple:
    """Call ``--args MODULE:FUNCTION`` with no arguments; its result is the tuple of positional arguments."""
    make = load_object(target)
    try:
        got = make()
    except Exception as e:
        raise UsageError(f"calling {target}() raised {type(e).__name__}: {_first_line(e)}") from e
    if not isinstance(got, (tuple, list)):
        raise UsageError(f"{target}() must return the positional arguments as a tuple (one argument: a "
                         f"1-tuple), got a {type(got).__name__}")
    return tuple(got)


def check_arity(fn: Callable, target: str, args: tuple) -> None:
    """Raise :class:`UsageError` if ``fn`` cannot take ``len(args)`` positional arguments."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return
    try:
        sig.bind(*args)
    except TypeError:
        positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        params = [p.name for p in positional]
        required = sum(p.default is p.empty for p in positional)
        keywords = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
        if keywords and required <= len(args) <= len(params):  # the count is right: a keyword-only one is missing
            raise UsageError(f"{target} needs the keyword-only argument{'s' * (len(keywords) != 1)} "
                             f"{', '.join(keywords)}, which --shapes cannot give: give it a default, or inspect "
                             "a wrapper that passes it") from None
        raise UsageError(f"{target} takes {len(params)} positional argument{'s' * (len(params) != 1)} "
                         f"({', '.join(params)}) but was given {len(args)}") from None


def enable_x64_for(args: Any) -> None:
    """Turn on ``jax_enable_x64`` when ``args`` hold 64-bit dtypes, saying so: JAX would trace them as 32-bit."""
    wide = needs_x64(args)
    if wide and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
        print(f"jaxaot: the arguments hold {', '.join(wide)}: turned on jax_enable_x64, as JAX would otherwise "
              "trace them as 32-bit", file=sys.stderr)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


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
    for name in ("width", "depth", "batch", "rounds"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    held = 4 * args.depth * args.width * (args.width + args.batch)  # float32 weights and per-layer activations
    if held > DEMO_MAX_BYTES:
        raise UsageError(f"the demo's MLP at --width {args.width} --depth {args.depth} --batch {args.batch} would "
                         f"hold {held / 2**30:.1f} GiB of weights and activations; the demo keeps under "
                         f"{DEMO_MAX_BYTES // 2**30} GiB: choose smaller sizes")
    if args.budget is not None:
        budget_partitioner(args.budget)
    out, made = output_folder(args.out)  # every argument is checked: only now is anything created
    done = False
    try:
        report = demo_report(args.width, args.depth, args.batch, out, rounds=args.rounds, budget=args.budget)
        done = True
    except MemoryBudgetError as e:
        raise UsageError(f"no plan of the demo's MLP fits --budget {args.budget}: {_first_line(e)}") from e
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e}") from e
    finally:
        if not done and made is not None:
            shutil.rmtree(made, ignore_errors=True)  # a failed or interrupted demo leaves nothing behind
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0


def output_folder(out: str | None) -> tuple[str, Path | None]:
    """``(the demo's output folder, the folder to remove if the demo fails)``.

    Without ``--out``, a new temporary folder (said on stderr), removed on failure; with it, the
    first of its folders that does not exist yet (None if it exists). ``--out`` is made and an entry
    made and removed there before the demo's work, so a folder this process cannot write to (read-only,
    under a file, on a file system that refuses it) or one holding a folder where the demo writes a file
    raises :class:`UsageError` at once, leaving nothing behind.
    """
    if out is None:
        made = tempfile.mkdtemp(prefix="jaxaot-demo-")
        print(f"jaxaot demo: writing to {made} (a new temporary folder; choose one with --out DIR)", file=sys.stderr)
        return made, Path(made)
    path = Path(out).absolute()
    first_missing = None
    while not path.exists():
        first_missing, path = path, path.parent
    if not path.is_dir():
        raise UsageError(f"--out {out}: {path} is a file, not a folder; choose a folder for the demo's files")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: cannot write in {path}; choose a folder you can write to")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(dir=out, prefix=".jaxaot-demo-"))  # an entry made there: writes work
    except OSError as e:
        if first_missing is not None:
            shutil.rmtree(first_missing, ignore_errors=True)
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e}); choose a folder you can "
                         "write to") from e
    conflict = out_dir_conflict(out)
    if conflict:
        raise UsageError(f"--out {out}: {conflict}; choose another folder or move it away")
    return out, first_missing


def budget_partitioner(budget: str) -> Any:
    """The min-cut partitioner at ``--budget``, checked now; :class:`UsageError` naming ``--budget`` if unreadable.

    The text goes to the partitioner as given: ``memory_budget`` reads a plain number in a
    string as that number (:func:`jaxaot._src.partition.parse_memory_budget`), so ``--budget
    0.5`` is the fraction and ``--budget 2e9`` two billion bytes, as in Python.
    """
    try:
        return jaxaot.partition.min_cut_rematerialization_partition(memory_budget=budget)
    except (InvalidValueError, InvalidInputError) as e:
        raise UsageError(f"--budget {budget}: {_first_line(e)}") from e


def partitioner(args: argparse.Namespace) -> tuple[str, Any]:
    """``(name, partition_fn)`` for ``inspect``'s ``--partition``, ``--budget`` and ``--offload``.

    ``--budget`` or ``--offload`` without ``--partition`` choose the min-cut, the
    partitioner they configure. The min-cut checks its options here, before any
    tracing: an unreadable budget is a :class:`UsageError` naming ``--budget``
    (read as :func:`budget_partitioner` reads it).
    """
    tuned = args.budget is not None or args.offload is not None
    name = args.partition or ("min_cut" if tuned else "default")
    if name == "default":
        if tuned:
            raise UsageError("--budget and --offload configure the min-cut partitioner: drop --partition default "
                             "or use --partition min_cut")
        return name, jaxaot.partition.default_partition
    options: dict[str, Any] = {}
    if args.budget is not None:
        options["memory_budget"] = args.budget
    if args.offload is not None:
        options["offload"] = "auto" if args.offload == "auto" else False
    if not options:
        return name, jaxaot.partition.min_cut_rematerialization_partition
    try:
        return name, jaxaot.partition.min_cut_rematerialization_partition(**options)
    except (InvalidValueError, InvalidInputError) as e:
        flag = "--budget" if args.budget is not None else "--offload"
        raise UsageError(f"{flag} {getattr(args, flag[2:])}: {_first_line(e)}") from e


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.rounds is not None and not args.compare:
        raise UsageError("--rounds times the steps of --compare: add --compare")
    if args.compare:
        check_compare_options(args)
    if args.x64 and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)  # before --args builds its arrays
    name, partition_fn = partitioner(args)
    with _users_prints(args):
        fn = load_object(args.target)
        call_args = parse_shapes(args.shapes) if args.shapes is not None else example_args(args.args)
    enable_x64_for(call_args)
    check_arity(fn, args.target, call_args)
    if args.compare:
        return inspect_compare(args, fn, call_args)
    aot = jaxaot.aot_function(fn, partition_fn=partition_fn)
    with _user_errors(args), _users_prints(args):
        with _progress.task(f"lowering {args.target}"):
            low = aot.lower(*call_args)
    if args.json:
        print(json.dumps(inspect_document(low, target=args.target, partition=name, budget=args.budget,
                                          offload=args.offload), indent=2))
    else:
        print(low.details())
    return 0


def check_compare_options(args: argparse.Namespace) -> None:
    """:class:`UsageError` for options ``--compare`` does not take: it compares the min-cut at budgets with JAX."""
    if args.offload is not None or args.partition == "default":
        raise UsageError("--compare measures the min-cut partitioner at --budget (default: "
                         f"{', '.join(map(str, DEFAULT_BUDGETS))}) next to JAX's programs: drop "
                         f"{'--offload' if args.offload is not None else '--partition default'}")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {args.rounds}")


def inspect_compare(args: argparse.Namespace, fn: Callable, call_args: tuple) -> int:
    """``inspect --compare``: :func:`jaxaot.compare` of ``fn`` at the arguments (``--shapes`` made arrays)."""
    budgets = DEFAULT_BUDGETS if args.budget is None else (args.budget,)
    with _user_errors(args), _users_prints(args):
        result = compare(fn, *example_arrays(call_args), budgets=budgets,
                         rounds=5 if args.rounds is None else args.rounds)
    if args.json:
        print(json.dumps({"target": args.target, **result.to_dict()}, indent=2))
    else:
        print(result)
    return 0


def _users_prints(args: argparse.Namespace) -> Any:
    """With ``--json``, what the user's module and function print goes to stderr: stdout is one JSON document."""
    return contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()


@contextlib.contextmanager
def _user_errors(args: argparse.Namespace) -> Any:
    """Errors of the user's function at the given arguments, or of its budget, as :class:`UsageError`."""
    try:
        yield
    except MemoryBudgetError as e:  # before its base class: the function traced, the budget is the problem
        raise UsageError(f"no plan of {args.target} fits --budget {args.budget}: {_first_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - the user's function raised: it does not trace at these arguments
        hint = "" if getattr(args, "traceback", False) else " (--traceback shows where)"
        raise UsageError(f"{args.target} does not trace at the given arguments: {type(e).__name__}: "
                         f"{_first_line(e)}{hint}") from e


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": cmd_demo,
    "inspect": cmd_inspect,
    "version": cmd_version,
}
