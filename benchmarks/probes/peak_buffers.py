"""Probe: which temporaries are live at the compiled peak of fused steps.

Compiles, for one zoo model, ``jit(value_and_grad)``, ``jit(dots_saveable)`` and the
fused min-cut step (budget 1 or as given, and with the softmax/norm statistics
recomputed), each in XLA's backward order and consume-first, with XLA dumping the
optimized HLO, and prints per program the largest temporaries live at the peak of
its schedule (:func:`live_at_peak`: size, shape, kernel, op name), so a peak above
``dots_saveable``'s can be traced to the values that make it.

Run with ``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"`` set; usage:
``python benchmarks/probe_peak_buffers.py MODEL DIR [--budget 1] [--layouts row_major]``, or
``python benchmarks/probe_peak_buffers.py hlo FILE...`` for saved ``*after_optimizations.txt`` dumps.

The result files ``probe_peak_buffers_gpu_h100_2026-11-26*.txt`` other than ``..._reanalyzed``
were printed before :func:`live_at_peak` read ``%x#k`` operands as element ``k`` alone: they
keep every residual alive until the last use of any, and overstate the live set (the
ranking of the large buffers is unchanged); ``..._reanalyzed`` re-reads the saved HLO.
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import re
import sys

import jax

import jaxaot
from jaxaot import _compat as C
from jaxaot.runtime.fused import fused_program

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import fmt_bytes, peak_bytes  # noqa: E402
from models import zoo  # noqa: E402
from probe_fused_peak import min_cut_reductions_cheap  # noqa: E402


def named(fn, name):
    fn.__name__ = fn.__qualname__ = name
    return fn


def compile_all(model, args, budget, layouts):
    loss, nums = model.loss, model.argnums
    exes = {}
    exes["ref_value_and_grad"] = jax.jit(named(jax.value_and_grad(loss, argnums=nums), "ref_value_and_grad")
                                         ).lower(*args).compile()
    ckpt = jax.checkpoint(loss, policy=jax.checkpoint_policies.dots_saveable)
    exes["ref_dots_saveable"] = jax.jit(named(jax.value_and_grad(ckpt, argnums=nums), "ref_dots_saveable")
                                        ).lower(*args).compile()
    tuple_nums = (nums,) if isinstance(nums, int) else tuple(nums)
    mask = tuple(i in tuple_nums for i, a in enumerate(args) for _ in jax.tree.leaves(a))
    for tag, pf in (("mincut", functools.partial(jaxaot.min_cut_rematerialization_partition, memory_budget=budget)),
                    ("mincut_reductions_recomputed", min_cut_reductions_cheap)):
        f = jaxaot.aot_function(loss, partition_fn=pf)
        programs, leaves, _ = f.lookup(args, {})
        for order in ("xla", "consume_first"):
            closed = fused_program(programs.training(mask), barrier="all", layouts=layouts, order=order)
            name = f"fused_{tag}" + ("" if order == "xla" else "_consume_first")
            step = named(lambda *xs, closed=closed: C.eval_closed(closed, *xs), name)
            exes[name] = jax.jit(step).lower(*leaves).compile()
    return exes


_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(ROOT )?%(\S+) = (.*?) ([a-z\-]+)\((.*)$")
_ALIASES = {"bitcast", "get-tuple-element", "tuple", "opt-barrier"}


def _sizes(shape: str) -> list[int]:
    """Bytes of each array of an HLO shape string (a tuple gives one per element)."""
    out = []
    for dtype, dims in _ARRAY.findall(shape.split("{")[0] if not shape.startswith("(") else shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out.append(n * _BYTES.get(dtype, 4))
    return out


def live_at_peak(hlo_text: str, top: int = 14) -> list[str]:
    """The temporaries live at the peak of the entry computation's schedule, largest first.

    Liveness from the scheduled order of the optimized HLO: a value lives from its
    instruction to the last instruction reading it (through bitcasts, tuples,
    get-tuple-elements and optimization barriers, which alias); parameters and
    constants are left out (they are the arguments), outputs live to the end.
    """
    entry = hlo_text[hlo_text.index("\nENTRY"):].splitlines()[1:]
    elements: dict[str, list[list[int]]] = {}
    info: list[tuple[int, str]] = []  # value id -> (bytes, description)
    last_use: dict[int, int] = {}
    born: dict[int, int] = {}
    for t, line in enumerate(entry):
        m = _INSTR.match(line)
        if not m:
            continue
        root, name, shape, opcode, rest = m.groups()
        args = rest.split("), ")[0] if "), " in rest else rest.split(")")[0]
        # An operand is ``%name`` (all its elements) or ``%name#k`` (element k of a tuple result);
        # an element is the list of value ids it holds.
        ops: list[list[list[int]]] = []
        for o, k in re.findall(r"%([\w.\-]+)(?:#(\d+))?", args):
            els = elements.get(o, [])
            ops.append(els if not k else [els[int(k)]] if int(k) < len(els) else [])
        for op in ops:
            for v in sum(op, []):
                last_use[v] = t
        if opcode in _ALIASES:
            if opcode == "tuple":
                elements[name] = [sum(op, []) for op in ops]
            elif opcode == "get-tuple-element":
                k = int(re.search(r"index=(\d+)", rest).group(1))
                src = ops[0] if ops else []
                elements[name] = [src[k]] if k < len(src) else []
            else:  # bitcast, opt-barrier: the operand's buffers
                elements[name] = ops[0] if ops else []
        elif opcode in ("parameter", "constant"):
            elements[name] = []
        else:
            line_no = re.search(r"source_line=(\d+)", rest)
            op = re.search(r'op_name="([^"]*)"', rest)
            desc = (f"{shape.split('{')[0][:34]:<34} {opcode:<10} line {line_no.group(1) if line_no else '?':<4} "
                    f"{(op.group(1) if op else '')[-90:]}")
            els = []
            for size in _sizes(shape):
                info.append((size, desc))
                born[len(info) - 1] = t
                els.append([len(info) - 1])
            elements[name] = els
        if root:
            for el in elements.get(name, []):
                for v in el:
                    last_use[v] = len(entry)
    n = len(entry) + 1
    delta = [0] * (n + 1)
    for v in born:
        b, e = born[v], last_use.get(v, born[v])
        delta[b] += info[v][0]
        delta[e + 1] -= info[v][0]
    live, peak, at = 0, 0, 0
    for t in range(n):
        live += delta[t]
        if live > peak:
            peak, at = live, t
    alive = sorted((info[v][0], info[v][1]) for v in born if born[v] <= at <= last_use.get(v, born[v]))[::-1]
    rows = [f"   temporaries live at the peak (instruction {at} of {len(entry)}): {peak / 2**20:.1f} MiB"]
    rows += [f"   {size / 2**20:9.1f} MiB  {desc}" for size, desc in alive[:top]]
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a zoo model, or 'hlo' to analyze the optimized-HLO files given as DUMP")
    ap.add_argument("dump", nargs="+")
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--layouts", default="pinned")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=14, help="how many of the live temporaries to list")
    a = ap.parse_args(argv)
    if a.model == "hlo":  # saved dumps: no compilation
        for path in a.dump:
            print(f"\n## {os.path.basename(path)}")
            print("\n".join(live_at_peak(open(path).read(), a.top)))
        return
    model = zoo("small" if a.small else "gpu")[a.model]
    args = model.make_args(jax.random.key(0))
    exes = compile_all(model, args, a.budget, a.layouts)
    print(f"# {model.label}: temporaries at the compiled peak, jax {jax.__version__}, "
          f"{jax.devices()[0].device_kind}")
    for name, exe in exes.items():
        print(f"\n## {name}: peak {fmt_bytes(peak_bytes(exe))}")
        files = sorted(glob.glob(os.path.join(a.dump[0], f"*jit_{name}.*after_optimizations.txt")))
        for path in files[-1:]:
            print("\n".join(live_at_peak(open(path).read(), a.top)))


if __name__ == "__main__":
    main()
