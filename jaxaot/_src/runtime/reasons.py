"""Why a call compiled, in plain words: the argument by pytree path, what changed, old → new.

A reason names what the user wrote: the argument by parameter name and pytree path
and the change (``params['w2']: shape (4, 8) → (5, 8)``), against the nearest
compiled signature (:func:`nearest`), so alternating shapes read as the leaf that
differs. The runtime, compiled autograd and artifacts all describe inputs through
:func:`inputs_change` and log at INFO (:func:`log_compile`). Nothing here raises.

Example:
    >>> import jax, jax.numpy as jnp
    >>> old = [("x", jax.ShapeDtypeStruct((4, 8), jnp.float32))]
    >>> inputs_change(old, [("x", jax.ShapeDtypeStruct((5, 8), jnp.bfloat16))])
    'x: shape (4, 8) → (5, 8), dtype float32 → bfloat16'
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxaot._src import compat as C
from jaxaot._src.pytrees import dtype_name, format_aval, leaf_paths
from jaxaot._src.runtime.arguments import StaticArg, safe_repr
from jaxaot._src.runtime.signature import Signature, key_parts, sharding_text

logger = logging.getLogger("jaxaot")

FIRST_CALL = "first call"


def log_compile(what: str, signature: str, reason: str) -> None:
    """Log one compile of ``what`` (a function's name) and its reason at INFO on the ``jaxaot`` logger."""
    logger.info("%s: compiling for %s: %s", what, signature or "no inputs", reason)


# --------------------------------------------------------------------------- argument names
class ArgNames:
    """The names of a function's positional arguments: its parameter names, ``args[2]`` past them
    for a ``*args`` parameter, ``arg[i]`` where the function cannot be inspected.

    Example:
        >>> names = ArgNames.of(lambda params, x, *rest: None)
        >>> names(0), names(1), names(3)
        ('params', 'x', 'rest[1]')
    """

    def __init__(self, names: Sequence[str] = (), var: str | None = None):
        self.names, self.var = tuple(names), var

    @classmethod
    def of(cls, fn: Callable) -> "ArgNames":
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # builtins, some C callables
            return cls()
        names: list[str] = []
        for p in params:
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind is p.VAR_POSITIONAL:
                return cls(names, p.name)
        return cls(names)

    def __call__(self, i: int) -> str:
        if i < len(self.names):
            return self.names[i]
        if self.var is not None:
            return f"{self.var}[{i - len(self.names)}]"
        return f"arg[{i}]"

    def path(self, i: int, rest: tuple) -> str:
        """A leaf of positional argument ``i`` at pytree path ``rest`` (``params['w']``)."""
        return self(i) + jax.tree_util.keystr(rest)


def signature_paths(treedef: Any, num_static: int, static_argnums: Sequence[int], names: ArgNames) -> list[str]:
    """Each leaf of a ``(dynamic args, kwargs)`` treedef as the user wrote it: ``params['w2']``, ``scale``.

    Dynamic argument ``k`` is the positional argument at the ``k``-th position that is not static.
    """
    dummy = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    n_dyn = len(dummy[0]) if isinstance(dummy, tuple) and dummy and isinstance(dummy[0], tuple) else 0
    positions = [i for i in range(num_static + n_dyn) if i not in static_argnums]
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]:
        head = getattr(path[0], "idx", None) if path else None
        if head == 0 and len(path) > 1:
            k = path[1].idx
            out.append(names.path(positions[k] if k < len(positions) else k, tuple(path[2:])))
        elif head == 1 and len(path) > 1:
            out.append(str(getattr(path[1], "key", path[1])) + jax.tree_util.keystr(tuple(path[2:])))
        else:
            out.append("input" + jax.tree_util.keystr(tuple(path)))
    return out


# --------------------------------------------------------------------------- leaf changes
def aval_change(a: Any, b: Any) -> str:
    """What differs between two avals (shape, dtype, weak type), in words; ``""`` when nothing does."""
    parts = []
    if tuple(a.shape) != tuple(b.shape):
        parts.append(f"shape {tuple(a.shape)} → {tuple(b.shape)}")
    if a.dtype != b.dtype:
        parts.append(f"dtype {dtype_name(a.dtype)} → {dtype_name(b.dtype)}")
    weak_a, weak_b = bool(getattr(a, "weak_type", False)), bool(getattr(b, "weak_type", False))
    if weak_a != weak_b:
        parts.append("weakly typed (a Python number's type) → strongly typed" if weak_a else "strongly typed → weakly typed (a Python number's type)")
    return ", ".join(parts)


def inputs_change(old: Sequence[tuple[str, Any]], new: Sequence[tuple[str, Any]],
                  shardings: tuple[Sequence[Any], Sequence[Any]] | None = None) -> str:
    """What changed between two calls' inputs, each ``[(path, aval), ...]``: changed leaves by path,
    new arguments and leaves, leaves no longer passed; ``""`` when they agree.

    ``shardings``: optionally, each call's leaf shardings (None: the default device), compared too.
    """
    old_at = {p: (a, None if shardings is None else shardings[0][i]) for i, (p, a) in enumerate(old)}
    new_paths = {p for p, _ in new}
    old_args = {_argument(p) for p in old_at}
    out = []
    for i, (path, b) in enumerate(new):
        if path not in old_at:
            arg = _argument(path)
            out.append(f"new argument {arg}" if arg not in old_args else f"{path} is new ({format_aval(b)})")
            old_args.add(arg)  # one line per new argument
            continue
        a, sa = old_at[path]
        text = aval_change(a, b)
        sb = None if shardings is None else shardings[1][i]
        if not text and sa != sb:
            text = sharding_change(sa, sb)
        if text:
            out.append(f"{path}: {text}")
    gone = [p for p in old_at if p not in new_paths]
    out += [f"{p} is no longer passed" for p in gone]
    return "; ".join(dict.fromkeys(out))


def sharding_change(a: Any, b: Any) -> str:
    """Two shardings' difference in words: their specs where those differ, else their meshes' axis sizes or device
    order (the same spec on another mesh), else the whole shardings."""
    text_a, text_b = sharding_text(a), sharding_text(b)
    mesh_a, mesh_b = getattr(a, "mesh", None), getattr(b, "mesh", None)
    if text_a == text_b and mesh_a is not None and mesh_b is not None and mesh_a != mesh_b:
        shape_a, shape_b = dict(mesh_a.shape), dict(mesh_b.shape)
        if shape_a != shape_b:
            return f"sharding {text_a} on mesh {shape_a} → {shape_b}"
        ids = lambda m: [d.id for d in m.devices.flat]  # noqa: E731
        if ids(mesh_a) != ids(mesh_b):
            return f"sharding {text_a} on mesh devices {ids(mesh_a)} → {ids(mesh_b)}"
    if text_a == text_b:
        text_a, text_b = str(a), str(b)
    return f"sharding {text_a} → {text_b}"


def _argument(path: str) -> str:
    """The top-level argument of a path: ``params`` of ``params['w2']``."""
    cut = min((i for i in (path.find("["), path.find(".")) if i > 0), default=len(path))
    return path[:cut]


# --------------------------------------------------------------------------- signatures
def _differences(old: Signature, new: Signature, paths: Callable[[Signature], list[str]]) -> int:
    """How far ``old`` is from ``new``: leaves changed, added or gone (by path where the structures
    differ), plus 100 for other static values or another JAX configuration and 1000 for another mesh."""
    d = (0 if old.mesh == new.mesh else 1000) + _static_distance(old.static, new.static)
    d += 0 if old.config == new.config else 100 * max(1, len(C.config_changes(old.config or (), new.config or ())))
    if old.treedef == new.treedef:
        return d + sum(ka != kb for ka, kb in zip(old.leaves, new.leaves))
    a, b = dict(zip(paths(old), old.leaves)), dict(zip(paths(new), new.leaves))
    return d + 1 + sum(a.get(p) != b.get(p) for p in a.keys() | b.keys())


def nearest(compiled: Sequence[Signature], new: Signature, paths: Callable[[Signature], list[str]],
            look_back: int = 32) -> Signature | None:
    """The compiled signature nearest to ``new`` among the latest ``look_back`` (the latest on ties);
    ``paths`` names a signature's leaves (:func:`signature_paths`)."""
    best, best_d = None, None
    for sig in reversed(compiled[-look_back:]):
        d = _differences(sig, new, paths)
        if best_d is None or d < best_d:
            best, best_d = sig, d
    return best


def describe_change(old: Signature | None, new: Signature, paths: Callable[[Signature], list[str]],
                    names: ArgNames | None = None) -> str:
    """Why ``new`` needs its own programs, against the compiled signature ``old`` (None: the first call).

    ``paths(sig)`` names a signature's leaves (:func:`signature_paths`); ``names`` the positional
    arguments, for static ones. Only a reason text: it never raises, whatever the static values'
    ``__eq__`` or ``__repr__`` do.
    """
    if old is None:
        return FIRST_CALL
    names = names or ArgNames()
    parts = []
    static = _static_change(old.static, new.static, names)
    if static:
        parts.append(static)
    if old.mesh != new.mesh:
        shown = [str(old.mesh), str(new.mesh)]
        if shown[0] == shown[1]:  # one shape on other devices
            shown = [f"{m} on devices {np.ravel(getattr(m, 'device_ids', ())).tolist()}" for m in (old.mesh, new.mesh)]
        parts.append(f"mesh context changed: {shown[0]} → {shown[1]}")
    if old.config is not None and new.config is not None and old.config != new.config:
        changed = [n for n in C.config_changes(old.config, new.config) if "mesh" not in n]
        if changed:
            parts.append(f"JAX configuration changed: {', '.join(changed)}")
    old_paths, new_paths = paths(old), paths(new)
    olds = [(p, key_parts(k)) for p, k in zip(old_paths, old.leaves)]
    news = [(p, key_parts(k)) for p, k in zip(new_paths, new.leaves)]
    leaves = inputs_change([(p, a) for p, (a, _) in olds], [(p, a) for p, (a, _) in news],
                           ([s for _, (_, s) in olds], [s for _, (_, s) in news]))
    if leaves:
        parts.append(leaves)
    elif old.treedef != new.treedef:
        parts.append(_structure_change(old, new, old_paths, new_paths))
    return "; ".join(parts) or "new signature"


def _structure_change(old: Signature, new: Signature, old_paths: list[str], new_paths: list[str]) -> str:
    """Same leaves by name, another structure: an argument passed by keyword instead of by position
    (or the reverse), else the two structures."""
    was = {p: raw.startswith("kwarg") for p, raw in zip(old_paths, leaf_paths(old.treedef, "input"))}
    now = {p: raw.startswith("kwarg") for p, raw in zip(new_paths, leaf_paths(new.treedef, "input"))}
    moved = {_argument(p): kw for p, kw in now.items() if p in was and was[p] != kw}
    if moved:
        return "; ".join(f"{a} is now passed by {'keyword' if kw else 'position'}" for a, kw in moved.items())
    return f"pytree structure of the inputs changed: {old.treedef} → {new.treedef}"


def _static_distance(old: tuple, new: tuple) -> int:
    """100 per static value that differs, 50 per one passed the other way (by keyword, by position) alone."""
    if not _static_differs(old, new):
        return 0
    if len(old) != len(new):
        return 100 * max(len(old), len(new))
    def one(a: Any, b: Any) -> int:
        if not _static_differs((a,), (b,)):
            return 0
        moved = isinstance(a, StaticArg) and isinstance(b, StaticArg) and not _static_differs((a.value,), (b.value,))
        return 50 if moved else 100

    return sum(one(a, b) for a, b in zip(old, new))


def _static_differs(old: tuple, new: tuple) -> bool:
    try:
        return bool(old != new)
    except Exception:  # an __eq__ that raises: the values count as different
        return True


def _static_change(old: tuple, new: tuple, names: ArgNames) -> str | None:
    """Why two calls' static arguments differ (one clause per argument), or None when they are equal."""
    if len(old) != len(new):
        return f"static arguments changed: {static_text(old)} → {static_text(new)}"
    out = []
    for a, b in zip(old, new):
        if not (isinstance(a, StaticArg) and isinstance(b, StaticArg)):
            if _static_differs((a,), (b,)):
                out.append(f"static argument: {safe_repr(a, 80)} → {safe_repr(b, 80)}")
            continue
        name = names(b.index)
        if a.keyword != b.keyword and not _static_differs((a.value,), (b.value,)):
            how = lambda s: "by keyword" if s.keyword is not None else "by position"  # noqa: E731
            out.append(f"static argument `{name}` is now passed {how(b)} (was {how(a)}); keyed apart, as jax.jit "
                       "keys them")
        elif a.value is b.value and hash(a) != hash(b):
            out.append(f"static argument `{name}` was mutated since an earlier call (its hash changed)")
        elif _static_differs((a,), (b,)):
            out.append(_described(a.value, b.value) or
                       "static argument `{}`: {} → {}".format(name, *_where_reprs_differ(a.value, b.value)))
    return "; ".join(out) or None


def _where_reprs_differ(old: Any, new: Any, limit: int = 80) -> tuple[str, str]:
    """The two values' reprs (whitespace runs as one space), each cut to ``limit`` characters around where they first
    differ: a large value (a model's static half, a config) shows what changed, not a prefix both share."""
    a, b = (" ".join(safe_repr(v, 1 << 16).split()) for v in (old, new))
    if len(a) <= limit and len(b) <= limit:
        return a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, at - limit // 4)
    return tuple(("..." if start else "") + t[start:start + limit] + ("..." if start + limit < len(t) else "")
                 for t in (a, b))


def _described(old: Any, new: Any) -> str | None:
    """``new.change_from(old)``, where the static value describes its own changes (a module call's statics:
    which attribute changed), else None."""
    change_from = getattr(type(new), "change_from", None)
    if change_from is None:
        return None
    try:
        return change_from(new, old)
    except Exception:  # only a reason's text: never raised
        return None


def static_text(static: tuple) -> str:
    """Static values as a tuple's text, each through :func:`~jaxaot._src.runtime.arguments.safe_repr`."""
    return repr(tuple(s if isinstance(s, StaticArg) else safe_repr(s) for s in static))


__all__ = ["ArgNames", "FIRST_CALL", "aval_change", "describe_change", "inputs_change", "log_compile", "nearest",
           "signature_paths", "static_text"]
