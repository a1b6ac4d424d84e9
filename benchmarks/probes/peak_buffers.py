"""Which temporaries are live at the compiled peak of a fused training step, largest first.

For one zoo model (``benchmarks/models.py``) this compiles ``jit(value_and_grad)``,
``jit(dots_saveable)``, ``jaxaot.value_and_grad``'s fused min-cut step (``--budget``, as it
chose its variant), and the same plan behind the full barrier in XLA's backward order and
consume-first, and prints per program its compiled peak and the temporaries live at the peak
of its schedule (:func:`live_at_peak`: size, shape, kernel, source line, op name), read from the
executable's scheduled HLO (``as_text()``). A peak above ``dots_saveable``'s can so be traced
to the values that make it. Cost: five compiles; nothing runs.

Usage (from the repository root): ``python -m benchmarks.probes.peak_buffers MODEL [--budget 1]
[--layouts auto|pinned] [--small] [--top 14]``, or ``python -m benchmarks.probes.peak_buffers hlo
FILE ...`` for saved optimized-HLO text (``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text``,
the ``*after_optimizations.txt`` files).
"""

from __future__ import annotations

import argparse
import functools
import os
import re

import jax

import jaxaot
from benchmarks.bench_fused import fused_variant, jax_references
from benchmarks.harness import fmt_bytes, peak_bytes
from benchmarks.models import zoo


def compile_all(model, args, budget: float, layouts: str | None) -> dict:
    """Program name -> compiled executable: JAX's two fused steps, jaxaot's chosen one, and its plan
    behind the full barrier in both backward orders (``layouts``: the residual layouts, default the chosen)."""
    exes = {name: exe for name, (_, exe) in jax_references(model, args).items()}
    pf = functools.partial(jaxaot.partition.min_cut_rematerialization_partition, memory_budget=budget)
    f = jaxaot.aot_function(model.loss, partition_fn=pf)
    jaxaot.value_and_grad(f, argnums=model.argnums)(*args)
    (chosen,) = [e for n, e in f.lookup(args, {}).programs.executables.items() if n.startswith("fused")]
    exes[f"min-cut {budget:g} as chosen ({chosen.layouts}, {chosen.order}, barrier {chosen.barrier})"] = chosen
    for order in ("xla", "consume_first"):
        _, exe = fused_variant(f, model.argnums, args, "all", layouts or chosen.layouts, order)
        exes[f"min-cut {budget:g}, barrier all, {order}"] = exe
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a zoo model, or 'hlo' to analyze the optimized-HLO files given after it")
    ap.add_argument("files", nargs="*", help="with 'hlo': the optimized-HLO text files")
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--layouts", choices=("auto", "pinned"), help="residual layouts (default: the chosen ones)")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=14, help="how many of the live temporaries to list")
    a = ap.parse_args(argv)
    if a.model == "hlo":  # saved dumps: no compilation
        for path in a.files:
            print(f"\n## {os.path.basename(path)}")
            print("\n".join(live_at_peak(open(path).read(), a.top)))
        return
    model = zoo("small" if a.small else "gpu")[a.model]
    args = model.make_args(jax.random.key(0))
    print(f"# {model.label}: temporaries at the compiled peak, jax {jax.__version__}, "
          f"{jax.devices()[0].device_kind}")
    for name, exe in compile_all(model, args, a.budget, a.layouts).items():
        print(f"\n## {name}: peak {fmt_bytes(peak_bytes(exe))}")
        print("\n".join(live_at_peak(exe.as_text(), a.top)))


if __name__ == "__main__":
    main()
