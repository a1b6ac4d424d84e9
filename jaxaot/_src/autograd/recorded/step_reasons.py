"""Why compiled autograd compiled a step, in words a user recognises.

A step compiles when its recording has a new structure. The reason names, first,
the argument that changed by name and pytree path (:class:`CallInputs`, in the
runtime's wording); otherwise what the forward did differently (:func:`explain`):
the Python branch that went the other way, the first operation that differs by
source line, or a closed-over array or scalar that changed. The words are made
only when a step compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.autograd.recorded.structure import Structure, consts_differ
from jaxaot._src.runtime import ArgNames


# --------------------------------------------------------------------------- a call's inputs
class CallInputs(NamedTuple):
    """A call's array inputs: the differentiated leaves, then the other arguments' array leaves.

    ``avals`` (shape, dtype) is what two calls compare; :meth:`named` puts names on them on a compile.
    """

    positions: tuple          #: the differentiated arguments' positions
    diff_tree: Any            #: the treedef of the differentiated values (a tuple, one per position)
    other_names: tuple        #: the other arguments' names (positional, then keywords)
    other_tree: Any           #: the treedef of the other arguments (a tuple, one per name)
    keep: tuple               #: which of the other arguments' leaves are arrays
    avals: tuple              #: ``(shape, dtype)`` per array input, differentiated first
    values: tuple             #: ``(leaf index, value)`` of the other arguments' Python scalars and strings

    @classmethod
    def of(cls, args: tuple, kwargs: dict, positions: tuple, skip: Any, diff_leaves: Sequence[Any],
           diff_tree: Any, names: ArgNames) -> "CallInputs":
        others = [i for i in range(len(args)) if i not in skip]
        leaves, other_tree = jax.tree_util.tree_flatten((*(args[i] for i in others), *kwargs.values()))
        keep = tuple(hasattr(x, "dtype") for x in leaves)
        avals = tuple((tuple(x.shape), x.dtype) for x in (*diff_leaves, *(x for x, k in zip(leaves, keep) if k)))
        other_names = (*(names(i) for i in others), *kwargs)
        return cls(positions, diff_tree, other_names, other_tree, keep, avals, python_values(leaves))

    def named(self, names: ArgNames) -> list[tuple[str, jax.ShapeDtypeStruct]]:
        """``[(path, aval), ...]``: ``params['w']``, ``x``, ``mask``, in the order of :attr:`avals`."""
        paths = [names(self.positions[p[0].idx]) + jax.tree_util.keystr(tuple(p[1:]))
                 for p in _paths(self.diff_tree)]
        paths += [p for p, k in zip((self.other_names[p[0].idx] + jax.tree_util.keystr(tuple(p[1:]))
                                     for p in _paths(self.other_tree)), self.keep) if k]
        return [(p, jax.ShapeDtypeStruct(s, d)) for p, (s, d) in zip(paths, self.avals)]

    def values_change(self, old: "CallInputs") -> str:
        """Python values among the other arguments that changed (``n: 2 → 4``), when the structures agree."""
        if old.other_tree != self.other_tree or old.values == self.values:
            return ""
        paths = [self.other_names[p[0].idx] + jax.tree_util.keystr(tuple(p[1:])) for p in _paths(self.other_tree)]
        was = dict(old.values)
        return "; ".join(f"{paths[i]}: {was[i]!r} → {v!r} (a Python value)" for i, v in self.values
                         if i in was and was[i] != v)

    def text(self, names: ArgNames) -> str:
        """``w: f32[3,2], x: f32[4,3]``: the signature an entry of ``cache_info()`` shows."""
        return ", ".join(f"{p}: {format_aval(a)}" for p, a in self.named(names))


#: Python values that may steer the forward (loop counts, flags, modes): a reason names them when they change.
_PYTHON_VALUES = (bool, int, float, complex, str)


def python_values(leaves: Sequence[Any]) -> tuple:
    """``(leaf index, value)`` of the Python scalars and strings among ``leaves``."""
    return tuple((i, x) for i, x in enumerate(leaves) if type(x) in _PYTHON_VALUES)


def _paths(treedef: Any) -> list:
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    return [p for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]


# --------------------------------------------------------------------------- structures
def explain(old: Structure, new: Structure) -> str:
    """Why ``new`` did not match ``old``: an input that changed, the Python branch that went the other
    way, the first operation that differs (by source line), or how many operations there are."""
    program = "forward" if new.kind == "forward" else "backward"
    parts = []
    changed_input = _changed_input(old.inputs, new.inputs)
    if changed_input:
        parts.append(changed_input)
    n = min(len(old.eqns), len(new.eqns))
    first = next((i for i in range(n) if old.eqns[i] != new.eqns[i]), None)
    if first is not None or len(old.eqns) != len(new.eqns):
        branch = _branch(old, new, n if first is None else first)
        if branch:
            parts.append(branch)
    if first is not None:
        parts.append(_eqn_change(program, first, old, new))
    elif len(old.eqns) != len(new.eqns):
        longer = new if len(new.eqns) > n else old
        what = "extra" if longer is new else "missing"
        parts.append(f"the {program} has {len(new.eqns)} operations, was {len(old.eqns)} (the first {what} "
                     f"one: {longer.eqns[n][0]}{_source(longer, n)})")
    if not parts and len(old.inputs) != len(new.inputs):
        what = "inputs (arguments, arrays it closes over, Python scalars)" if program == "forward" else "residuals"
        parts.append(f"the {program} uses {len(new.inputs)} {what}, was {len(old.inputs)}")
    if not parts and program == "forward" and old.key[3:] != new.key[3:]:  # (placement, configuration): tape.py
        parts.append("the arrays are on other devices" if old.key[3] != new.key[3] else _CONFIG_CHANGED)
    return "; ".join(parts) or f"the {program}'s outputs changed"


#: A step keyed by JAX's configuration (``trace_context``) compiles again when it changes, as ``jit``'s does.
_CONFIG_CHANGED = ("JAX's configuration changed (a setting that tracing or lowering reads, such as "
                   "jax_threefry_partitionable or jax_default_matmul_precision: jit compiles again too)")


def _changed_input(old: tuple, new: tuple) -> str | None:
    """The first input of the same kind whose type (or, for a Python scalar, value) changed. Inputs are
    numbered as they were met, so an input that moved because the forward took another path is no change."""
    strip = (lambda e: e[1:]) if (old and isinstance(old[0][0], int)) or (new and isinstance(new[0][0], int)) else (
        lambda e: e)
    for i, (a, b) in enumerate(zip(old, new)):
        if strip(a) == strip(b):
            continue
        if isinstance(a[0], int) and a[1] != b[1]:
            return None  # another kind of input here: the path changed, which the equations tell
        return _input_change(i, a, b)
    return None


def _input_change(i: int, a: tuple, b: tuple) -> str:
    """One input that differs. A tape input is ``(number, kind, aval key[, literal])``; a backward's an aval key."""
    if not (a and isinstance(a[0], int)):
        return f"residual {i}: {_aval_words(a, b)}"
    if a[1] == "lit" and b[1] == "lit":
        if a[3][0] == "a":  # a NumPy scalar or one-element array: keyed by its value, as JAX makes it a constant
            return (f"the NumPy value {_literal_text(a[3])} (dtype {np.dtype(a[3][1]).name}, shape {tuple(a[3][2])}) "
                    f"the forward uses is now {_literal_text(b[3])} (a NumPy scalar or one-element array, or a "
                    "Python number JAX made one, as jax.random.key(step) does, is keyed by its value: each value "
                    "compiles once; pass it as a JAX array, jnp.asarray(...), to keep one program)")
        return (f"the Python scalar {_literal_text(a[3])} the forward uses is now {_literal_text(b[3])} (each "
                "value compiles once: pass it as an array to keep one program)")
    what = {"diff": "a differentiated input", "arg": "an array the forward uses", "lit": "a Python scalar"}
    if a[1] != b[1]:
        return f"input {i} of the forward was {what.get(a[1], a[1])}, is now {what.get(b[1], b[1])}"
    if a[2] == b[2] and a[3:] != b[3:]:  # an array it closes over, moved: ("on", sharding) or none (tape.py)
        return f"{what.get(b[1], b[1])} (input {i} of the forward) is on other devices"
    return f"{what.get(b[1], b[1])} (input {i} of the forward): {_aval_words(a[2], b[2])}"


def _aval_words(a: tuple, b: tuple) -> str:
    parts = []
    if a[0] != b[0]:
        parts.append(f"shape {tuple(a[0])} → {tuple(b[0])}")
    if a[1] != b[1]:
        parts.append(f"dtype {np.dtype(a[1]).name} → {np.dtype(b[1]).name}")
    if a[2] != b[2]:
        parts.append("weakly typed (a Python number's type) → strongly typed" if a[2] else "strongly typed → weakly typed (a Python number's type)")
    return ", ".join(parts) or "changed"


def _branch(old: Structure, new: Structure, at: int) -> str | None:
    """The Python decision before operation ``at`` that went the other way, from the looks both recordings
    share up to there: the last condition (a bool) that changed, else the last integer, else the last value."""
    pairs = []
    for a, b in zip(old.looks, new.looks):
        if a.after > at or b.after > at:
            break
        src = C.recorded_source(b.source_info)
        if C.recorded_source(a.source_info) != src:
            break
        va, vb = _scalar(a.value), _scalar(b.value)
        if va is not None and vb is not None and va != vb:
            pairs.append((src, va, vb))
    for kind in ("bool", "int", "number"):
        picked = [p for p in pairs if _kind(p[1]) == _kind(p[2]) == kind]
        if not picked:
            continue
        src, va, vb = picked[-1]
        where = f" at {src}" if src else ""
        if kind == "bool":
            return f"Python branch{where} took the other side (the condition was {va}, now {vb})"
        if kind == "int":
            return f"Python read {va} → {vb}{where}, and the forward took another path from there"
        return f"the forward took another path after Python read a value{where} ({va:.6g} → {vb:.6g})"
    return None


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "number"


def _scalar(value: Any) -> Any:
    """A looked-at scalar as a Python bool, int or float (None when not one)."""
    if value is None:
        return None
    try:
        return np.asarray(value).item()
    except Exception:  # noqa: BLE001 - a reason is best effort
        return None


def _eqn_change(program: str, i: int, old: Structure, new: Structure) -> str:
    a, b = old.eqns[i], new.eqns[i]
    where, was_at = _source(new, i), _source(old, i)
    if where != was_at:  # another line of code: the forward took another path
        return (f"the {program} took another path: operation {i} is now {_eqn_words(b, new)}{where}, "
                f"was {_eqn_words(a, old)}{was_at}")
    where = where or f" (operation {i})"
    if a[:3] == b[:3]:
        if consts_differ(a[3], b[3]):
            return (f"the {program} operation {b[0]}{where}: an array a function inside it closes over holds another "
                    "value (each value compiles once: pass the array to that function as an argument to keep one "
                    "program)")
        same_names = [p[0] for p in a[3]] == [p[0] for p in b[3]]
        names = [p[0] for p, q in zip(a[3], b[3]) if p[1:] != q[1:]] if same_names else []
        reads = [p[0] for p, q in zip(a[3], b[3]) if len(p) == 3 and p[:2] == q[:2] and p[2] != q[2]]
        if names and reads == names:  # a custom rule's closure or globals (tape._staged_params_key)
            return (f"the {program} operation {b[0]}{where}: what its rule{'s' if len(reads) > 1 else ''} "
                    f"{', '.join(reads)} read{'' if len(reads) > 1 else 's'} besides its arguments changed (the step "
                    "traces a rule when it compiles, as jit does: pass such a value as an argument to keep one "
                    "program; a list or dict a host callback of the rule writes to is read too: make it a "
                    "collections.deque, read by identity)")
        what = f"its parameter{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else "its parameters"
        return f"the {program} operation {b[0]}{where} changed {what}"
    was, now = _eqn_words(a, old), _eqn_words(b, new)
    if was == now:
        return f"the {program} operation {b[0]}{where} takes its inputs from other values"
    return f"the {program} operation{where} changed: {was} → {now}"


def _eqn_words(eqn_key: tuple, structure: Structure) -> str:
    """``jit of f32[8,16], f32[16,16] giving f32[8,16]``."""
    prim, ins, outs, _ = eqn_key

    def in_text(r: Any) -> str:
        if isinstance(r, tuple):
            val = r[2][0] if isinstance(r[2], tuple) else r[2]
            return f"{val!r}:{_aval_text(r[1])}"
        return _aval_text(_var_aval(r, structure))

    return f"{prim} of {', '.join(in_text(r) for r in ins) or 'nothing'} giving {', '.join(map(_aval_text, outs))}"


@dataclasses.dataclass(frozen=True)
class _Aval:
    shape: tuple
    dtype: Any


def _aval_text(key: tuple) -> str:
    shape, dtype, weak = key
    return format_aval(_Aval(shape, dtype)) + ("{weak}" if weak else "")


def _var_aval(ref: int, structure: Structure) -> tuple:
    if structure.vid_avals is not None:
        return structure.vid_avals[ref] if ref < len(structure.vid_avals) else ((), "?", False)
    inputs = structure.inputs
    if ref < len(inputs):
        return inputs[ref]
    n = len(inputs)
    for _, _, outs, _ in structure.eqns:  # refs count only the kept outputs; DropVars are rare in backward programs
        if ref < n + len(outs):
            return outs[ref - n]
        n += len(outs)
    return ((), "?", False)


def _literal_text(lit: tuple) -> str:
    kind, *value = lit
    if kind == "f":
        return repr(float.fromhex(value[0]))
    if kind == "c":
        return repr(complex(float.fromhex(value[0]), float.fromhex(value[1])))
    if kind == "a":
        return repr(np.frombuffer(value[2], dtype=value[0]).reshape(value[1]).item())
    return repr(value[0])


def _source(structure: Structure, index: int) -> str:
    try:
        eqn = C.jaxpr_of(structure.jaxpr).eqns[index]
    except (AttributeError, IndexError):
        return ""
    src = C.recorded_source(eqn.source_info) if structure.kind == "forward" else C.eqn_source(eqn)
    return "" if not src or src == "<unknown>" else f" at {src}"
